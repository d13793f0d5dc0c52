"""`vit-einops bench --smoke`: the table, the JSON/CSV schema of benchmarks/README.md, the plot files.

No assertion here is about time: the smoke grid's numbers mean nothing, only that every one is produced, finite
and positive (an IQR may be 0: one block per path), and that the measuring helpers measure what they say.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os

import pytest
import torch

from vit_einops.commands import cli
from vit_einops.bench import plots, report
from vit_einops.bench.attention import Point
from vit_einops.bench.measure import peak_memory_bytes, time_interleaved
from vit_einops.bench.model import OPTIMIZER, counted_flops, make_optimizer
from vit_einops.bench.names import COMPILED_PATHS, MODEL_MODES, MODES, core_paths, layer_paths, model_paths
from vit_einops.bench.noise import IQR_THRESHOLD, CpuUse, machine_verdict
from vit_einops.presets import create_architecture

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Fields that may legitimately be 0 or empty: an IQR of one block, the einsum path's difference from itself,
# the compile time of paths that are not compiled.
MAY_BE_ZERO = {"iqr_s", "max_abs_diff_vs_einsum", "iqr_ratio", "load_start", "load_end", "others_cores"}
MAY_BE_NONE = {"first_call_s", "others_cores"}
HAS_PROC_STAT = os.access("/proc/stat", os.R_OK)  # Linux: the busy verdict and others_cores come from CPU time


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run, in-process, on one thread: the tiny shapes' hundreds of small ops each wait for a second
    thread that a busy 2-core machine has descheduled (2 to 3 times the wall time of one thread). Its --out is named
    with ESC, which the "wrote" line prints escaped."""
    out = tmp_path_factory.mktemp("bench") / "out\x1b[2J"
    stdout = io.StringIO()
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(["bench", "--smoke", "--threads", "1", "--out", str(out)])
    assert torch.get_num_threads() == threads  # the run restores torch's thread count
    return dict(code=code, out=out, stdout=stdout.getvalue(), results=json.loads((out / "results.json").read_text()))


def check_numbers(row: dict, fields) -> None:
    for field in fields:
        value = row[field]
        if field in MAY_BE_NONE and value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert math.isfinite(value), (field, row)
            assert value > 0 or (field in MAY_BE_ZERO and value == 0), (field, row)


def test_smoke_run_exits_cleanly_and_prints_the_table(smoke):
    assert smoke["code"] == 0
    text = smoke["stdout"]
    for words in ("torch 2", "threads", "CPU capability", "BLAS", "matmul ceiling", "torch.compile of the einsum path"):
        assert words in text
    # The model column is as wide as the longest name: "vit_ti_16+depth=1" and the mode never run together.
    assert "vit_ti_16+depth=1 inference" in text and "depth=1inference" not in text
    for mode in MODES:
        assert f"attention core, {mode} (ratios over sdpa)" in text
        assert f"attention layer, {mode} (ratios over torch_mha)" in text
    assert (
        "whole model, batch 2 (time x: over the same weights in torch's nn.TransformerEncoderLayer; train_step: "
        "forward, cross-entropy, backward, one SGD(momentum=0.9) step)" in " ".join(text.split())
    )
    table = (smoke["out"] / "table.txt").read_text()
    # table.txt is the header as results.json has it at the end, the verdict, then the body exactly as printed
    # after the progress bar (the header printed before the bar carries the start ceiling and load instead).
    results = smoke["results"]
    verdict = results["verdict"]
    assert verdict.startswith("Verdict: at N 17 (batch 2, 2 heads of 8), against SDPA's time: einsum takes ")
    header = report.header_text(results["meta"], results["matmul_ceiling"], results["noise"])
    overhead = report.overhead_text(results["overhead"])  # the per-call overhead's line follows the verdict
    assert table.startswith(header + "\n\n" + verdict + "\n\n" + overhead + "\n\n")
    body = table.removeprefix(header + "\n\n" + verdict + "\n\n" + overhead + "\n\n")
    assert body.startswith("torch.compile of the einsum path") and "whole model" in body
    # Every line fits 120 columns; the kernels are in results.json.
    assert max(map(len, table.splitlines())) <= report.TABLE_WIDTH and "kernel" not in table
    printed, wrote = text.split("\nwrote ")
    assert f" plots) to\n  {smoke['out'].parent}/out\\x1b[2J/\n    " in wrote and "\x1b" not in text
    assert wrote.endswith("\nthreads: 1 (--threads)\n")
    assert max(map(len, text.splitlines())) <= report.TABLE_WIDTH  # all that is printed, the "wrote" lines too
    if results["noisy"]:  # the noise report and advice follow the tables (and head table.txt)
        warning = "\n" + report.noise_text(results["noise"]) + "\n"
        assert printed.endswith(warning) and table.startswith("NOISY RUN: ")
        printed = printed.removesuffix(warning)
    assert printed.endswith("\n" + body)
    # The verdict comes first: after the header and the line that announces it, before any table.
    start, after = printed.removesuffix("\n" + body).split("\n\n" + verdict + "\n")
    assert after.startswith("\n" + overhead + "\n")
    start_header, announced = start.split("\nMeasuring einsum, chunked, sdpa at N 17 first, for the verdict")
    # A noisy run said so once before its rows; a quiet one never did.
    assert (start + after).count("NOISY RUN (so far): ") == results["noisy"]
    assert start_header.startswith("vit-einops bench ") and start_header.count("vit-einops bench ") == 1
    assert start_header.count("matmul ceiling") == 1 and "torch.compile of the einsum path" not in start_header


