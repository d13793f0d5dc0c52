"""The benchmark scripts in benchmarks/ run in CI in a smoke mode, so they cannot rot unseen.

benchmarks/chunked.py on tiny shapes and one short round: every grid point gets a row with finite ratios to SDPA
(medians and fastest blocks), the floor's parts and the forward rows' loop. benchmarks/equivalence.py --smoke (every
row of the full table, on tiny shapes): every row within its dtype's tolerance. Both keep an existing output file
unless --force. benchmarks/contention.py on tiny shapes, quiet and beside one busy process: a row with its paired
ratios per condition and shape, and no busy process left running. benchmarks/compare.py on two hand-made
runs: the change of each ratio, and how many stayed within 25%.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from vit_einops import ATTN_IMPLS

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "chunked.py"
CONTENTION = SCRIPT.with_name("contention.py")
TINY = [
    "--batches",
    "2",
    "--tokens",
    "9",
    "--heads",
    "3",
    "--head-dim",
    "4",
    "--rounds",
    "1",
    "--min-run-time",
    "0.001",
]


def load_script(script: Path = SCRIPT):
    spec = importlib.util.spec_from_file_location(f"{script.stem}_benchmark", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_chunked_benchmark_smoke_writes_every_row(tmp_path, capsys, restore_threads):
    out = tmp_path / "chunked.json"
    assert load_script().main([*TINY, "--threads", "1", "--budgets", "30", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["batch"], r["tokens"]) for r in rows] == [("forward", 2, 9), ("forward_backward", 2, 9)]
    for r in rows:
        for key in ("chunked_ratio", "chunked_min_ratio", "chunked@30_ratio", "floor_ratio", "floor_min_ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert set(r["floor_parts_ms"]) >= {"qk", "softmax", "av"}
    assert math.isfinite(rows[0]["loop_ratio"]) and "loop_ratio" not in rows[1]  # the loop is forward only
    assert {"dv", "dp", "ds", "dq", "dk", "delta"} <= set(rows[1]["floor_parts_ms"])
    assert capsys.readouterr().out.count(" forward") == 2


def test_chunked_benchmark_keeps_an_existing_out_file_unless_forced(tmp_path, capsys, restore_threads):
    out = tmp_path / "chunked.json"
    out.write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        load_script().main([*TINY, "--threads", "1", "--modes", "forward", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "mine\n"
    assert load_script().main([*TINY, "--threads", "1", "--modes", "forward", "--out", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["rows"][0]["mode"] == "forward"


def test_contention_benchmark_smoke_pairs_every_path_and_stops_its_busy_processes(tmp_path, capsys):
    script = load_script(CONTENTION)
    started = []
    start_busy = script.start_busy
    script.start_busy = lambda count, limit: started.extend(start_busy(count, limit)) or started[-count:]
    out = tmp_path / "contention.json"
    argv = ["--batches", "2", "--tokens", "9", "--heads", "3", "--head-dim", "4", "--busy", "0,1", "--cycles", "2"]
    argv += ["--rounds", "2", "--window", "0.001", "--busy-limit", "30", "--in-turn", "--out", str(out)]
    assert script.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["busy"], r["batch"], r["tokens"]) for r in rows] == [(0, 2, 9), (1, 2, 9)]
    for r in rows:
        assert len(r["loads"]) == 2  # one (before, after) pair per cycle
        for path in ("chunked", "chunked-in-turn"):
            ratio = r[path]
            assert len(ratio["rounds"]) == 4 and ratio["min"] <= ratio["low"] <= ratio["ratio"] <= ratio["high"]
            assert ratio["high"] <= ratio["max"] and all(math.isfinite(x) and x > 0 for x in ratio["rounds"])
    assert len(started) == 2 and all(p.poll() is not None for p in started)  # one per cycle, each ended
    assert capsys.readouterr().out.count("chunked-in-turn") == 2


def test_equivalence_benchmark_rows_are_within_their_tolerances(tmp_path, capsys):
    """benchmarks/equivalence.py's table in its smoke mode (attention, block, a whole ViT and patch embedding against
    torch's modules, every impl, on tiny shapes): every float64 row within 1e-9 relative, every float32 row within
    1e-4 relative; the JSON kept unless --force. The full shapes are a benchmark command (benchmarks/README.md)."""
    spec = importlib.util.spec_from_file_location("equivalence_benchmark", SCRIPT.parent / "equivalence.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "equivalence.json"
    module.main(["--smoke", "--json", str(out)])
    records = json.loads(out.read_text())
    assert {r["dtype"] for r in records} == {"torch.float64", "torch.float32"}
    # Every impl in each of the four kinds of row, in both dtypes.
    for kind in ("MultiHeadAttention", "TransformerEncoderBlock", "ViT/8"):
        for impl in ATTN_IMPLS:
            assert sum(f"{kind}[{impl}]" in r["name"] for r in records) == (4 if kind == "MultiHeadAttention" else 2)
    assert sum(r["name"].startswith("PatchEmbedding linear vs conv") for r in records) == 2
    for r in records:
        bound = 1e-9 if r["dtype"] == "torch.float64" else 1e-4
        for key in ("output", "grad_x", "grad_weight"):
            if r[key] is not None:
                assert r[key][1] <= bound, (r["name"], r["dtype"], key, r[key])
    before = out.read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--smoke", "--json", str(out)])
    assert exit_info.value.code == 2 and "already exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == before


def test_compare_counts_the_ratios_that_stayed_within_the_bound(tmp_path, capsys):
    """benchmarks/compare.py on two hand-made runs: the reference rows (ratio 1 on [1, 1]) and a row timed in one run
    only are left out; chunked moved 1.20 -> 1.32 (+10%), einsum 2.00 -> 3.00 (+50%): 1 of 2 within 25%."""
    spec = importlib.util.spec_from_file_location("compare_benchmark", SCRIPT.parent / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(name, ratios, threads, others):
        point = dict(section="core", mode="forward", batch=1, heads=12, tokens=197, head_dim=64)
        rows = [dict(point, path="sdpa", time_ratio=1.0, time_ratio_low=1.0, time_ratio_high=1.0)]
        rows += [dict(point, path=p, time_ratio=r, time_ratio_low=r - 0.1, time_ratio_high=r + 0.1) for p, r in ratios]
        meta = dict(threads=threads, others_cores=others, others_cores_end=others, wall_s=100.0)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(dict(meta=meta, attention=rows, model=[])))
        return str(path)

    quiet = run("quiet", [("chunked", 1.2), ("einsum", 2.0)], 2, 0.01)
    busy = run("busy", [("chunked", 1.32), ("einsum", 3.0), ("chunked_only_here", 9.0)], 1, 1.0)
    assert module.main([quiet, busy]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-4:] == ["1.20", "->", "1.32", "+10.0%"]
    assert out[1].split()[-4:] == ["2.00", "->", "3.00", "+50.0%"]
    assert f"{busy}: 1 threads, others 1.00, 1.00 cores (start, end), wall 100 s" in out
    assert out[-1] == (
        "1 of 2 ratios within 25% of the first run's; the most moved: attention core forward einsum 1 12 197 64 "
        "2.00 -> 3.00 (+50.0%)"
    )
