"""Hostile input and faults against training: every case asserts its exact outcome.

CLI cases call the command's main() in this process (one case runs `python -m vit_einops train` to show the same at the
process boundary) and check: exit status 2, stderr exactly one line `vit-einops train: error: ...` naming the field and
the bad value (no traceback: an exception would fail the test), and the files that were there before unchanged (SHA-256
of every file under the directory, before and after). Where the process boundary is the point (a lock held by another
process, kill -9 at a write point) a forked child plays the other process: it shares the imports, so costs no start-up.
"""

import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import zlib
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
import torch
from _fork import exit_code, fork
from _hostile import bounded
from _tiny import TINY_DIGITS, model_flags
from PIL import Image

from vit_einops import ViT
from vit_einops.commands.cli import main
from vit_einops.modelfile import load_vit
from vit_einops.train.checkpoint import CheckpointError, load_checkpoint
from vit_einops.train.config import TrainConfig
from vit_einops.train.data import ImageDataset, load_image, load_image_folder
from vit_einops.train.loop import TIMING_FIELDS, TrainingDivergedError, init_distributed, train
from vit_einops.train.rundir import LOCK_NAME, MANIFEST_NAME, RunDir

# Depth 1: the cheapest model that still writes every file of a run; dropout, so that resuming must restore its RNG.
TINY = dict(TINY_DIGITS, depth=1, mlp_dim=16, dropout=0.1)
TINY_FLAGS = [*model_flags(TINY), "--no-progress"]
TIMEOUT = 120  # seconds: a bound on every subprocess and child; a hang fails the test instead of blocking the suite


@pytest.fixture(autouse=True, scope="module")
def _unrendered_figures(training_figures_stub):
    """A run's curves.png and confusion.png are made but not rendered (three quarters of a tiny run's time): each is
    a stub of PNG bytes, written through the run's own atomic writes, so its files and write points are the real
    ones; no test here reads a figure (test_train.py and test_hostile_edges.py do). Module-scoped, so that the
    module's runs (finished_run, uninterrupted) and the forked children are written the same way."""
    with pytest.MonkeyPatch.context() as patch:
        training_figures_stub(patch)
        yield


@pytest.fixture(autouse=True)
def _one_thread(one_thread, monkeypatch):
    """Every test here on one thread (conftest's one_thread), and errors as the user sees them (no traceback)."""
    monkeypatch.delenv("VIT_EINOPS_TRACEBACK", raising=False)


def cli(*args):
    """`vit-einops train ARGS` through the command's main() in this process: exit status, stdout and stderr."""
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["train", *map(str, args)])
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def cli_process(*args):
    """`python -m vit_einops train ARGS` in a subprocess, bounded by TIMEOUT."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("VIT_EINOPS_TRACEBACK", None)
    command = [sys.executable, "-m", "vit_einops", "train", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def named(field, value):
    """A message naming ``field`` and, after it, the offending ``value`` as Python prints it; not its wording."""
    return rf".*(?<![\w-]){re.escape(field)}(?![\w-]).*(?<![\w.+-]){re.escape(value)}(?![\w.]).*"


def assert_cli_error(done, message):
    """Exit 2 and stderr exactly one line, `vit-einops train: error: ` then a message matching ``message``."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.fullmatch(r"vit-einops train: error: " + message, lines[0]), lines[0]






def tree_hashes(root):
    """{relative path: SHA-256} of every file under ``root``; directories, links and FIFOs as what they are (a link
    is not followed, a FIFO never read: it would block)."""
    root = Path(root)
    if not root.exists():
        return None

    def state(p):
        if p.is_symlink():
            return "link -> " + os.readlink(p)
        if p.is_fifo():
            return "fifo"
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"

    return {str(p.relative_to(root)): state(p) for p in sorted(root.rglob("*"))}


def untimed(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]




# --- numbers and paths checked at entry, before any work ----------------------------------------------------------

NUMERIC = [  # (arguments, the field the error names, the value it names)
    (["--threads", "0"], "--threads", "0"),
    (["--threads=-2"], "--threads", "-2"),
    (["--limit", "0"], "--limit", "0"),
    (["--save-interval", "nan"], "--save-interval", "nan"),
    (["--save-interval=-1"], "--save-interval", "-1.0"),
    (["--test-fraction", "0"], "--test-fraction", "0.0"),
    (["--test-fraction", "nan"], "--test-fraction", "nan"),
    (["--test-fraction", "1"], "--test-fraction", "1.0"),
    (["--lr", "nan"], "lr", "nan"),
    (["--lr", "inf"], "lr", "inf"),
    (["--lr=-1e-3"], "lr", "-0.001"),
    (["--lr", "0"], "lr", "0.0"),
    (["--weight-decay", "inf"], "weight_decay", "inf"),
    (["--weight-decay", "nan"], "weight_decay", "nan"),
    (["--weight-decay=-0.1"], "weight_decay", "-0.1"),
    (["--clip-norm", "0"], "clip_norm", "0.0"),
    (["--clip-norm", "inf"], "clip_norm", "inf"),
    (["--label-smoothing", "nan"], "label_smoothing", "nan"),
    (["--label-smoothing", "1"], "label_smoothing", "1.0"),
    (["--epochs", "0"], "epochs", "0"),
    (["--batch-size", "0"], "batch_size", "0"),
    (["--warmup-epochs=-1"], "warmup_epochs", "-1"),
    (["--shift=-1"], "shift", "-1"),
    (["--seed=-1"], "seed", "-1"),
    (["--seed", str(2**63)], "seed", "9223372036854775808"),
    ([f"--seed={-2**63 - 1}"], "seed", "-9223372036854775809"),
    (["--dropout", "nan"], "dropout", "nan"),
    (["--dropout", "1"], "dropout", "1.0"),
    (["--dim", "0"], "dim", "0"),
    (["--image-size", "0"], "image_size", "0"),
    (["--data", "/nonexistent/photos"], "--data", "'/nonexistent/photos'"),
]


