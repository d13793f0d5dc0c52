"""Tests neither read nor write the folder pytest is started from (conftest's _own_working_directory)."""

import hashlib
from pathlib import Path

from _tiny import TINY_DIGITS, model_flags

from vit_einops.commands.cli import main

pytest_plugins = ["pytester"]


def tree(root: Path) -> dict[str, str]:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_a_test_starts_in_an_empty_folder_of_its_own(request):
    assert Path.cwd() != request.config.invocation_params.dir
    assert list(Path.cwd().iterdir()) == []


def test_a_default_output_lands_in_the_tests_own_folder(capsys):
    """`vit-einops train` without --out writes runs/digits under the working directory."""
    flags = [*model_flags(dict(TINY_DIGITS, depth=1)), "--no-progress"]
    assert main(["train", "--limit", "20", "--epochs", "1", *flags]) == 0, capsys.readouterr().err
    assert (Path.cwd() / "runs" / "digits" / "model.safetensors").is_file()


def test_outputs_left_where_pytest_starts_change_no_outcome(pytester, monkeypatch, tmp_path_factory):
    """The README's first command leaves ./bench-results (and a training run ./runs/digits) where pytest is then
    started: the test above still writes its default output, into a folder of its own, and the starting folder's
    files stay as they were."""
    start = pytester.path
    # pytester points HOME at the starting folder; matplotlib, imported first here in a fresh xdist worker, would
    # put its font cache under that HOME. That cache is the harness's, not a test's output.
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("matplotlib")))
    for name in ("bench-results/results.json", "runs/digits/checkpoint/checkpoint.json", "runs/digits/notes.txt"):
        (start / name).parent.mkdir(parents=True, exist_ok=True)
        (start / name).write_text("an earlier run's file\n")
    before = tree(start)
    # -n 0: the inner run is one test, and pyproject's addopts would otherwise start xdist workers for it (two more
    # processes importing torch: 15 s of the suite).
    result = pytester.runpytest_inprocess(
        f"{__file__}::test_a_default_output_lands_in_the_tests_own_folder", "-p", "no:cacheprovider", "-q", "-n", "0"
    )
    result.assert_outcomes(passed=1)
    assert tree(start) == before
