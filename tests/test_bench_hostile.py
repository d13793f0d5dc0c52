"""`vit-einops bench` with hostile options and outputs: a one-line error at entry, before anything is measured.

Each case asserts the exit status 2, the error line (the option or field and the offending value), no traceback,
nothing measured (empty stdout) and files left as they were. The values that used to hang (`--min-run-time inf`
never returned) run in a subprocess under a timeout, the bound being the point; the rest run the command's main
in-process (the same parser and messages, without seconds of importing torch each). The Python API
(BenchOptions) refuses the same values with ValueError/TypeError naming them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import subprocess
import sys

import pytest

from vit_einops.bench import plots, report
from vit_einops.commands import cli
from vit_einops.bench.runner import BenchOptions, check_out, with_overrides

TIMEOUT_S = 120  # startup (importing torch) takes seconds on a loaded 2-core machine; a hang takes forever


def bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vit_einops", "bench", "--smoke", *argv],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip


def bench_in_process(capsys, *argv: str) -> tuple[int, str, str]:
    """`vit-einops bench --smoke ARGV` through the command's main: (exit status, stdout, stderr)."""
    code = cli.main(["bench", "--smoke", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused(result: tuple[int, str, str], message: str) -> None:
    code, out, err = result
    assert code == 2, err
    assert "Traceback" not in err
    assert err.rstrip("\n").splitlines()[-1] == f"vit-einops bench: error: {message}"
    assert out == ""  # no header: nothing was measured


# argv -> a pattern for the error line after "vit-einops bench: error: ": the option, the field and the offending
# value (the wording itself is _checks.py's).
OPTION_CASES = {
    "--min-run-time inf": r"argument --min-run-time: min_run_time must be .*, got inf",
    "--min-run-time nan": r"argument --min-run-time: min_run_time must be .*, got nan",
    "--min-run-time -1": r"argument --min-run-time: min_run_time must be .*, got -1.0",
    "--min-run-time 0": r"argument --min-run-time: min_run_time must be .*, got 0.0",
    "--min-run-time 1e9": r"argument --min-run-time: min_run_time must be .*, got 1000000000.0",
    "--min-run-time soon": r"argument --min-run-time: expected a number, got 'soon'",
    "--rounds 0": r"argument --rounds: rounds must be .*, got 0",
    "--rounds 2.5": r"argument --rounds: expected an integer, got '2.5'",
    "--retries -1": r"argument --retries: retries must be .*, got -1",
    "--batches 1,0": r"argument --batches: batches must be .*, got 0",
    "--tokens 50,99999": r"argument --tokens: tokens must be .*, got 99999",
    "--heads nan": r"argument --heads: expected an integer, got 'nan'",
    "--model-batch inf": r"argument --model-batch: expected an integer, got 'inf'",
    "--threads 0": rf"argument --threads: threads 0 is out of range: expected 1 to {os.cpu_count()} .*",
}


SUBPROCESS_CASES = [argv for argv in OPTION_CASES if argv.startswith("--min-run-time")]


@pytest.mark.parametrize("argv", SUBPROCESS_CASES)
def test_bad_min_run_time_fails_at_entry_without_hanging(argv):
    result = bench(*argv.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == "", result.stderr
    assert re.fullmatch(f"vit-einops bench: error: {OPTION_CASES[argv]}", result.stderr.rstrip("\n").splitlines()[-1])


@pytest.mark.parametrize("argv", [argv for argv in OPTION_CASES if argv not in SUBPROCESS_CASES])
def test_bad_numeric_options_fail_at_entry(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--smoke", *argv.split()])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert re.fullmatch(f"vit-einops bench: error: {OPTION_CASES[argv]}", captured.err.rstrip("\n").splitlines()[-1])


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_out_pointing_at_a_file_fails_before_measuring(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("my notes\n")
    before = digest(target)
    assert_refused(
        bench_in_process(capsys, "--out", str(target)),
        f"{target} exists and is a file, not a directory",
    )
    assert digest(target) == before


def test_out_under_a_file_fails_before_measuring(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert_refused(
        bench_in_process(capsys, "--out", str(tmp_path / "f" / "results")),
        f"output {tmp_path / 'f' / 'results'} cannot be created: {tmp_path / 'f'} is not a directory",
    )


def test_earlier_results_are_kept_unless_forced(tmp_path, capsys):
    """A directory holding a run's files is refused without --force; with it, the folder is replaced whole: an old
    file the new run does not write (model.csv, under --skip-model) does not stay beside the new ones. The forced run
    measures one grid point, enough to write a run's files (the full set is test_bench.py's)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"mine": 1}\n')
    (out / "model.csv").write_text("model\n")
    before = tree(tmp_path)
    assert_refused(
        bench_in_process(capsys, "--out", str(out)), f"{out} already holds model.csv, results.json; pass --force to "
        "replace them",
    )  # fmt: skip
    assert tree(tmp_path) == before
    one_point = ["--threads", "1", "--batches", "1", "--tokens", "9", "--modes", "forward", "--skip-layer"]
    code, _, err = bench_in_process(capsys, "--out", str(out), "--force", "--skip-model", *one_point)
    assert code == 0, err
    assert digest(out / "results.json") != before["out/results.json"]
    assert {p.name for p in out.iterdir()} == {"table.txt", "results.json", "attention.csv", *plots.PLOTS[:3]}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging directory, no lock left beside it


def test_a_folder_holding_other_files_is_never_replaced(tmp_path, capsys):
    """The folder is replaced whole, so one holding a file the bench does not write (a user's notes) is refused,
    even with --force, before anything is measured."""
    (tmp_path / "results.json").write_text('{"mine": 1}\n')
    (tmp_path / "README.md").write_text("my own file\n")
    before = tree(tmp_path)
    assert_refused(
        bench_in_process(capsys, "--out", str(tmp_path), "--force"),
        f"{tmp_path} holds README.md, which vit-einops does not write there; it is never replaced, even with --force: "
        "choose another directory",
    )
    assert tree(tmp_path) == before


def test_a_directory_named_like_a_result_file_is_refused_even_with_force(tmp_path):
    (tmp_path / "table.txt").mkdir()
    with pytest.raises(ValueError, match=r"holds table\.txt, which vit-einops does not write there"):
        check_out(tmp_path, force=True)


@pytest.mark.parametrize("out", [".", "..", "/"])
def test_an_out_without_a_name_of_its_own_is_refused(out, capsys):
    assert_refused(
        bench_in_process(capsys, "--out", out),
        f"output {out} names no directory of its own; give --out a directory's name, e.g. results",
    )


def tree(root) -> dict[str, str]:
    """{path under ``root``: SHA-256 of a file, "dir", "fifo" or "link -> target"}, dot files included."""
    entries = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            entries[name] = f"link -> {os.readlink(path)}"
        elif path.is_dir():
            entries[name] = "dir"
        elif stat.S_ISFIFO(path.lstat().st_mode):
            entries[name] = "fifo"
        else:
            entries[name] = digest(path)
    return entries


NOTHING_MEASURED = ["--threads", "1", "--skip-attention", "--skip-model"]  # the ceilings only: table.txt, results.json


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("writer", ["json", "plots"])
def test_a_run_that_fails_part_way_leaves_the_earlier_folder_as_it_was(writer, tmp_path, capsys, monkeypatch):
    """A full disk at the second file (results.json, after table.txt) or at the plots (after every other file):
    with --force over an earlier run's folder, that folder keeps every file byte for byte and gets no new one; on a
    fresh --out, no folder is left. Nothing is left beside it either (no staging directory, no lock)."""
    module, name = {"json": (report, "write_json"), "plots": (plots, "save_figures")}[writer]
    monkeypatch.setattr(module, name, disk_full)
    message = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in ("table.txt", "results.json", "attention.csv", "model.csv", plots.PLOTS[0]):
        (earlier / name).write_text(f"the earlier run's {name}\n")
    before = tree(tmp_path)
    code, out, err = bench_in_process(capsys, "--out", str(earlier), "--force", *NOTHING_MEASURED)
    assert code == 2 and "Traceback" not in err and err.splitlines()[-1] == f"vit-einops bench: error: {message}"
    assert tree(tmp_path) == before
    code, out, err = bench_in_process(capsys, "--out", str(tmp_path / "fresh"), *NOTHING_MEASURED)
    assert code == 2 and err.splitlines()[-1] == f"vit-einops bench: error: {message}"
    assert tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["link", "fifo", "file"])
def test_an_out_that_changed_during_the_run_is_refused_at_the_commit(kind, tmp_path, capsys, monkeypatch):
    """--out checked at the start, then replaced while the run measures: by a link to another folder, a FIFO or a
    file. The commit refuses it, naming it; what is there, and the folder a link points to, stay as they were."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "results.json").write_text("the user's own\n")
    figures = plots.figures

    def figures_then_swap(*args):
        {"link": lambda: out.symlink_to(elsewhere), "fifo": lambda: os.mkfifo(out), "file": out.touch}[kind]()
        return figures(*args)

    monkeypatch.setattr(plots, "figures", figures_then_swap)
    code, _, err = bench_in_process(capsys, "--out", str(out), "--force", *NOTHING_MEASURED)
    expected = {
        "link": f"{out} is a symbolic link; give the directory itself",
        "fifo": f"{out} exists and is a FIFO, not a directory",
        "file": f"{out} exists and is a file, not a directory",
    }[kind]
    assert code == 2 and "Traceback" not in err and err.splitlines()[-1] == f"vit-einops bench: error: {expected}"
    after = {"link": f"link -> {elsewhere}", "fifo": "fifo", "file": digest(out) if kind == "file" else None}[kind]
    assert tree(tmp_path) == {"elsewhere": "dir", "elsewhere/results.json": digest(elsewhere / "results.json"),
                              "out": after}  # fmt: skip
    assert (elsewhere / "results.json").read_text() == "the user's own\n"


@pytest.mark.parametrize(
    "overrides, error, words",
    [
        (dict(min_run_time=float("inf")), ValueError, "min_run_time.*got inf"),
        (dict(min_run_time=float("nan")), ValueError, "min_run_time.*got nan"),
        (dict(ceiling_run_time=float("inf")), ValueError, "ceiling_run_time.*got inf"),
        (dict(rounds=0), ValueError, "rounds.*got 0"),
        (dict(rounds=True), TypeError, "rounds.*got True"),
        (dict(tokens=(50, 2.5)), TypeError, "tokens.*got 2.5"),
        (dict(batches=()), ValueError, "batches is empty"),
        (dict(retries=-1), ValueError, "retries.*got -1"),
        (dict(modes=("sideways",)), ValueError, "modes.*sideways"),
        (dict(dtype="float64"), ValueError, "dtype 'float64' is not one of float32, float16, bfloat16"),
        (dict(device="tpu"), ValueError, "unknown device 'tpu'"),
    ],
)
def test_bench_options_refuse_bad_values(overrides, error, words):
    with pytest.raises(error, match=words):
        with_overrides("smoke", **overrides)
    with pytest.raises(error):
        BenchOptions(**overrides)
