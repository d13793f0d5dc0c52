"""`vit-einops bench` with hostile options and outputs: a one-line error at entry, before anything is measured.

Each CLI case runs in a subprocess under a timeout (the bound: `--min-run-time inf` used to never return), and
asserts the exit status 2, the exact error line, no traceback, nothing measured (empty stdout) and files left as
they were. The Python API (BenchOptions) refuses the same values with ValueError/TypeError naming them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from vit_einops import cli
from vit_einops.bench.run import BenchOptions, check_out, result_files, with_overrides

TIMEOUT_S = 120  # startup (importing torch) takes seconds on a loaded 2-core machine; a hang takes forever


def bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vit_einops", "bench", "--smoke", *argv],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip


def assert_refused(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.rstrip("\n").splitlines()[-1] == f"vit-einops bench: error: {message}"
    assert result.stdout == ""  # no header: nothing was measured


OPTION_CASES = {
    "--min-run-time inf": (
        "argument --min-run-time: min_run_time inf is out of range: expected a finite number from 0.0001 to 60"
    ),
    "--min-run-time nan": (
        "argument --min-run-time: min_run_time nan is out of range: expected a finite number from 0.0001 to 60"
    ),
    "--min-run-time -1": (
        "argument --min-run-time: min_run_time -1.0 is out of range: expected a finite number from 0.0001 to 60"
    ),
    "--min-run-time 0": (
        "argument --min-run-time: min_run_time 0.0 is out of range: expected a finite number from 0.0001 to 60"
    ),
    "--min-run-time 1e9": (
        "argument --min-run-time: min_run_time 1000000000.0 is out of range: expected a finite number from 0.0001 to 60"
    ),
    "--min-run-time soon": "argument --min-run-time: expected a number, got 'soon'",
    "--rounds 0": "argument --rounds: rounds 0 is out of range: expected an integer from 1 to 1000",
    "--rounds 2.5": "argument --rounds: expected an integer, got '2.5'",
    "--retries -1": "argument --retries: retries -1 is out of range: expected an integer from 0 to 10",
    "--batches 1,0": "argument --batches: batches 0 is out of range: expected an integer from 1 to 4096",
    "--tokens 50,99999": "argument --tokens: tokens 99999 is out of range: expected an integer from 1 to 16384",
    "--heads nan": "argument --heads: expected an integer, got 'nan'",
    "--model-batch inf": "argument --model-batch: expected an integer, got 'inf'",
    "--threads 0": f"argument --threads: threads 0 is out of range: expected 1 to {os.cpu_count()} (this machine's CPUs)",
}


# The values that used to hang or run forever go through a real process under a timeout; the rest of the table
# is checked in-process (same parser, same message), which keeps this file fast.
SUBPROCESS_CASES = [argv for argv in OPTION_CASES if argv.startswith("--min-run-time")]


@pytest.mark.parametrize("argv", SUBPROCESS_CASES)
def test_bad_min_run_time_fails_at_entry_without_hanging(argv):
    assert_refused(bench(*argv.split()), OPTION_CASES[argv])


@pytest.mark.parametrize("argv", [argv for argv in OPTION_CASES if argv not in SUBPROCESS_CASES])
def test_bad_numeric_options_fail_at_entry(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--smoke", *argv.split()])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.rstrip("\n").splitlines()[-1] == f"vit-einops bench: error: {OPTION_CASES[argv]}"


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_out_pointing_at_a_file_fails_before_measuring(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes\n")
    before = digest(target)
    assert_refused(
        bench("--out", str(target)),
        f"output {target} exists and is not a directory; pass --out a directory (new or existing)",
    )
    assert digest(target) == before


def test_out_under_a_file_fails_before_measuring(tmp_path):
    (tmp_path / "f").write_text("x")
    assert_refused(
        bench("--out", str(tmp_path / "f" / "results")),
        f"output {tmp_path / 'f' / 'results'} cannot be created: {tmp_path / 'f'} is not a directory",
    )


def test_earlier_results_are_kept_unless_forced(tmp_path):
    """A directory holding a run's files is refused without --force; with it, only the run's own file names are
    replaced and the user's other files stay byte for byte."""
    (tmp_path / "results.json").write_text('{"mine": 1}\n')
    (tmp_path / "README.md").write_text("my own file\n")
    before = {p.name: digest(p) for p in tmp_path.iterdir()}
    assert_refused(
        bench("--out", str(tmp_path)),
        f"output {tmp_path} already holds results.json from an earlier run; pass --force to replace them, "
        "or choose another --out",
    )
    assert {p.name: digest(p) for p in tmp_path.iterdir()} == before
    forced = bench("--out", str(tmp_path), "--force", "--skip-model", "--skip-layer")
    assert forced.returncode == 0, forced.stderr
    assert digest(tmp_path / "README.md") == before["README.md"]
    assert digest(tmp_path / "results.json") != before["results.json"]
    assert {p.name for p in tmp_path.iterdir()} <= set(result_files()) | {"README.md"}


def test_a_directory_named_like_a_result_file_is_refused_even_with_force(tmp_path):
    (tmp_path / "table.txt").mkdir()
    with pytest.raises(ValueError, match=r"holds table.txt that is not a regular file"):
        check_out(tmp_path, force=True)


@pytest.mark.parametrize(
    "overrides, error, words",
    [
        (dict(min_run_time=float("inf")), ValueError, "min_run_time inf is out of range"),
        (dict(min_run_time=float("nan")), ValueError, "min_run_time nan is out of range"),
        (dict(rounds=0), ValueError, "rounds 0 is out of range"),
        (dict(rounds=True), TypeError, "rounds must be an integer, got True"),
        (dict(tokens=(50, 2.5)), TypeError, "tokens must be an integer, got 2.5"),
        (dict(batches=()), ValueError, "batches is empty"),
        (dict(retries=-1), ValueError, "retries -1 is out of range"),
        (dict(modes=("sideways",)), ValueError, "modes: unknown sideways"),
        (dict(dtype="float16"), ValueError, "dtype 'float16' is not float32 or bfloat16"),
    ],
)
def test_bench_options_refuse_bad_values(overrides, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        with_overrides("smoke", **overrides)
    with pytest.raises(error):
        BenchOptions(**overrides)