@pytest.mark.parametrize("args, field, value", NUMERIC, ids=[" ".join(a) for a, _, _ in NUMERIC])
def test_bad_numbers_and_flags_are_refused_before_any_work(tmp_path, args, field, value):
    out = tmp_path / "run"
    assert_cli_error(cli(*args, "--out", out), named(field, value))
    assert not out.exists()  # nothing created


def test_resume_and_overwrite_together_are_refused(tmp_path):
    assert_cli_error(cli("--resume", "--overwrite", "--out", tmp_path / "run"), r".*\bresume\b.*\boverwrite\b.*")
    assert not (tmp_path / "run").exists()


def test_the_refusal_is_one_line_without_a_traceback_at_the_process_boundary_too(tmp_path):
    """The in-process cases above, checked once through `python -m vit_einops` (the interpreter's own exit path)."""
    assert_cli_error(cli_process("--epochs", "0", "--out", tmp_path / "run"), named("epochs", "0"))
    assert not (tmp_path / "run").exists()


def test_an_output_that_is_a_file_or_under_a_file_is_refused_before_the_first_epoch(tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("my notes")
    before = tree_hashes(tmp_path)
    assert_cli_error(cli("--out", target), re.escape(f"output directory '{target}' is a file") + ".*")
    under = target / "run"
    assert_cli_error(cli("--out", under), re.escape(f"cannot create output directory '{under}'") + ".*")
    assert tree_hashes(tmp_path) == before


@pytest.mark.parametrize(
    "seed, message",
    [
        (2**63, "seed must be at most 2**63 - 1 (torch's integers are int64), got 9223372036854775808"),
        (-(2**63) - 1, "seed must be >= 0, got -9223372036854775809"),
    ],
)
def test_a_seed_past_int64_is_refused_by_name_on_the_command_line_and_the_api(tmp_path, seed, message):
    """The reported huge seed failed deep in torch ("Overflow when unpacking long long")."""
    assert_cli_error(cli(f"--seed={seed}", "--out", tmp_path / "run"), re.escape(message))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError) as caught:
        TrainConfig(seed=seed)
    assert str(caught.value) == message


def test_the_largest_seed_trains(tmp_path):
    """2**63 - 1 is accepted, and two epochs run: the sampler seeds with seed + epoch, past int64 (torch takes it)."""
    torch.manual_seed(0)
    data = ImageDataset(torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,)), [str(i) for i in range(10)])
    config = TrainConfig(epochs=2, batch_size=8, warmup_epochs=0, seed=2**63 - 1)
    assert config.seed == 2**63 - 1
    result = train(ViT(**TINY), data, data, config, progress=False)
    assert [record["epoch"] for record in result.records] == [1, 2]


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a positive integer"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a positive integer"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1' is not a positive integer"),
        ({"WORLD_SIZE": " 2"}, "WORLD_SIZE=' 2' is not a positive integer"),
        ({"WORLD_SIZE": str(2**63)}, "WORLD_SIZE='9223372036854775808' is not a positive integer"),
        ({"WORLD_SIZE": "2"}, "RANK is not set; expected an integer in [0, 1] (WORLD_SIZE is 2), as torchrun sets it"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK='2' is not an integer in [0, 1] (WORLD_SIZE is 2)"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"},
         "LOCAL_RANK='-1' is not an integer in [0, 1] (WORLD_SIZE is 2)"),
    ],
)  # fmt: skip
def test_torchruns_variables_are_checked_by_name_before_any_work(tmp_path, monkeypatch, variables, message):
    """The reported WORLD_SIZE 'abc', 0 and -1 surfaced int()'s and torch.distributed's errors, naming no variable."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        init_distributed()
    assert str(caught.value) == message
    assert_cli_error(cli(*TINY_FLAGS, "--out", tmp_path / "run"), re.escape(message))
    assert not (tmp_path / "run").exists()


# --- outputs that exist, and two runs at once --------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 1-epoch CLI run on 32 digits, to be copied by the tests that need an existing run."""
    out = tmp_path_factory.mktemp("finished") / "run"
    done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def copy_tree(src, dst):
    for p in sorted(Path(src).rglob("*")):
        q = Path(dst) / p.relative_to(src)
        if p.is_dir():
            q.mkdir(parents=True)
        else:
            q.parent.mkdir(parents=True, exist_ok=True)
            q.write_bytes(p.read_bytes())
    return Path(dst)