def test_the_wrote_lines_fit_the_table_width_with_long_paths():
    """The bench's last lines once ran to 330 columns (every file name, the folder and the threads on one line):
    now the folder and the names are wrapped on their own lines, each line within 120 columns."""
    names = sorted(["table.txt", "results.json", "attention.csv", "model.csv", *plots.PLOTS])
    out = "/home/someone/" + "/".join(["a-rather-long-folder-name"] * 3) + "/bench-results"
    threads = "threads: 2, then 1 (followed the free cores; at the last check 1 of 2 cores busy with other processes; "
    threads += "--threads or VIT_EINOPS_THREADS fixes it)"
    text = report.wrote_text(names, out, 647.4, len(plots.PLOTS), threads)
    lines = text.splitlines()
    assert lines[:2] == [f"wrote {len(names)} files (wall 647 s, {len(plots.PLOTS)} plots) to", f"  {out}/"]
    assert max(map(len, lines)) <= report.TABLE_WIDTH < len(", ".join(names) + out + threads)
    listed = " ".join(line.strip() for line in lines[2:] if line.startswith("    "))
    assert listed.split(", ") == names  # every name whole, in order
    assert " ".join(line.strip() for line in lines if not line.startswith("    ") and line not in lines[:2]) == threads


def test_results_json_schema(smoke):
    results = smoke["results"]
    assert results["schema"] == report.SCHEMA_VERSION
    meta = results["meta"]
    for key in ("torch", "threads", "cpu_capability", "blas", "load_average", "dtype", "options", "wall_s"):
        assert key in meta
    assert meta["threads"] == 1 and meta["threads_source"] == "--threads"  # as the run measured under it
    assert f"threads 1 (of {meta['cpu_count']} CPUs; from --threads)" in smoke["stdout"]
    assert meta["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    # The per-call overhead: both times, their difference and the paired ratio (one round in smoke: no interval),
    # measured on outputs that agree.
    overhead = results["overhead"]
    check_numbers(overhead, ("model_s", "plain_s", "time_ratio"))
    assert overhead["rounds"] == 1 and overhead["time_ratio_low"] is None and overhead["max_abs_diff"] <= 1e-6
    assert overhead["overhead_s"] == overhead["model_s"] - overhead["plain_s"]
    check_numbers(results["matmul_ceiling"], ("size", "median_s", "gflop_per_s"))
    # The smoke grid does not compile, and says why.
    assert results["compile"]["attempted"] is False and "smoke" in results["compile"]["skip_reason"]

    rows = results["attention"]
    smoke_grid = meta["options"]
    expected = {
        (section, mode, path, b, n)
        for section, paths in (("core", core_paths()), ("layer", layer_paths()))
        for mode in MODES
        for path in paths
        for b in smoke_grid["batches"]
        for n in smoke_grid["tokens"]
    }
    # Every path at every point: timed, or refused with a reason (the compiled paths are skipped in smoke; the
    # CUDA-only SDPA backends on a CPU).
    refused = results["attention_unavailable"]
    measured = [(r["section"], r["mode"], r["path"], r["batch"], r["tokens"]) for r in rows + refused]
    assert sorted(measured) == sorted(expected)
    for r in refused:
        assert r["unavailable"] and "median_s" not in r and "kernel" not in r
        if r["path"] in COMPILED_PATHS:
            assert "smoke" in r["unavailable"]
    for r in rows:
        assert tuple(r) == report.ATTENTION_FIELDS or set(r) == set(report.ATTENTION_FIELDS)
        check_numbers(r, report.ATTENTION_FIELDS)
        check_noise_fields(r)
        point = Point(r["batch"], r["heads"], r["tokens"], r["head_dim"])
        assert r["attn_matrix_bytes"] == point.batch * point.heads * point.tokens**2 * 4
        assert r["gflop"] == pytest.approx(point.flops(r["section"], r["mode"]) / 1e9)
        if r["path"] in ("sdpa", "torch_mha"):
            assert r["time_ratio"] == 1.0 and r["mem_ratio"] == 1.0

    model_rows = results["model"]
    assert {(r["mode"], r["path"]) for r in model_rows} == {(m, p) for m in MODEL_MODES for p in model_paths()}
    for r in model_rows:
        assert set(r) == set(report.MODEL_FIELDS)
        check_numbers(r, report.MODEL_FIELDS)
        check_noise_fields(r)
        assert r["images_per_s"] == pytest.approx(r["batch"] / r["median_s"])
        assert r["optimizer"] == ("SGD(momentum=0.9)" if r["mode"] == "train_step" else None)
        # Every path computes the same function as the einsum path (float32 rounding apart).
        assert r["max_abs_diff_vs_einsum"] < 1e-4
    # A training step allocates a gradient for every weight: each path's peak counts them, not only the first's.
    options = meta["options"]
    (preset,) = options["models"]
    weights = create_architecture(preset, image_size=options["image_size"], **options["model_overrides"]).parameters()
    gradient_bytes = sum(p.numel() * p.element_size() for p in weights)
    train = [r for r in model_rows if r["mode"] == "train_step"]
    assert len(train) == len(model_paths()) and all(r["peak_bytes"] >= gradient_bytes for r in train), [
        (r["path"], r["peak_bytes"], gradient_bytes) for r in train
    ]
    # The run's flag: noisy exactly when a row is, or the run's own check of the machine said busy.
    noise = results["noise"]
    assert results["noisy"] is meta["noisy"] is noise["noisy"]
    assert noise["rows"] == len(rows) + len(model_rows)
    assert noise["rows_noisy"] == sum(r["noisy"] for r in rows + model_rows)
    load = (meta["load_average"][0], meta["load_average_end"][0])
    # Where /proc/stat can be read, the CPU time of the two ceiling measurements decides; elsewhere the load.
    cpu = None
    if HAS_PROC_STAT:
        assert meta["busy_measure"] == "cpu_time" and len(meta["cpu_windows"]) == 2
        start, end = (CpuUse(**w) for w in meta["cpu_windows"])
        assert [meta["others_cores"], meta["others_cores_end"]] == [round(w.others_cores, 2) for w in (start, end)]
        cpu = start + end
    else:
        assert meta["busy_measure"] == "load_average" and meta["cpu_windows"] is None
    busy = machine_verdict(load, meta["threads"], running_s=(0.0, meta["wall_s"]), cpu=cpu).noisy
    if HAS_PROC_STAT:  # busy in the start window alone makes the run noisy too: it said so before its rows
        busy = busy or machine_verdict(load, meta["threads"], cpu=start).noisy
    assert noise["noisy"] == (busy or noise["rows_noisy"] > 0)
    assert (noise["advice"] is not None) == noise["noisy"]


def check_noise_fields(r: dict) -> None:
    """Quartiles around the median, IQR = p75 - p25, and a row flagged exactly when it gives a reason."""
    assert r["p25_s"] <= r["median_s"] <= r["p75_s"]
    assert r["iqr_s"] == pytest.approx(r["p75_s"] - r["p25_s"])
    assert r["iqr_ratio"] == pytest.approx(r["iqr_s"] / r["median_s"])
    assert isinstance(r["noisy"], bool) and r["noisy"] == bool(r["noise"])
    assert ("IQR/median" in r["noise"]) == (r["iqr_ratio"] > IQR_THRESHOLD)
    assert r["attempts"] == 1  # the smoke grid does not retry
    if HAS_PROC_STAT:
        assert isinstance(r["others_cores"], float) and r["others_cores"] >= 0
    else:
        assert r["others_cores"] is None
    kinds = [kind for kind, words in (("load", "other processes"), ("IQR", "IQR/median")) if words in r["noise"]]
    assert report.noise_mark(r) == ("!" + ",".join(kinds) if r["noisy"] else "")


def test_model_flops_are_the_counts_on_a_real_model(smoke):
    """The model rows count FLOPs on a meta-device model: the same numbers as on real weights and images."""
    options = smoke["results"]["meta"]["options"]
    (preset,) = options["models"]
    size = options["image_size"]
    model = create_architecture(preset, image_size=size, attn_impl="einsum", **options["model_overrides"])
    flops = counted_flops(model, torch.rand(1, 3, size, size))
    for r in smoke["results"]["model"]:
        assert r["gflop"] == flops[r["mode"]] * r["batch"] / 1e9


@pytest.mark.parametrize(
    "name, fields, key",
    [("attention.csv", report.ATTENTION_FIELDS, "attention"), ("model.csv", report.MODEL_FIELDS, "model")],
)
def test_csv_matches_json(smoke, name, fields, key):
    with open(smoke["out"] / name, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == fields
        rows = list(reader)
    expected = smoke["results"][key]
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        for field in fields:
            if want[field] is None:
                assert row[field] == ""
            elif isinstance(want[field], float) and not isinstance(want[field], bool):
                assert float(row[field]) == pytest.approx(want[field], rel=1e-12)
            else:
                assert row[field] == str(want[field])


@pytest.mark.parametrize("name", plots.PLOTS)
def test_plots_are_real_pngs(smoke, name):
    data = (smoke["out"] / name).read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000  # axes, lines and labels; an empty figure is a few kB


def test_no_temporary_files_left_behind(smoke):
    assert not [p.name for p in smoke["out"].iterdir() if p.name.startswith(".")]


def test_peak_memory_sees_allocations_and_frees():
    """4 MiB kept, or 1 MiB made and freed twice in a row: the peak is 4 MiB, or 1 MiB (not 2)."""
    mib = 2**20

    def keep():
        return torch.empty(mib, dtype=torch.float32)

    def twice():
        for _ in range(2):
            torch.empty(mib // 4, dtype=torch.float32).fill_(1.0)

    peaks = peak_memory_bytes({"keep": keep, "twice": twice})
    assert 4 * mib <= peaks["keep"] < 4 * mib + 64 * 1024
    assert mib <= peaks["twice"] < 2 * mib


def test_time_interleaved_merges_every_round():
    timings = time_interleaved(
        {"a": lambda: torch.ones(8).sum(), "b": lambda: torch.ones(8).mean()}, rounds=2, min_run_time=0.001
    )
    for t in timings.values():
        assert t.blocks >= 2 and math.isfinite(t.median_s) and t.median_s > 0 and t.iqr_s >= 0
        assert 0 < t.min_s <= t.p25_s <= t.median_s <= t.p75_s  # the fastest block is the smallest time


def test_bf16_is_refused_without_hardware(monkeypatch, capsys):
    monkeypatch.setattr("vit_einops.bench.env.cpu_flags", lambda: {"avx2"})
    assert cli.main(["bench", "--smoke", "--dtype", "bfloat16"]) == 2
    assert "not running bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["--batches", "0"], ["--batches", "a,b"], ["--paths", "flash"], ["--threads", "-1"], ["--models", "vit_x"]]
)
def test_bad_options_are_rejected_by_name(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--smoke", *argv])
    assert exit_info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_figures_are_returned_with_error_bars_and_measured_ticks(smoke):
    """plots.figures draws without writing or showing: Figure objects, every panel's x ticks exactly the measured
    N, and error bars (p25 to p75) on the time and ratio figures; the matplotlib backend is left as it was."""
    import matplotlib
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    backend = matplotlib.get_backend()
    results = smoke["results"]
    figs = plots.figures(results["attention"], results["model"])
    assert list(figs) == list(plots.PLOTS)
    assert all(isinstance(f, Figure) for f in figs.values())
    tokens = sorted({r["tokens"] for r in results["attention"]})
    for name in ("attention_time.png", "attention_memory.png", "attention_ratio.png"):
        for ax in figs[name].axes:
            assert list(ax.get_xticks()) == tokens
            assert ax.xaxis.get_major_formatter().format_ticks(tokens) == [str(n) for n in tokens]
            assert ax.xaxis.get_minor_locator()() == []  # no unlabelled 10^k ticks in between
            bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.has_yerr]
            timed = {r["path"] for r in results["attention"] if r["section"] == "core"}
            assert len(bars) == (0 if name == "attention_memory.png" else len(timed))
        # One y label for the whole figure, none per panel (they overlapped between rows).
        assert figs[name].get_supylabel() and not any(ax.get_ylabel() for ax in figs[name].axes)
    assert matplotlib.get_backend() == backend


def test_train_step_optimizer_is_what_the_rows_say():
    """The train_step rows say SGD(momentum=0.9): one momentum buffer per weight (AdamW would keep two states)."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = make_optimizer([weight])
    weight.grad = torch.full((3,), 2.0)
    optimizer.step()
    assert OPTIMIZER == "SGD(momentum=0.9)"
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["momentum"] == 0.9
    assert list(optimizer.state[weight]) == ["momentum_buffer"]
    assert torch.equal(optimizer.state[weight]["momentum_buffer"], weight.grad)  # the first step's buffer is the grad
