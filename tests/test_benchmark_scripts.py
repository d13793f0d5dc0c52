"""The benchmark scripts in benchmarks/ run in CI in a smoke mode, so they cannot rot unseen.

benchmarks/chunked.py on tiny shapes and one short round: every grid point gets a row with finite ratios to SDPA
(medians and fastest blocks), the floor's parts and the forward rows' loop. benchmarks/equivalence.py --smoke (every
row of the full table, on tiny shapes): every row within its dtype's tolerance. Both keep an existing output file
unless --force. benchmarks/contention.py on tiny shapes, quiet and beside one busy process: a row with its paired
ratios per condition and shape, and no busy process left running. benchmarks/compare.py on two hand-made
runs: the change of each ratio, and how many stayed within 25%. benchmarks/command_threads.py --smoke with its runs
faked: the table's rows and ratios from known times, its busy process ended (also when a run fails), its command
lines taken by each command's parser.

Hostile inputs (tests/test_hostile_*.py's style): compare.py on files that are not a bench run's results, and
contention.py on bad options, a missing output folder and SIGTERM; each with its exit status and its error line.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _fork import fork
from _hostile import bounded

from vit_einops import ATTN_IMPLS
from vit_einops.commands import cli

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
    script.start_busy = lambda count, limit: started.extend(start_busy(count, limit)) or started[len(started) - count :]
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


def compare_script():
    return load_script(SCRIPT.with_name("compare.py"))


def results_of(ratios: dict[str, object]) -> dict:
    """A bench run's results as compare.py reads them: the reference row, then a row per path with its ratio."""
    point = dict(section="core", mode="forward", batch=1, heads=12, tokens=197, head_dim=64)
    rows = [dict(point, path="sdpa", time_ratio=1.0, time_ratio_low=1.0, time_ratio_high=1.0)]
    rows += [dict(point, path=p, time_ratio=r, time_ratio_low=None, time_ratio_high=None) for p, r in ratios.items()]
    meta = dict(threads=1, others_cores=0.0, others_cores_end=None, wall_s=10.0)
    return dict(meta=meta, attention=rows, model=[])