def test_an_output_that_holds_a_run_or_any_file_is_refused_without_resume(tmp_path, finished_run):
    run = copy_tree(finished_run, tmp_path / "run")
    before = tree_hashes(run)
    files = r"\(checkpoint, confusion.png, curves.png, metrics.jsonl, model.safetensors, summary.json\)"
    message = rf".*'{re.escape(str(run))}'.*{files}.*--resume.*"
    assert_cli_error(cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run), message)
    assert tree_hashes(run) == before
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert_cli_error(cli("--epochs", "1", "--out", notes), rf".*'{re.escape(str(notes))}'.*\(todo\.txt\).*")
    assert (notes / "todo.txt").read_text() == "mine" and sorted(p.name for p in notes.iterdir()) == ["todo.txt"]


def test_overwrite_replaces_only_what_training_wrote(tmp_path, finished_run):
    run = copy_tree(finished_run, tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    # A user's file named like our tensor files, whose name is not the hash of its content: not ours, kept.
    lookalike = run / "checkpoint" / "model-0123456789abcdef.safetensors"
    lookalike.write_bytes(b"user data")
    old_model = json.loads((run / "checkpoint" / "checkpoint.json").read_text())["files"]["model"]["name"]
    done = cli("--limit", "32", "--epochs", "1", "--seed", "3", *TINY_FLAGS, "--out", run, "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "notes.txt").read_text() == "mine" and lookalike.read_bytes() == b"user data"
    ckpt = load_checkpoint(run / "checkpoint")
    assert ckpt.train_state["train_config"]["seed"] == 3  # the new run's
    assert not (run / "checkpoint" / old_model).exists()  # the old run's weights, named by the old checkpoint.json
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == sorted(
        ["checkpoint.json", lookalike.name, *(f["name"] for f in json.loads(ckpt.path.read_text())["files"].values())]
    )



def test_overwrite_over_a_fifo_in_checkpoint_json_is_refused_without_hanging(tmp_path):
    """Proving a file ours hashes it: a FIFO at a run's name is not ours, is refused, and is not waited on (SIGALRM
    bounds the test)."""
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    fifo = run / "checkpoint" / "checkpoint.json"
    os.mkfifo(fifo)
    with bounded(60):
        done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run, "--overwrite")
    assert_cli_error(done, rf".*'{re.escape(str(run))}'.*: checkpoint/checkpoint\.json \(a FIFO\)\..*--overwrite.*")
    assert (run / "checkpoint" / "checkpoint.json").is_fifo()
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoint", "checkpoint.json"]


# What a run writes at fixed names, and edits that make each one a file the run cannot prove it wrote.
def _edit_model(run):
    with open(run / "model.safetensors", "ab") as f:
        f.write(b"\0")  # one byte more: a different SHA-256 from the one the manifest records


def _link_summary(run):
    (run.parent / "mine.json").write_text("the user's own summary")
    (run / "summary.json").unlink()
    (run / "summary.json").symlink_to(run.parent / "mine.json")


def _fifo_curves(run):
    (run / "curves.png").unlink()
    os.mkfifo(run / "curves.png")


def _no_manifest(run):
    (run / MANIFEST_NAME).unlink()  # a run copied without its manifest: nothing proves any file ours


def _nested_manifest(run):
    (run / MANIFEST_NAME).write_text("[" * 100_000)


def _foreign_manifest(run):
    (run / MANIFEST_NAME).write_text(json.dumps({"format": "vit-einops.run", "files": {"notes.txt": "abc"}}))


def _user_metrics_in_a_new_dir(run):
    for p in sorted(run.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (run / "metrics.jsonl").write_text("my own measurements\n")


UNPROVEN = [  # (edit of a finished run, the files the refusal lists, each with why)
    (_edit_model, r"model\.safetensors \(changed since the run wrote it\)"),
    (_link_summary, r"summary\.json \(a symbolic link\)"),
    (_fifo_curves, r"curves\.png \(a FIFO\)"),
    (
        _no_manifest,
        r"checkpoint/checkpoint\.json \(no manifest records it\); confusion\.png \(no manifest records it\); "
        r"curves\.png \(no manifest records it\); metrics\.jsonl \(no manifest records it\); "
        r"model\.safetensors \(no manifest records it\); summary\.json \(no manifest records it\)",
    ),
    (_nested_manifest, r".*\.vit-einops-run\.json \(not a run manifest \(ValueError\)\).*"),
    (_foreign_manifest, r".*\.vit-einops-run\.json \(not a run manifest\).*"),
    (_user_metrics_in_a_new_dir, r"metrics\.jsonl \(no manifest records it\)"),
]


REFUSALS = [(*case, "--overwrite") for case in UNPROVEN] + [(*case, "--resume") for case in UNPROVEN[:3]]


@pytest.mark.parametrize(
    "edit, listed, flag", REFUSALS, ids=[f"{e.__name__.strip('_')} {flag}" for e, _, flag in REFUSALS]
)
def test_overwrite_and_resume_refuse_and_list_files_at_a_runs_names_no_run_recorded(
    tmp_path, finished_run, edit, listed, flag
):
    """--resume rewrites metrics.jsonl, model.safetensors and the figures from the checkpoint: the same proof."""
    run = copy_tree(finished_run, tmp_path / "run")
    edit(run)
    before = tree_hashes(tmp_path)
    with bounded(60):
        done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run, flag)
    expected = rf"output directory '{re.escape(str(run))}' holds files at a training run's names that no run of "
    expected += rf"vit-einops is recorded to have written: {listed}\. {flag} \({flag[2:]}=True\) replaces only .*"
    assert_cli_error(done, expected)
    assert tree_hashes(tmp_path) == before


def test_overwrite_removes_the_old_runs_files_the_new_run_does_not_write(tmp_path):
    """A run with test data wrote figures; a new run over it without test data writes none: the old figures, proven
    by the manifest, are removed rather than left beside the new run's files (and said so)."""
    data = fault_data()
    out = tmp_path / "run"
    run_tiny(data, out)
    assert (out / "curves.png").exists() and (out / "confusion.png").exists()
    (out / "notes.txt").write_text("mine")
    torch.manual_seed(0)
    err = StringIO()
    with redirect_stderr(err):
        train(ViT(**TINY), data, None, TrainConfig(epochs=1, batch_size=16), out_dir=out, overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST_NAME, "checkpoint", "metrics.jsonl", "model.safetensors", "notes.txt", "summary.json"]
    )
    assert (out / "notes.txt").read_text() == "mine"
    assert "note: removed the previous run's files in" in err.getvalue() and "curves.png" in err.getvalue()

def test_a_second_run_is_locked_out_and_a_killed_holder_does_not_block(tmp_path, finished_run):
    run = copy_tree(finished_run, tmp_path / "run")
    ready, told = os.pipe()

    def hold_the_lock():
        RunDir.open(run, resume=True)
        os.write(told, b"locked")
        time.sleep(TIMEOUT)

    holder = fork(hold_the_lock)
    os.close(told)
    try:
        with bounded(TIMEOUT):
            assert os.read(ready, 6) == b"locked"
        before = tree_hashes(run)
        done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run, "--resume")
        assert_cli_error(done, rf"output directory '{re.escape(str(run))}' is in use .*\(pid {holder}\).*")
        assert tree_hashes(run) == before
    finally:
        os.close(ready)
        os.kill(holder, signal.SIGKILL)  # the lock file stays, the kernel drops the lock
        assert exit_code(holder) == -signal.SIGKILL
    assert (run / LOCK_NAME).exists()
    done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run, "--resume")  # the run is complete
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1]
    assert not (run / LOCK_NAME).exists()  # released and removed at the end


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    with RunDir.open(tmp_path / "run"):
        with pytest.raises(OSError, match=rf"in use .*\(pid {os.getpid()}\)"):
            RunDir.open(tmp_path / "run", resume=True)
    with RunDir.open(tmp_path / "run"):  # released on exit
        pass


def test_files_named_like_a_runs_temporaries_are_kept(tmp_path, finished_run):
    """A run removes only the temporaries its lock file records (a killed run's: the kill tests below leave them and
    check that none is left after the resume); a file that only has the name of one is someone else's."""
    run = copy_tree(finished_run, tmp_path / "run")
    lookalikes = [
        run / ".metrics.jsonl.abcd1234.tmp",
        run / ".model.safetensors.x_y_z_12.tmp",
        run / f".{MANIFEST_NAME}.abcd1234.tmp",
        run / ".summary.json.notes001.tmp",
        run / ".notes.txt.abcd1234.tmp",
        run / "keep.tmp",
        run / "checkpoint" / ".checkpoint.json.qwerty12.tmp",
        run / "checkpoint" / ".model-0123456789abcdef.safetensors.a1b2c3d4.tmp",
    ]
    for p in lookalikes:
        p.write_bytes(b"partial")
    done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run, "--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(p.read_bytes() == b"partial" for p in lookalikes)


# --- a diverging run ------------------------------------------------------------------------------------------