QUIET = results_of({"chunked": 1.0, "einsum": 1.0})
# name -> (the file's text, what the error line says after "compare.py: error: NAME.json")
BAD_RESULTS = {
    "list": ("[]", ": the file holds a list; expected a bench run's results (a JSON object)"),
    "null": ("null", ": the file holds null; expected a bench run's results (a JSON object)"),
    "number": ("1.5", ": the file holds a number (1.5); expected a bench run's results (a JSON object)"),
    "string": ('"fast"', ": the file holds a string ('fast'); expected a bench run's results (a JSON object)"),
    "attention_object": (json.dumps(dict(QUIET, attention={})), ": attention is an object; expected a list of rows"),
    "model_missing": (
        json.dumps({k: v for k, v in QUIET.items() if k != "model"}), ": model is missing; expected a list of rows"
    ),
    "meta_list": (json.dumps(dict(QUIET, meta=[])), ": meta is a list; expected an object"),
    "threads_bool": (
        json.dumps(dict(QUIET, meta=dict(QUIET["meta"], threads=True))),
        ": meta.threads is true (a boolean); expected a positive int",
    ),
    "wall_nan": (
        json.dumps(dict(QUIET, meta=dict(QUIET["meta"], wall_s=float("nan")))),
        ": meta.wall_s is NaN; expected a finite number >= 0",
    ),
    "row_list": (json.dumps(dict(QUIET, model=[[]])), ": model[0] is a list; expected a row (a JSON object)"),
    "tokens_string": (
        json.dumps(dict(QUIET, attention=[dict(QUIET["attention"][1], tokens="197")])),
        ": attention[0].tokens is a string ('197'); expected a positive int",
    ),
    "ratio_zero": (
        json.dumps(results_of({"chunked": 0, "einsum": 1.0})),
        ": attention[1].time_ratio is 0; expected a time ratio: a finite number from 1e-06 to 1e+06, or null",
    ),
    "ratio_negative": (
        json.dumps(results_of({"chunked": -2.0, "einsum": 1.0})),
        ": attention[1].time_ratio is -2.0; expected a time ratio: a finite number from 1e-06 to 1e+06, or null",
    ),
    "ratio_string": (
        json.dumps(results_of({"chunked": "fast", "einsum": 1.0})),
        ": attention[1].time_ratio is a string ('fast'); expected a time ratio: a finite number from 1e-06 to "
        "1e+06, or null",
    ),
    "ratio_tiny": (
        json.dumps(results_of({"chunked": 5e-324, "einsum": 1.0})),
        ": attention[1].time_ratio is 5e-324; expected a time ratio: a finite number from 1e-06 to 1e+06, or null",
    ),
    # NaN beside a row that moved +300%: refused, never ranked as the row that moved most
    "ratio_nan": (
        json.dumps(results_of({"chunked": float("nan"), "einsum": 4.0})),
        ": attention[1].time_ratio is NaN; expected a time ratio: a finite number from 1e-06 to 1e+06, or null",
    ),
    "ratio_infinity": (
        json.dumps(results_of({"chunked": float("inf"), "einsum": 1.0})),
        ": attention[1].time_ratio is Infinity; expected a time ratio: a finite number from 1e-06 to 1e+06, or null",
    ),
    "low_nan": (
        json.dumps(dict(QUIET, attention=[dict(QUIET["attention"][1], time_ratio_low=float("nan"))])),
        ": attention[0].time_ratio_low is NaN; expected a time ratio: a finite number from 1e-06 to 1e+06, or null",
    ),
    "nested": ("[" * 100_000 + "]" * 100_000, " nests JSON 100000 levels deep, over the 32 this reader accepts"),
    "not_json": (
        "{",
        " is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ),
}


def compare_refuses(capsys, *argv) -> str:
    """compare.py's error line for ``argv`` after "PROG: error: " (argparse names PROG after sys.argv[0]), once
    checked that it exits with status 2 and prints no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        compare_script().main([str(a) for a in argv])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    prog, error, message = captured.err.rstrip("\n").splitlines()[-1].partition(": error: ")
    assert error, captured.err
    return message


@pytest.mark.parametrize("case", BAD_RESULTS)
def test_compare_refuses_what_is_not_a_bench_runs_results_naming_the_file(case, tmp_path, capsys):
    text, words = BAD_RESULTS[case]
    quiet, bad = tmp_path / "quiet.json", tmp_path / f"{case}.json"
    quiet.write_text(json.dumps(QUIET))
    bad.write_text(text)
    assert compare_refuses(capsys, quiet, bad) == f"{bad}{words}"
    assert compare_refuses(capsys, bad, quiet) == f"{bad}{words}"  # either side


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_compare_refuses_a_fifo_or_directory_without_reading_it(kind, tmp_path, capsys):
    """A FIFO is refused from its stat, never opened (an open would wait for a writer forever); bounded, so that a
    regression fails here instead of hanging the suite."""
    quiet, path = tmp_path / "quiet.json", tmp_path / "results.json"
    quiet.write_text(json.dumps(QUIET))
    {"fifo": os.mkfifo, "directory": os.mkdir, "missing": lambda p: None}[kind](path)
    with bounded(30):
        line = compare_refuses(capsys, quiet, path)
    expected = {"fifo": "a FIFO; expected a", "directory": "a directory; expected a", "missing": "no such"}[kind]
    assert line == f"{path}: {expected} bench results file"


def test_compare_escapes_the_names_it_prints(tmp_path, capsys):
    """Path names are data from the file: an ESC in one is printed escaped, never sent to the terminal."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(results_of({"chunked\x1b[2J": 1.0})))
    second.write_text(json.dumps(results_of({"chunked\x1b[2J": 2.0})))
    assert compare_script().main([str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "chunked\\x1b[2J" in out


CONTENTION_TINY = ["--batches", "2", "--tokens", "9", "--heads", "3", "--head-dim", "4", "--window", "0.001"]
# argv -> the error line after "PROG: error: ": the option, the value and the range it is refused for
CONTENTION_OPTIONS = {
    "--window nan": "argument --window: window must be a finite float in [0.0001, 60], got nan",  # hung for ever
    "--window inf": "argument --window: window must be a finite float in [0.0001, 60], got inf",
    "--window 0": "argument --window: window must be a finite float in [0.0001, 60], got 0.0",
    "--busy-limit nan": "argument --busy-limit: busy_limit must be a finite float in [1, 86400], got nan",
    "--busy-limit 0.5": "argument --busy-limit: busy_limit must be a finite float in [1, 86400], got 0.5",
    "--rounds 0": "argument --rounds: rounds must be an int in [1, 1000], got 0",  # was an IndexError at the end
    "--cycles 0": "argument --cycles: cycles must be an int in [1, 1000], got 0",
    "--busy -1": "argument --busy: busy must be an int in [0, 256], got -1",
    "--busy ,": "argument --busy: expected a comma-separated list, got ','",
    "--batches 1,0": "argument --batches: batches must be an int in [1, 4096], got 0",
    "--tokens 2.5": "argument --tokens: expected an integer, got '2.5'",
    "--heads 0": "argument --heads: heads must be an int in [1, 1024], got 0",
    "--head-dim nan": "argument --head-dim: expected an integer, got 'nan'",
    "--head-dim 0": "argument --head-dim: head_dim must be an int in [1, 4096], got 0",
}


def contention_refuses(capsys, argv: list[str], script=None) -> str:
    """contention.py's error line for ``argv`` after "PROG: error: ", once checked that it exits with status 2
    before measuring anything (nothing on stdout) and prints no traceback; bounded, as a bad value used to hang."""
    with bounded(30), pytest.raises(SystemExit) as exit_info:
        (script or load_script(CONTENTION)).main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    prog, error, message = captured.err.rstrip("\n").splitlines()[-1].partition(": error: ")
    assert error, captured.err
    return message


@pytest.mark.parametrize("argv", CONTENTION_OPTIONS)
def test_contention_refuses_bad_options_by_name_before_measuring(argv, capsys):
    assert contention_refuses(capsys, [*CONTENTION_TINY, *argv.split()]) == CONTENTION_OPTIONS[argv]


@pytest.mark.parametrize("kind", ["missing folder", "existing file", "fifo", "directory"])
def test_contention_checks_its_output_before_measuring(kind, tmp_path, capsys):
    """--out in a folder that does not exist, over a file without --force, or at a FIFO or directory even with
    --force: refused before the first measurement, with what is there left as it was."""
    out = tmp_path / ("missing" if kind == "missing folder" else "") / "contention.json"
    {"existing file": lambda: out.write_text("mine\n"), "fifo": lambda: os.mkfifo(out), "directory": out.mkdir}.get(
        kind, lambda: None
    )()
    argv = [*CONTENTION_TINY, "--busy", "0", "--out", str(out), *(["--force"] if kind in ("fifo", "directory") else [])]
    expected = {
        "missing folder": f"the directory {out.parent} does not exist",
        "existing file": f"{out} already exists; pass --force to replace it",
        "fifo": f"{out} is a FIFO, not a regular file; it is never replaced, even with --force",
        "directory": f"{out} is a directory, not a regular file; it is never replaced, even with --force",
    }[kind]
    assert contention_refuses(capsys, argv) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if kind == "missing folder" else ["contention.json"])
    assert kind != "existing file" or out.read_text() == "mine\n"


def test_contention_refuses_a_condition_whose_busy_process_ended_early(tmp_path, capsys):
    """A busy process that is gone before its condition ends (a --busy-limit shorter than the condition) would label
    an idle measurement "busy 1": the run is refused, saying so, and nothing is written."""
    script = load_script(CONTENTION)

    def ended(count, limit):
        processes = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(count)]
        for process in processes:
            process.wait()
        return processes

    script.start_busy = ended
    out = tmp_path / "contention.json"
    line = contention_refuses(capsys, [*CONTENTION_TINY, "--busy", "1", "--rounds", "1", "--out", str(out)], script)
    assert re.fullmatch(
        r"1 of 1 busy processes ended before their condition did \(after [0-9.]+ s; --busy-limit 600 s\): raise "
        r"--busy-limit past the time one condition takes",
        line,
    ), line
    assert list(tmp_path.iterdir()) == []


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the busy process's state from /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_contention_busy_processes_end_with_the_script(signum):
    """contention.py (in a forked child: it shares this process's imports) beside one busy process, measuring for
    minutes, gets SIGTERM: it stops its busy process and exits with 143, saying so; or SIGKILL, which no handler
    sees: the busy process notices its parent is gone and ends by itself. Each wait is bounded: a busy process that
    outlives its script fails the test within seconds, instead of spinning for its 600 s limit."""
    script = load_script(CONTENTION)
    read, write = os.pipe()
    start_busy = script.start_busy

    def reporting(count, limit):
        processes = start_busy(count, limit)
        os.write(write, "".join(f"{p.pid}\n" for p in processes).encode())
        return processes

    script.start_busy = reporting
    argv = [*CONTENTION_TINY, "--busy", "1", "--cycles", "1000", "--rounds", "1000"]
    child = fork(lambda: os._exit(script.main(argv)))
    os.close(write)
    try:
        assert select.select([read], [], [], 60)[0], "no busy process started within 60 s"
        busy = int(os.read(read, 64).split()[0])
        os.kill(child, signum)
        deadline = time.monotonic() + 30
        while (waited := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waited[0] == child, "contention.py still running 30 s after the signal"
        assert os.waitstatus_to_exitcode(waited[1]) == (143 if signum == signal.SIGTERM else -signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(busy) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(busy), f"the busy process outlived contention.py by 10 s ({signal.Signals(signum).name})"
    finally:
        os.close(read)
        for pid in (child, locals().get("busy")):
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)


COMMAND_THREADS = SCRIPT.with_name("command_threads.py")
# Fake seconds of each run beside the busy process, per thread setting ("default": the policy's); quiet runs take 2 s.
BUSY_SECONDS = {"default": 3.0, "1": 2.5, "2": 6.0}


def fake_command_runs(script, calls: list[list[str]]) -> None:
    """command_threads.py's runs replaced: no command runs; each returns BUSY_SECONDS (train's default 4 s) or 2 s
    quiet, and the summary line of a policy that used 1 thread beside the busy process and 2 when quiet."""

    def run(argv, timeout):
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        label = (out.parent if out.suffix == ".html" else out).name  # command-condition-setting-repeat, or setup
        if label == "setup":
            return 0.1, ""
        command, condition, setting, _ = label.split("-")
        assert command == argv[0] and ("--threads" in argv) == (setting != "default")
        if condition == "quiet":
            return 2.0, "...; threads: 2 (all 2 cores free; --threads or VIT_EINOPS_THREADS fixes it)\n"
        seconds = 4.0 if (command, setting) == ("train", "default") else BUSY_SECONDS[setting]
        used = "1" if setting == "default" else setting
        return seconds, f"wrote x/; threads: {used} (why)\n"

    script.run_in_process = run


def command_threads_script() -> tuple[object, list[subprocess.Popen], list[list[str]]]:
    """command_threads.py loaded, its runs faked (fake_command_runs), and the lists its busy processes and its runs'
    command lines go into."""
    script = load_script(COMMAND_THREADS)
    started: list[subprocess.Popen] = []
    start_busy = script.start_busy
    script.start_busy = lambda count, limit: started.extend(start_busy(count, limit)) or started[-count:]
    calls: list[list[str]] = []
    fake_command_runs(script, calls)
    return script, started, calls


def test_command_threads_smoke_table_from_fake_runs(tmp_path, capsys):
    """benchmarks/command_threads.py --smoke, its runs faked (the times of fake_command_runs): a row per command with
    the quiet time, the busy default's, the fastest fixed count beside the busy process and its time, and the two
    ratios with their goals (train's default 4 s over 2.5 s is 1.60, over the 1.25 goal); the quiet default once and
    each setting once beside the busy process, which was started for that condition and ended; every line within 120
    columns; the JSON keeps every run and row."""
    script, started, calls = command_threads_script()
    counts = min(2, os.cpu_count())
    out = tmp_path / "threads.json"
    assert script.main(["--smoke", "--max-threads", str(counts), "--out", str(out)]) == 0
    assert len(started) == 1 and started[0].poll() is not None  # one busy process, ended
    assert len(calls) == 1 + 4 * (2 + counts)  # the setup, then per command: quiet default, busy default and counts
    printed = capsys.readouterr().out
    assert max(map(len, printed.splitlines())) <= 120
    table = printed[printed.index("\ncommand ") + 1 :].splitlines()
    assert table[0].split()[:6] == ["command", "quiet", "s", "busy", "s", "used"]
    expected = {command: ["2.00", "3.00", "1", "1", "2.50", "1.20", "ok", "1.50", "ok"] for command in script.COMMANDS}
    expected["train"] = ["2.00", "4.00", "1", "1", "2.50", "1.60", "OVER", "2.00", "ok"]
    assert {line.split()[0]: line.split()[1:] for line in table[1:5]} == expected
    record = json.loads(out.read_text())
    assert [r["command"] for r in record["rows"]] == list(script.COMMANDS)
    train = record["rows"][-1]
    assert train["fixed_busy_s"] == {str(c): BUSY_SECONDS[str(c)] for c in range(1, counts + 1)}
    assert (train["default_over_best"], train["busy_over_quiet"], train["meets_default_goal"]) == (1.6, 2.0, False)
    assert record["meta"]["cpu_model"] and len(record["meta"]["load_average"]) == 3
    assert len(record["runs"]) == len(calls) - 1 and {r["threads_used"] for r in record["runs"]} == {"1", "2"}


@pytest.mark.parametrize("size", ["full", "smoke"])
def test_command_threads_command_lines_are_the_commands_own(size, tmp_path):
    """Each timed run's command line, at either size and with --threads, is one the command's parser takes."""
    script = load_script(COMMAND_THREADS)
    for command in script.COMMANDS:
        argv = script.command_argv(command, tmp_path, tmp_path / "out", script.SIZES[size]) + ["--threads", "1"]
        args = cli.build_parser(command).parse_args(argv)
        assert args.command == command and args.threads == 1


# argv -> command_threads.py's error line after "PROG: error: "
COMMAND_THREADS_OPTIONS = {
    "--commands pizza": "argument --commands: expected some of faithfulness,inspect,explore,train, each once, got "
    "'pizza'",
    "--commands train,train": "argument --commands: expected some of faithfulness,inspect,explore,train, each once, "
    "got 'train,train'",
    "--repeats 0": "argument --repeats: repeats must be an int in [1, 100], got 0",
    "--timeout nan": "argument --timeout: timeout must be a finite float in [1, 86400], got nan",
    "--busy-limit 0.5": "argument --busy-limit: busy_limit must be a finite float in [1, 86400], got 0.5",
}


@pytest.mark.parametrize("argv", [*COMMAND_THREADS_OPTIONS, "--max-threads"])
def test_command_threads_refuses_bad_options_by_name_before_running(argv, capsys):
    """Refused before any run (the runs faked: none may be called), more fixed threads than the CPUs too."""
    script, _, calls = command_threads_script()
    if argv == "--max-threads":
        cpus = os.cpu_count()
        argv, expected = f"--max-threads {cpus + 1}", f"max_threads must be an int in [1, {cpus}], got {cpus + 1}"
        expected = f"argument --max-threads: {expected}"
    else:
        expected = COMMAND_THREADS_OPTIONS[argv]
    assert contention_refuses(capsys, ["--smoke", *argv.split()], script) == expected
    assert calls == []


def test_command_threads_keeps_an_existing_out_file_unless_forced(tmp_path, capsys):
    script, _, calls = command_threads_script()
    out = tmp_path / "threads.json"
    out.write_text("mine\n")
    assert contention_refuses(capsys, ["--smoke", "--out", str(out)], script) == (
        f"{out} already exists; pass --force to replace it"
    )
    assert out.read_text() == "mine\n" and calls == []


def test_command_threads_stops_its_busy_process_when_a_run_fails(capsys):
    """A run that fails beside the busy process (a command exiting with status 2) ends the script with that command's
    error line, and the busy process is stopped on the way out."""
    script, started, calls = command_threads_script()
    succeed = script.run_in_process

    def fail_beside_the_busy_process(argv, timeout):
        if started:
            raise RuntimeError(f"{argv[0]} exited with status 2: vit-einops {argv[0]}: error: no such file")
        return succeed(argv, timeout)

    script.run_in_process = fail_beside_the_busy_process
    line = contention_refuses(capsys, ["--smoke", "--max-threads", "1"], script)
    assert line == "faithfulness exited with status 2: vit-einops faithfulness: error: no such file"
    assert len(started) == 1 and started[0].poll() is not None