def test_a_non_finite_loss_stops_the_cli_run_and_keeps_the_last_finite_checkpoint(tmp_path):
    # One step per epoch: epoch 1's loss is computed before its one (huge but finite) update; epoch 2's is nan.
    out = tmp_path / "run"
    done = cli("--limit", "32", "--epochs", "3", *TINY_FLAGS, "--lr", "1e30", "--save-interval", "0", "--out", out)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    # what diverged and when, the learning rate, and which epoch the checkpoint still holds
    checkpoint = re.escape(str(out / "checkpoint"))
    # 3 steps, none of warm-up (capped at a fifth of the run): the rate after step 2 is 1e30 * (1 + cos(2 pi / 3)) / 2
    expected = rf"vit-einops train: error: .*epoch 2\b.*\bnan\b.*2\.5e\+29.*{checkpoint}.*epoch 1\b.*"
    assert re.fullmatch(expected, last), last
    assert load_checkpoint(out / "checkpoint").train_state["epoch"] == 1
    assert [r["epoch"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1]
    assert not (out / "summary.json").exists()  # the run did not end as if it had succeeded


class PoisonedAfter(torch.utils.data.Dataset):
    """Digits-like items that turn to NaN after ``clean`` reads: epoch 2 of a run over ``clean`` items diverges."""

    def __init__(self, data, clean):
        self.data, self.clean, self.reads = data, clean, 0

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        self.reads += 1
        image, label = self.data[index]
        return (image if self.reads <= self.clean else torch.full_like(image, float("nan"))), label


def test_a_non_finite_loss_keeps_the_last_good_checkpoint_untouched(tmp_path):
    torch.manual_seed(1)
    data = ImageDataset(torch.rand(64, 1, 8, 8), torch.randint(0, 10, (64,)), [str(i) for i in range(10)])
    torch.manual_seed(0)
    model = ViT(**TINY)
    config = TrainConfig(epochs=3, batch_size=16, warmup_epochs=1)
    with pytest.raises(TrainingDivergedError) as caught:
        train(model, PoisonedAfter(data, clean=64), data, config, out_dir=tmp_path, save_interval=0, progress=False)
    # Epoch 1 was committed; epoch 2 stopped the run before its checkpoint and left every file as epoch 1 wrote it.
    checkpoint = re.escape(str(tmp_path / "checkpoint"))
    assert re.fullmatch(rf".*epoch 2\b.*\bnan\b.*{checkpoint}.*epoch 1\b.*", str(caught.value))
    assert load_checkpoint(tmp_path / "checkpoint").train_state["epoch"] == 1
    assert [r["epoch"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())] == [1]
    assert all(torch.isfinite(t).all() for t in load_vit(tmp_path / "model.safetensors").state_dict().values())


# --- image folders ---------------------------------------------------------------------------------------------


def png_header_only(path, width, height):
    """A PNG whose header claims width x height (one IDAT row's worth of data): a decompression bomb's shape."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grey
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    )


def make_folder(root, classes=("cat", "dog"), per_class=3):
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (6, 6), (200 * c, 30 * i, 0)).save(root / name / f"{i}.png")


def test_hidden_folders_and_files_are_not_classes_or_images(tmp_path):
    make_folder(tmp_path)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (6, 6)).save(tmp_path / ".ipynb_checkpoints" / "0-checkpoint.png")
    (tmp_path / "cat" / "._0.png").write_bytes(b"AppleDouble metadata, not an image")
    data = load_image_folder(tmp_path, 4)
    assert data.classes == ["cat", "dog"] and len(data) == 6


def test_sixteen_bit_pngs_are_scaled_by_their_range_not_clipped(tmp_path):
    levels = np.array([[0, 16384, 32768, 65535]], dtype=np.uint16)
    Image.fromarray(levels).save(tmp_path / "deep.png")  # mode I;16
    grey = load_image(tmp_path / "deep.png", (1, 4), in_channels=1)
    np.testing.assert_allclose(grey.flatten().numpy(), np.round(levels[0] / 65535 * 255) / 255, atol=1e-7)
    assert grey.max() == 1.0 and 0.49 < grey[0, 0, 2] < 0.51  # mid-grey stays mid-grey


@pytest.mark.parametrize("kind", ["bomb", "fifo", "directory", "garbage"])
def test_hostile_image_files_in_a_folder_are_refused_by_name_without_hanging(tmp_path, kind):
    make_folder(tmp_path)
    bad = tmp_path / "dog" / "bad.png"
    if kind == "bomb":
        png_header_only(bad, 20000, 20000)
        # PIL's own guard (2 x MAX_IMAGE_PIXELS) or open_image's cap, whichever looks first; never a traceback
        message = r"400000000 pixels"
    elif kind == "fifo":
        os.mkfifo(bad)
        message = "not a regular file"
    elif kind == "directory":
        bad.mkdir()
        message = "not a regular file"
    else:
        bad.write_bytes(b"\x89PNG but not really")
        message = r"not an image of a format vit-einops reads \(PNG, JPEG, GIF"
    with bounded(30), pytest.raises(ValueError, match=rf"cannot read image '{re.escape(str(bad))}': .*{message}"):
        load_image_folder(tmp_path, 4)


def test_the_cli_refuses_a_fifo_image_in_its_data_without_hanging(tmp_path):
    make_folder(tmp_path / "data", per_class=4)
    os.mkfifo(tmp_path / "data" / "cat" / "stuck.png")
    out = tmp_path / "run"
    done = cli("--data", tmp_path / "data", "--image-size", "8", "--patch-size", "4", *TINY_FLAGS, "--out", out)
    assert_cli_error(done, r"cannot read image '.*stuck\.png'.*not a regular file")
    assert not (out / "checkpoint").exists()


# --- checkpoint.json that lies ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A 1-epoch run of 3 (so that resume has work to do), trained through the Python API once for the module."""
    torch.manual_seed(1)
    data = ImageDataset(torch.rand(48, 1, 8, 8), torch.randint(0, 10, (48,)), [str(i) for i in range(10)])
    out = tmp_path_factory.mktemp("stopped") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_tiny(data, out, stop_after=1)
    finally:
        torch.set_num_threads(threads)
    return out, data


@pytest.fixture
def run_dir(tmp_path, stopped_run):
    """A copy of stopped_run's files, for the test to edit."""
    out, data = stopped_run
    return copy_tree(out, tmp_path / "run"), data


def run_tiny(data, out, **kwargs):
    torch.manual_seed(0)
    model = ViT(**TINY)
    config = TrainConfig(epochs=3, batch_size=16, warmup_epochs=1)
    return model, train(model, data, data, config, out_dir=out, progress=False, **kwargs)


def edit_meta(run, edit):
    path = run / "checkpoint" / "checkpoint.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def delete(keys):
    def edit(meta):
        *parents, last = keys.split(".")
        node = meta
        for k in parents:
            node = node[int(k)] if isinstance(node, list) else node[k]
        del node[last]

    return edit


def setter(keys, value):
    def edit(meta):
        *parents, last = keys.split(".")
        node = meta
        for k in parents:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = (
            value(node[int(last) if isinstance(node, list) else last]) if callable(value) else value
        )

    return edit


LYING_FIELDS = [
    # (edit, the words the error must contain) -- read by load_checkpoint
    (delete("config"), r"no field 'config'"),
    (setter("config", "vit_b_16"), r"'config'.*'vit_b_16'"),
    (setter("config.dim", "16"), r"'config'.*\bdim\b.*'16'"),
    (delete("files"), r"no field 'files'"),
    (setter("files", []), r"'files'.*\[\]"),
    (delete("files.model"), r"no field 'files\.model'"),
    (setter("files.model", "model.safetensors"), r"'files\.model'.*'model\.safetensors'"),
    (setter("files.model.name", 7), r"'files\.model'.*\b7\b"),
    (setter("train_state", []), r"'train_state'.*\[\]"),
    (setter("optimizer", [1, 2]), r"'optimizer'.*\[1, 2\]"),
    (delete("optimizer"), r"no field 'optimizer'"),
    (setter("optimizer.state", {"__tensor__": "nowhere"}), r"'optimizer'.*KeyError"),
    (setter("scheduler", 5), r"'scheduler'.*\b5\b"),
    (setter("version", "1"), r"version '1'"),
    # read by resume
    (setter("train_state.epoch", "1"), r"'train_state\.epoch'.*'1'"),
    (setter("train_state.epoch", 7), r"'train_state\.epoch'.*\b7\b"),
    (delete("train_state.records"), r"'train_state\.records'.*\b1\b"),
    (setter("train_state.records", [{"epoch": 2}]), r"'train_state\.records'"),
    # the learning-rate schedule: a function of (recipe, step), so any edit shows
    (
        setter("scheduler.base_lrs", lambda v: [x * 10 for x in v]),
        r"scheduler\.base_lrs\.0\b.*\b0\.02\b.*\b0\.002\b",
    ),
    (setter("scheduler.last_epoch", 1), r"scheduler\.last_epoch\b.*\b1\b.*\b3\b"),
    (setter("scheduler._last_lr", [1.0, 1.0]), r"scheduler\._last_lr\.0\b.*\b1\.0\b"),
    (
        setter("scheduler.lr_lambdas.0.total_steps", 3000),
        r"lr_lambdas\.0\.total_steps\b.*\b3000\b.*\b9\b",
    ),
    (setter("optimizer.param_groups.0.lr", 0.5), r"param_groups\.0\.lr\b.*\b0\.5\b"),
    (
        setter("optimizer.param_groups.1.weight_decay", 0.3),
        r"param_groups\.1\.weight_decay\b.*\b0\.3\b.*\b0\.0\b",
    ),
    (
        setter("optimizer.param_groups.0.betas", {"__tuple__": [0.5, 0.999]}),
        r"param_groups\.0\.betas\.0\b.*\b0\.5\b",
    ),
]


@pytest.mark.parametrize("edit, message", LYING_FIELDS, ids=[m[:40] for _, m in LYING_FIELDS])
def test_a_checkpoint_json_with_wrong_types_missing_keys_or_an_edited_schedule_is_refused(run_dir, edit, message):
    run, data = run_dir
    edit_meta(run, edit)
    before = tree_hashes(run)
    with pytest.raises(CheckpointError, match=re.escape(str(run / "checkpoint" / "checkpoint.json")) + ".*" + message):
        run_tiny(data, run, resume=True)
    assert tree_hashes(run) == before


def rewrite_tensor_file(run, kind, change):
    """Replace the checkpoint's ``kind`` file with ``change(tensors)``, keeping checkpoint.json's hash consistent."""
    from safetensors.torch import load, save

    meta_path = run / "checkpoint" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    path = run / "checkpoint" / meta["files"][kind]["name"]
    data = save(change(load(path.read_bytes())))
    path.write_bytes(data)
    meta["files"][kind]["sha256"] = hashlib.sha256(data).hexdigest()
    meta_path.write_text(json.dumps(meta))
    return path


def first_key(tensors):
    return sorted(tensors)[0]


TENSOR_EDITS = [
    (
        "model",
        lambda t: {**t, first_key(t): t[first_key(t)].to(torch.int64)},
        r"torch\.int64.*torch\.float32 only",
    ),
    ("model", lambda t: {**t, first_key(t): t[first_key(t)] > 0}, r"torch\.bool.*torch\.float32 only"),
    (
        "model",
        lambda t: {k: v.half() for k, v in t.items()},
        r"torch\.float16.*torch\.float32",
    ),
    ("model", lambda t: {**t, first_key(t): t[first_key(t)].to(torch.bfloat16)}, r"torch\.bfloat16"),
    (
        "model",
        lambda t: {**t, first_key(t): torch.full_like(t[first_key(t)], float("nan"))},
        r"non-finite.*\b1 tensor\b",
    ),
    ("optimizer", lambda t: {k: v.double() for k, v in t.items()}, r"torch\.float64"),
]


@pytest.mark.parametrize("kind, change, message", TENSOR_EDITS, ids=[m[:30] for _, _, m in TENSOR_EDITS])
def test_integer_bool_half_mixed_or_non_finite_tensors_in_a_checkpoint_are_refused(run_dir, kind, change, message):
    run, _ = run_dir
    path = rewrite_tensor_file(run, kind, change)
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*" + message):
        load_checkpoint(run / "checkpoint")


def test_a_fifo_or_a_directory_in_a_checkpoint_files_place_is_refused_without_hanging(run_dir):
    run, _ = run_dir
    meta = run / "checkpoint" / "checkpoint.json"
    model_file = run / "checkpoint" / json.loads(meta.read_text())["files"]["model"]["name"]
    model_file.unlink()
    os.mkfifo(model_file)
    with bounded(30), pytest.raises(CheckpointError, match=r"cannot read .*\bFIFO\b"):
        load_checkpoint(run / "checkpoint")
    meta.unlink()
    meta.mkdir()
    with bounded(30), pytest.raises(CheckpointError, match=r"cannot read .*checkpoint\.json.*\bdirectory\b"):
        load_checkpoint(run / "checkpoint")


# --- kill -9 at every write point, then resume ---------------------------------------------------------------------

def killed_at(target, when, nth, out):
    """fault_run(out) in a forked child that SIGKILLs itself at the ``nth`` os.replace onto a name starting with
    ``target``: ``when`` "temp written" (the temporary complete and fsynced, the rename not done) or "renamed" (the
    directory not yet fsynced, nothing after it done). Returns the child's exit code."""

    def child():
        real_replace, seen = os.replace, [0]

        def replace(src, dst):
            hit = Path(dst).name.startswith(target)
            if hit:
                seen[0] += 1
            if hit and seen[0] == nth and when == "temp written":
                os.kill(os.getpid(), signal.SIGKILL)
            real_replace(src, dst)
            if hit and seen[0] == nth and when == "renamed":
                os.kill(os.getpid(), signal.SIGKILL)

        os.replace = replace  # in the child only
        fault_run(out)

    return exit_code(fork(child))


def fault_data():
    torch.manual_seed(1)
    return ImageDataset(torch.rand(48, 1, 8, 8), torch.randint(0, 10, (48,)), [str(i) for i in range(10)])


def fault_run(out, **kwargs):
    return run_tiny(fault_data(), out, save_interval=0, **kwargs)  # a checkpoint after every epoch


WRITE_POINTS = [
    ("model-", "temp written"),  # the checkpoint's weights file
    ("optimizer-", "renamed"),
    ("checkpoint.json", "temp written"),  # the commit point, just before it
    ("checkpoint.json", "renamed"),  # just after it: metrics and model file still the previous epoch's
    ("metrics.jsonl", "temp written"),
    ("metrics.jsonl", "renamed"),
    ("model.safetensors", "temp written"),
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the killed child and the resumed run: 2 threads sum in another order
    try:
        model, result = fault_run(out)
    finally:
        torch.set_num_threads(threads)
    return model, result, (out / "metrics.jsonl").read_text()


@pytest.mark.parametrize("target, when", WRITE_POINTS, ids=[f"{t} {w}" for t, w in WRITE_POINTS])
def test_kill_at_each_write_point_then_resume_loses_and_repeats_nothing(tmp_path, uninterrupted, target, when):
    assert killed_at(target, when, 2, tmp_path) == -signal.SIGKILL  # killed in epoch 2's writes
    model, result = fault_run(tmp_path, resume=True)
    whole_model, whole, whole_metrics = uninterrupted
    for (name, a), b in zip(whole_model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert result.weights_sha256 == whole.weights_sha256
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in metrics] == [1, 2, 3]  # none lost, none repeated
    assert untimed(metrics) == untimed(json.loads(line) for line in whole_metrics.splitlines())
    leftovers = sorted(p.name for p in tmp_path.rglob("*.tmp"))
    assert leftovers == []
    names = json.loads((tmp_path / "checkpoint" / "checkpoint.json").read_text())["files"]
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == sorted(
        ["checkpoint.json", names["model"]["name"], names["optimizer"]["name"]]
    )
    saved = load_vit(tmp_path / "model.safetensors")
    assert all(torch.equal(saved.state_dict()[k], v) for k, v in model.state_dict().items())


# --- the Python API's own entry checks -----------------------------------------------------------------------------


def api_cases(tmp_path):
    torch.manual_seed(1)
    data = ImageDataset(torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,)), [str(i) for i in range(10)])
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.tex").write_text("mine")
    model = ViT(**TINY)
    return (
        busy,
        [
            (
                dict(model=model.double()),
                TypeError,
                r"torch\.float32.*torch\.float64",
            ),
            (dict(model=torch.nn.Linear(2, 2)), TypeError, r"\bmodel\b.*\bLinear\b"),
            (dict(config={"epochs": 1}), TypeError, r"\bconfig\b.*\bdict\b"),
            (dict(stop_after=0), ValueError, r"\bstop_after\b.*\b0\b"),
            (dict(resume=True), ValueError, r"\bresume\b.*\bout_dir\b"),
            (dict(device="tpu"), ValueError, r"\bdevice\b.*'tpu'"),
            (dict(out_dir=busy), ValueError, r"'.*busy'.*\bthesis\.tex\b"),
            (
                dict(out_dir=busy / "thesis.tex"),
                ValueError,
                r"'.*thesis\.tex' is a file",
            ),
        ],
        data,
    )


def test_the_python_api_refuses_bad_arguments_before_any_work(tmp_path):
    busy, cases, data = api_cases(tmp_path)
    for kwargs, error, message in cases:
        args = {"model": ViT(**TINY), "train_data": data, "test_data": data, "config": TrainConfig(epochs=1), **kwargs}
        with pytest.raises(error, match=message):
            train(progress=False, **args)
        assert sorted(p.name for p in busy.iterdir()) == ["thesis.tex"] and (busy / "thesis.tex").read_text() == "mine"


# --- a run killed in its very first checkpoint write ------------------------------------------------------------------

FIRST_WRITE_POINTS = [
    (MANIFEST_NAME, "temp written"),  # before anything of the run is recorded: a lock file and a temporary
    ("model-", "temp written"),  # the manifest written, checkpoint/ holding a temporary
    ("optimizer-", "renamed"),  # checkpoint/ holding the weights file, no checkpoint.json
    ("checkpoint.json", "temp written"),  # every tensor file in place, the commit point not
]


@pytest.mark.parametrize("flags", [{}, {"resume": True}], ids=["rerun", "resume"])
@pytest.mark.parametrize("target, when", FIRST_WRITE_POINTS, ids=[f"{t} {w}" for t, w in FIRST_WRITE_POINTS])
def test_a_run_killed_in_its_first_checkpoint_write_starts_again(tmp_path, uninterrupted, target, when, flags):
    """Nothing was committed, so nothing is resumed: a plain rerun and --resume both start at epoch 1 (resume says
    so), remove what the killed run left, and end as the uninterrupted run did."""
    assert killed_at(target, when, 1, tmp_path) == -signal.SIGKILL
    assert not (tmp_path / "checkpoint" / "checkpoint.json").exists()
    err = StringIO()
    with redirect_stderr(err):
        model, result = fault_run(tmp_path, **flags)
    whole_model, whole, whole_metrics = uninterrupted
    assert result.weights_sha256 == whole.weights_sha256
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert untimed(metrics) == untimed(json.loads(line) for line in whole_metrics.splitlines())
    assert sorted(p.name for p in tmp_path.rglob("*.tmp")) == []
    names = json.loads((tmp_path / "checkpoint" / "checkpoint.json").read_text())["files"]
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == sorted(
        ["checkpoint.json", names["model"]["name"], names["optimizer"]["name"]]
    )
    said = err.getvalue().count("holds no checkpoint (its run was stopped before the first one): starting at epoch 1")
    assert said == (1 if flags else 0)


def test_resume_where_no_run_ever_started_is_refused_and_creates_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    for out in (tmp_path / "new", tmp_path / "empty", tmp_path / "notes"):
        before = tree_hashes(tmp_path)
        done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", out, "--resume")
        checkpoint = re.escape(str(out / "checkpoint" / "checkpoint.json"))
        assert_cli_error(done, rf"no checkpoint at {checkpoint} and no run was started in '.*': nothing to resume .*")
        assert tree_hashes(tmp_path) == before


NESTED = [  # checkpoint.json's text, and what the one-line error says
    ("[" * 100_000, r"is corrupt or truncated: checkpoint\.json nests JSON 100000 levels deep, over the 32"),
    (
        '{"format": "vit-einops.checkpoint", "version": 1, "train_state": ' + "[" * 100_000,
        r"is corrupt or truncated: checkpoint\.json nests JSON 100001 levels deep, over the 32",
    ),
    ("{" * 3 + "}", r"is corrupt or truncated: checkpoint\.json is not valid JSON"),
]


@pytest.mark.parametrize("text, message", NESTED, ids=["array", "inside-a-field", "unbalanced"])
def test_deeply_nested_or_broken_checkpoint_json_is_one_error_naming_the_file(run_dir, text, message):
    run, data = run_dir
    meta = run / "checkpoint" / "checkpoint.json"
    meta.write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(str(meta)) + " " + message):
        load_checkpoint(run / "checkpoint")
    done = cli("--limit", "32", "--epochs", "1", *TINY_FLAGS, "--out", run, "--resume")
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
