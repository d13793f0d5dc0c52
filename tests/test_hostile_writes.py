"""Hostile writes: every output is one operation, checked at its commit (issue 17), for convert, explore, inspect and
the writers under them. Each case asserts its exact outcome: exit code, message, no traceback, and the files around
the output hashed before and after.

Causes: a file that appears between a command's start and its commit; two writers of one output; an output that is
an input, a link to one, inside one or holding one; a FIFO or device where a file goes, even with --force; the mode
of a replaced file; leftovers of killed runs; the old files of a replaced directory; kill -9 at every write point.
A second process is a forked child (it shares this process's imports, so it starts at once).
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
from pathlib import Path

import pytest
import torch
from _fork import exit_code, fork
from _tiny import TINY_DIGITS, tiny_vit

from vit_einops.base import io as _io
from vit_einops.base.io import atomic_write_bytes, output_lock
from vit_einops.commands.cli import main
from vit_einops.interop import save_state_dict_file
from vit_einops.modelfile import save_vit
from vit_einops.preprocess import Preprocessing

REPORT = [
    "arrays.npz", "attention.png", "attention_distance.png", "decomposition.png", "embedding_filters.png",
    "methods.png", "patch_pca.png", "position_similarity.png", "prefix_share.png", "token_norms.png",
]  # fmt: skip
INSPECT = ["--num-images", "1", "--distance-images", "2"]  # the smallest report


def tree(root) -> dict[str, str]:
    """{name: SHA-256 of a file, "dir", "fifo", "link -> target" or "device"} for everything under ``root``,
    dot files included: what a case must leave as it was."""
    root = Path(root)
    out = {}
    for p in sorted(root.rglob("*")):
        name = str(p.relative_to(root))
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            out[name] = f"link -> {os.readlink(p)}"
        elif stat.S_ISREG(mode):
            out[name] = digest(p)
        else:
            out[name] = "dir" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode) else "device"
    return out


def digest(path) -> str:
    """SHA-256 of a file's bytes; for a readable safetensors file, of its metadata and tensors (its writer orders
    the metadata differently from run to run)."""
    from safetensors import SafetensorError, safe_open

    data = Path(path).read_bytes()
    if Path(path).suffix == ".safetensors":
        try:
            with safe_open(path, framework="pt") as f:
                meta = sorted((f.metadata() or {}).items())
                tensors = [(k, f.get_tensor(k).numpy().tobytes()) for k in sorted(f.keys())]
            data = repr((meta, tensors)).encode()
        except (SafetensorError, OSError):
            pass  # not whole: its bytes
    return hashlib.sha256(data).hexdigest()


def cli(capsys, *args) -> tuple[int, str]:
    """Run the command line in-process; its exit code and stderr, which must be one line and no traceback."""
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code != 0:
        assert err.count("\n") == 1, err
    return code, err


def digits_model(preprocessing=None) -> torch.nn.Module:
    model = tiny_vit(TINY_DIGITS)
    model.class_names = [str(i) for i in range(10)]
    model.preprocessing = preprocessing or Preprocessing.plain(8, channels=1)
    return model


@pytest.fixture(autouse=True)
def unrendered(monkeypatch):
    """inspect's figures are neither made nor rendered (most of its time): each is written as a few bytes, through
    the same atomic write, so the report's files, write points and swap are the real ones."""
    import vit_einops.inspect.report as report

    for name in dir(report):
        if name.startswith("plot_"):
            monkeypatch.setattr(report, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi=120: atomic_write_bytes(path, b"figure"))


@pytest.fixture
def model_file(tmp_path):
    """The digits model, its preprocessing a crop after a PIL resize: no Hugging Face image processor does it
    exactly, so its HF directory holds no preprocessor_config.json (hf_dir's has one)."""
    crop_after_pil_resize = Preprocessing(9, (8, 8), mean=(0.0,), std=(1.0,))
    return save_vit(digits_model(crop_after_pil_resize), tmp_path / "m.safetensors")


@pytest.fixture
def hf_dir(tmp_path, capsys):
    """An HF directory with a preprocessor_config.json (ViTImageProcessor-shaped preprocessing)."""
    old = save_vit(digits_model(Preprocessing.hf(8, 1)), tmp_path / "old.safetensors")
    assert cli(capsys, "convert", old, tmp_path / "hf", "--to", "hf")[0] == 0
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    return tmp_path / "hf"






class Holder:
    """Another process holding the lock of ``path`` (as a running writer would) until stopped."""

    def __init__(self, path):
        ready_r, ready_w = os.pipe()
        self.stop_r, self.stop_w = os.pipe()

        def child():
            with output_lock(path):
                os.write(ready_w, b"1")
                os.read(self.stop_r, 1)

        self.pid = fork(child)
        assert os.read(ready_r, 1) == b"1"
        os.close(ready_r), os.close(ready_w)

    def stop(self):
        os.write(self.stop_w, b"1")
        assert exit_code(self.pid) == 3


# --- a file that appears between the start and the commit is never replaced ----------------------------------------


def appearing(monkeypatch, module, name, make):
    """Make ``module.name`` (a step between a command's first check and its commit) call ``make()`` first."""
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        make()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def test_a_page_that_appears_while_explore_runs_is_kept(tmp_path, model_file, monkeypatch, capsys):
    import vit_einops.explore.page as page

    out = tmp_path / "e.html"
    appearing(monkeypatch, page, "render_page", lambda: out.write_text("theirs"))
    code, err = cli(capsys, "explore", model_file, "--out", out)
    assert err == f"vit-einops explore: error: {out} already exists at the commit; it was left as it is\n"
    assert code == 2
    assert out.read_text() == "theirs" and sorted(os.listdir(tmp_path)) == ["e.html", "m.safetensors"]


@pytest.mark.parametrize("target, module", [("vit-einops", "vit_einops.modelfile"), ("timm", "vit_einops.interop.io")])
def test_a_file_that_appears_while_convert_runs_is_kept(tmp_path, model_file, monkeypatch, capsys, target, module):
    import importlib

    dst = tmp_path / "dst.safetensors"
    appearing(monkeypatch, importlib.import_module(module), "safetensors_bytes", lambda: dst.write_text("theirs"))
    code, err = cli(capsys, "convert", model_file, dst, "--to", target)
    assert err == f"vit-einops convert: error: {dst} already exists at the commit; it was left as it is\n"
    assert code == 2
    assert dst.read_text() == "theirs" and sorted(os.listdir(tmp_path)) == ["dst.safetensors", "m.safetensors"]


def tree_of(file) -> dict[str, str]:
    return {Path(file).name: digest(file)}


@pytest.mark.parametrize(
    "command, module, step, name",
    [
        ("convert", "vit_einops.interop.hf", "safetensors_bytes", "config.json"),
        ("inspect", "vit_einops.inspect.report", "plot_filters", "attention.png"),
    ],
    ids=["convert to hf", "inspect"],
)
def test_a_folder_that_appears_while_a_directory_is_written_is_kept(
    tmp_path, model_file, monkeypatch, capsys, command, module, step, name
):
    import importlib

    out = tmp_path / "out"

    def make():
        out.mkdir()
        (out / name).write_text("theirs")

    appearing(monkeypatch, importlib.import_module(module), step, make)
    if command == "convert":
        code, err = cli(capsys, "convert", model_file, out, "--to", "hf")
    else:
        code, err = cli(capsys, "inspect", model_file, "--out", out, *INSPECT)
    assert code == 2
    assert err == f"vit-einops {command}: error: {out} already holds {name}; pass --force to replace them\n"
    theirs = hashlib.sha256(b"theirs").hexdigest()
    assert tree(tmp_path) == {"out": "dir", f"out/{name}": theirs, **tree_of(model_file)}


# --- two writers of one output: exactly one wins, the other is told ------------------------------------------------


def test_a_second_explore_of_one_page_fails_naming_the_first(tmp_path, model_file, capsys):
    out = tmp_path / "e.html"
    out.write_text("old")
    holder = Holder(out)
    try:
        code, err = cli(capsys, "explore", model_file, "--out", out, "--force")
    finally:
        holder.stop()
    assert code == 2
    assert err == (
        f"vit-einops explore: error: {out} is being written by another vit-einops process (pid {holder.pid}, lock "
        f"{tmp_path}/.e.html.lock); wait for it to finish, or choose another output\n"
    )
    assert out.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["e.html", "m.safetensors"]


def test_a_second_convert_to_one_hf_directory_fails_even_with_force(tmp_path, model_file, hf_dir, capsys):
    before = tree(tmp_path)
    holder = Holder(hf_dir)
    try:
        code, err = cli(capsys, "convert", model_file, hf_dir, "--to", "hf", "--force")
    finally:
        holder.stop()
    assert code == 2 and f"is being written by another vit-einops process (pid {holder.pid}," in err
    assert tree(tmp_path) == before


def test_a_second_inspect_into_one_folder_fails_and_leaves_its_leftovers(tmp_path, model_file, capsys):
    """While a writer holds the lock, what looks like a leftover may be its own staging: it stays."""
    out = tmp_path / "out"
    holder = Holder(out)
    (tmp_path / ".out.abcd1234.staging").mkdir()
    before = tree(tmp_path)
    try:
        code, err = cli(capsys, "inspect", model_file, "--out", out, *INSPECT)
    finally:
        holder.stop()
    assert code == 2 and f"{out} is being written by another vit-einops process (pid {holder.pid}," in err
    assert tree(tmp_path) == {name: v for name, v in before.items() if name != ".out.lock"}  # the holder's, gone


def test_a_second_bench_into_one_folder_fails_before_measuring(tmp_path, capsys):
    holder = Holder(tmp_path / "b")
    try:
        code, err = cli(capsys, "bench", "--smoke", "--out", tmp_path / "b")
    finally:
        holder.stop()
    assert code == 2 and f"{tmp_path / 'b'} is being written by another vit-einops process (pid {holder.pid}," in err
    assert os.listdir(tmp_path) == []  # nothing made, the holder's lock file gone with it


def test_bench_keeps_a_result_file_that_appears_during_its_run_and_a_folder_named_like_its_staging(
    tmp_path, monkeypatch, capsys
):
    """The results folder is staged beside --out and swapped in whole: a file that appears in --out while the run
    measures is refused at the commit (without --force) and kept; a folder beside it named like the run's staging
    directory, which no lock records, is never removed; the run's own staging directory and lock are gone."""
    import vit_einops.bench.report as report

    out = tmp_path / "b"
    out.mkdir()
    (tmp_path / ".b.abcd1234.staging").mkdir()  # named like ours, but no lock records it
    (tmp_path / ".b.abcd1234.staging" / "results.json").write_text("half")
    appearing(monkeypatch, report, "write_json", lambda: (out / "results.json").write_text("theirs"))
    one_point = ["--threads", "1", "--batches", "1", "--tokens", "9", "--modes", "forward", "--skip-layer"]
    code = main(["bench", "--smoke", "--out", str(out), "--skip-model", *one_point])
    err = capsys.readouterr().err  # the progress bar's lines, then the error's
    assert code == 2 and "Traceback" not in err
    says = f"vit-einops bench: error: {out} already holds results.json; pass --force to replace them"
    assert err.splitlines()[-1] == says
    assert sorted(tree(tmp_path)) == [".b.abcd1234.staging", ".b.abcd1234.staging/results.json", "b", "b/results.json"]
    assert (out / "results.json").read_text() == "theirs"
    assert (tmp_path / ".b.abcd1234.staging" / "results.json").read_text() == "half"


def test_two_creating_writes_of_one_file_one_wins(tmp_path):
    path = tmp_path / "f.bin"
    atomic_write_bytes(path, b"first", replace=False)
    with pytest.raises(FileExistsError, match=f"^{path} already exists at the commit; it was left as it is$"):
        atomic_write_bytes(path, b"second", replace=False)
    assert path.read_bytes() == b"first" and os.listdir(tmp_path) == ["f.bin"]


def test_without_renameat2_files_are_created_by_exclusive_link_and_directories_swapped_aside(
    tmp_path, hf_dir, model_file, monkeypatch, capsys
):
    """Where the system has no renameat2 (not Linux, an old libc, a filesystem without it): the same outcomes."""
    monkeypatch.setattr(_io, "_rename2", lambda src, dst, flags: False)
    atomic_write_bytes(tmp_path / "f.bin", b"first", replace=False)
    with pytest.raises(FileExistsError, match="f.bin already exists at the commit; it was left as it is$"):
        atomic_write_bytes(tmp_path / "f.bin", b"second", replace=False)
    assert cli(capsys, "convert", model_file, hf_dir, "--to", "hf", "--force")[0] == 0
    assert sorted(os.listdir(hf_dir)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["f.bin", "hf", "m.safetensors", "old.safetensors"]
    assert (tmp_path / "f.bin").read_bytes() == b"first"


# --- an output is never an input, a link to one, inside one or holding one ----------------------------------------


def refused(relation, out, item) -> str:
    return f"the output {out} {relation} the input {item}; refused even with --force: write elsewhere\n"


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_convert_never_writes_over_its_source_or_a_link_to_it(tmp_path, model_file, capsys, link):
    dst = {"same": model_file, "symlink": tmp_path / "l.safetensors", "hardlink": tmp_path / "h.safetensors"}[link]
    if link == "symlink":
        dst.symlink_to(model_file)
    elif link == "hardlink":
        os.link(model_file, dst)
    before = tree(tmp_path)
    code, err = cli(capsys, "convert", model_file, dst, "--force")
    assert code == 2 and err == "vit-einops convert: error: " + refused("is", dst, model_file)
    assert tree(tmp_path) == before


def test_convert_never_writes_inside_its_hf_source(tmp_path, hf_dir, capsys):
    before = tree(tmp_path)
    dst = hf_dir / "model.safetensors"
    code, err = cli(capsys, "convert", hf_dir, dst, "--from", "hf", "--force")
    assert code == 2 and err == "vit-einops convert: error: " + refused("lies inside", dst, hf_dir)
    dst = hf_dir / "other.safetensors"
    code, err = cli(capsys, "convert", hf_dir, dst, "--from", "hf", "--force")
    assert code == 2 and err == "vit-einops convert: error: " + refused("lies inside", dst, hf_dir)
    assert tree(tmp_path) == before


def test_convert_to_hf_never_replaces_a_directory_holding_its_source(tmp_path, hf_dir, capsys):
    """The source is the HF directory's own weights file: replacing the directory would delete it."""
    before = tree(tmp_path)
    src = hf_dir / "model.safetensors"
    code, err = cli(capsys, "convert", src, hf_dir, "--from", "hf", "--to", "hf", "--force")
    assert code == 2 and err == "vit-einops convert: error: " + refused("holds", hf_dir, src)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("which", ["image", "model"])
def test_explore_never_writes_over_an_input(tmp_path, model_file, capsys, which):
    from PIL import Image

    image = tmp_path / "x.png"
    Image.new("L", (8, 8), 3).save(image)
    out = image if which == "image" else model_file
    before = tree(tmp_path)
    code, err = cli(capsys, "explore", model_file, "--image", image, "--out", out, "--force")
    assert code == 2 and err == "vit-einops explore: error: " + refused("is", out, out)
    assert tree(tmp_path) == before


def test_inspect_never_replaces_a_folder_holding_its_model(tmp_path, model_file, capsys):
    before = tree(tmp_path)
    code, err = cli(capsys, "inspect", model_file, "--out", tmp_path, "--force", *INSPECT)
    assert code == 2 and err == "vit-einops inspect: error: " + refused("holds", tmp_path, model_file)
    assert tree(tmp_path) == before


def test_inspect_of_a_training_run_still_writes_inside_it(tmp_path, capsys, unrendered):
    """A run directory's inputs are its model file and checkpoint, so its default report folder stays allowed."""
    run = tmp_path / "run"
    run.mkdir()
    save_vit(digits_model(), run / "model.safetensors")
    (run / "checkpoint").mkdir()
    assert cli(capsys, "inspect", run, *INSPECT)[0] == 0
    assert sorted(os.listdir(run / "inspect")) == REPORT
    code, err = cli(capsys, "inspect", run, "--out", run / "checkpoint" / "r", *INSPECT)
    assert code == 2 and err == "vit-einops inspect: error: " + refused(
        "lies inside", run / "checkpoint" / "r", run / "checkpoint"
    )


# --- a FIFO, a device or a directory is never replaced, even with --force -----------------------------------------


def test_explore_force_never_replaces_a_fifo(tmp_path, model_file, capsys):
    out = tmp_path / "e.html"
    os.mkfifo(out)
    before = tree(tmp_path)
    code, err = cli(capsys, "explore", model_file, "--out", out, "--force")
    assert code == 2
    assert err == (
        f"vit-einops explore: error: {out} is a FIFO, not a regular file; it is never replaced, even with --force\n"
    )
    assert tree(tmp_path) == before


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_explore_into_a_folder_says_what_works_with_or_without_force(tmp_path, model_file, capsys, force):
    """explore writes one page, so a folder at --out is never its own earlier output: the first message names a page
    to write instead of offering --force, which would then be refused."""
    out = tmp_path / "pages"
    out.mkdir()
    before = tree(tmp_path)
    code, err = cli(capsys, "explore", model_file, "--out", out, *force)
    assert code == 2
    assert err == (
        f"vit-einops explore: error: --out {out} is a folder; explore writes one HTML page: name it, e.g. --out "
        f"{out / 'explore.html'}\n"
    )
    assert tree(tmp_path) == before


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_fifo_at_the_output_is_refused_the_same_way_with_or_without_force(tmp_path, model_file, capsys, force):
    """Without --force the refusal does not offer --force for what --force would not replace."""
    dst = tmp_path / "dst.safetensors"
    os.mkfifo(dst)
    code, err = cli(capsys, "convert", model_file, dst, *force)
    assert code == 2
    never = "is a FIFO, not a regular file; it is never replaced, even with --force"
    assert err == f"vit-einops convert: error: {dst} {never}\n"


def test_explore_force_never_replaces_a_fifo_that_appears_while_it_runs(tmp_path, model_file, monkeypatch, capsys):
    import vit_einops.explore.page as page

    out = tmp_path / "e.html"
    appearing(monkeypatch, page, "render_page", lambda: os.mkfifo(out))
    code, err = cli(capsys, "explore", model_file, "--out", out, "--force")
    assert code == 2
    assert err == (
        f"vit-einops explore: error: {out} is a FIFO, not a regular file; it is never replaced, even with --force\n"
    )
    assert tree(tmp_path) == {"e.html": "fifo", **tree_of(model_file)}


@pytest.mark.parametrize("kind", ["fifo", "dev/null link", "directory"])
def test_the_commit_itself_refuses_what_is_not_a_regular_file(tmp_path, kind):
    path = tmp_path / "x"
    {"fifo": os.mkfifo, "dev/null link": lambda p: p.symlink_to(os.devnull), "directory": os.mkdir}[kind](path)
    before = tree(tmp_path)
    says = {"fifo": "a FIFO", "dev/null link": "a device or socket", "directory": "a directory"}[kind]
    with pytest.raises(ValueError, match=f"^{path} is {says}, not a regular file; it is never replaced"):
        atomic_write_bytes(path, b"data", replace=True)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("target", ["vit-einops", "timm"])
def test_convert_force_never_replaces_dev_null_through_a_link(tmp_path, model_file, capsys, target):
    dst = tmp_path / "null.safetensors"
    dst.symlink_to(os.devnull)
    before, null = tree(tmp_path), os.stat(os.devnull)
    code, err = cli(capsys, "convert", model_file, dst, "--to", target, "--force")
    assert code == 2
    assert err == (
        f"vit-einops convert: error: {dst} is a device or socket, not a regular file; it is never replaced, "
        "even with --force\n"
    )
    assert tree(tmp_path) == before and stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert (os.stat(os.devnull).st_ino, os.stat(os.devnull).st_dev) == (null.st_ino, null.st_dev)


def test_directory_outputs_never_replace_a_file_fifo_or_link(tmp_path, model_file, capsys):
    (tmp_path / "file").write_text("mine")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    before = tree(tmp_path)
    for name, says in [("file", "exists and is a file"), ("fifo", "exists and is a FIFO")]:
        code, err = cli(capsys, "inspect", model_file, "--out", tmp_path / name, "--force", *INSPECT)
        assert code == 2 and err == f"vit-einops inspect: error: {tmp_path / name} {says}, not a directory\n"
    code, err = cli(capsys, "convert", model_file, tmp_path / "link", "--to", "hf", "--force")
    assert code == 2
    assert err == f"vit-einops convert: error: {tmp_path / 'link'} is a symbolic link; give the directory itself\n"
    assert tree(tmp_path) == before


# --- a replaced file keeps its mode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_convert_force_keeps_the_replaced_files_mode(tmp_path, model_file, capsys, mode):
    dst = tmp_path / "dst.safetensors"
    dst.write_text("old")
    dst.chmod(mode)
    assert cli(capsys, "convert", model_file, dst, "--force")[0] == 0
    assert stat.S_IMODE(dst.stat().st_mode) == mode and digest(dst) == digest(model_file)


def test_explore_force_keeps_the_replaced_pages_mode(tmp_path, model_file, capsys):
    out = tmp_path / "e.html"
    out.write_text("old")
    out.chmod(0o600)
    assert cli(capsys, "explore", model_file, "--out", out, "--force")[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text().startswith("<!doctype html>")


def test_a_new_file_gets_the_umasks_mode(tmp_path):
    save_state_dict_file({"a": torch.ones(1)}, tmp_path / "w.pth")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "w.pth").stat().st_mode) == 0o666 & ~umask


# --- leftovers of killed runs: each command removes what its lock records, and only that ------------------------------


def temporaries(directory, name) -> list[str]:
    return sorted(p for p in os.listdir(directory) if p.startswith(f".{name}.") and not p.endswith(".lock"))


def test_explore_removes_its_killed_runs_temporary_and_nothing_named_like_one(tmp_path, model_file, capsys, one_thread):
    out = tmp_path / "e.html"
    args = ["explore", model_file, "--out", out]
    assert killed(args, 1) == -signal.SIGKILL  # its temporary written and synced, not yet renamed
    assert len(temporaries(tmp_path, "e.html")) == 1
    theirs = [".e.html.abcd1234.tmp", ".other.html.abcd1234.tmp", ".e.html.abcd1234.mine"]
    for name in theirs:
        (tmp_path / name).write_text("x")
    assert cli(capsys, *args)[0] == 0
    assert sorted(os.listdir(tmp_path)) == sorted([*theirs, "e.html", "m.safetensors"])
    assert all((tmp_path / name).read_text() == "x" for name in theirs)


def test_convert_removes_leftovers_even_when_it_refuses(tmp_path, model_file, capsys, one_thread):
    """A rerun that stops at "already exists" still removes the temporary of the run that was killed."""
    dst = tmp_path / "dst.safetensors"
    dst.write_text("old")
    assert killed(["convert", model_file, dst, "--force"], 1) == -signal.SIGKILL
    assert len(temporaries(tmp_path, "dst.safetensors")) == 1
    code, err = cli(capsys, "convert", model_file, dst)
    assert code == 2 and err == f"vit-einops convert: error: {dst} already exists; pass --force to replace it\n"
    assert sorted(os.listdir(tmp_path)) == ["dst.safetensors", "m.safetensors"] and dst.read_text() == "old"


def test_hf_and_inspect_remove_their_staging_directories(tmp_path, model_file, capsys, one_thread):
    hf = ["convert", model_file, tmp_path / "hf", "--to", "hf"]
    report = ["inspect", model_file, "--out", tmp_path / "out", *INSPECT]
    for args, name in ((hf, "hf"), (report, "out")):
        assert killed(args, 1) == -signal.SIGKILL  # one file written into the staging directory
        [staging] = temporaries(tmp_path, name)
        assert staging.endswith(".staging") and len(os.listdir(tmp_path / staging)) == 1
        assert cli(capsys, *args)[0] == 0
    assert sorted(os.listdir(tmp_path)) == ["hf", "m.safetensors", "out"]
    assert sorted(os.listdir(tmp_path / "out")) == REPORT


# --- a replaced directory keeps none of its old files, and only ever held ours -------------------------------------


def test_convert_to_hf_force_removes_the_old_directorys_other_files(tmp_path, hf_dir, model_file, capsys):
    """The new model's preprocessing has no image processor form: the old preprocessor_config.json must go, or
    the directory would pair the new weights with the old preprocessing."""
    assert cli(capsys, "convert", model_file, hf_dir, "--to", "hf", "--force")[0] == 0
    assert sorted(os.listdir(hf_dir)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["hf", "m.safetensors", "old.safetensors"]


def test_a_directory_holding_other_files_is_never_replaced(tmp_path, hf_dir, model_file, capsys):
    (hf_dir / "README.md").write_text("mine")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "attention.png").write_text("old")
    (tmp_path / "out" / "notes").mkdir()
    before = tree(tmp_path)
    code, err = cli(capsys, "convert", model_file, hf_dir, "--to", "hf", "--force")
    assert code == 2 and err == (
        f"vit-einops convert: error: {hf_dir} holds README.md, which vit-einops does not write there; it is never "
        "replaced, even with --force: choose another directory\n"
    )
    code, err = cli(capsys, "inspect", model_file, "--out", tmp_path / "out", "--force", *INSPECT)
    assert code == 2 and "out holds notes, which vit-einops does not write there" in err
    assert tree(tmp_path) == before


def test_inspect_force_replaces_an_earlier_report_whole(tmp_path, model_file, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for name in REPORT:
        (out / name).write_text("old")
    assert cli(capsys, "inspect", model_file, "--out", out, "--force", *INSPECT)[0] == 0
    assert sorted(os.listdir(out)) == REPORT and all((out / n).read_bytes() != b"old" for n in REPORT)
    assert (out / "attention.png").read_bytes() == b"figure"
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "out"]


# --- kill -9 at every write point: the whole old output or the whole new one, and no leftovers after a rerun ------


def killed(args, nth: int) -> int:
    """The command line ``args`` in a forked child that SIGKILLs itself at its ``nth`` fsync (a temporary complete,
    a staging directory written, a swap or rename done but not yet on disk); the child's exit code."""

    def child():
        real, seen = os.fsync, [0]

        def fsync(fd):
            real(fd)
            seen[0] += 1
            if seen[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

        os.fsync = fsync  # in the child only
        main([str(a) for a in args])

    return exit_code(fork(child))


def fsyncs(args) -> int:
    """How many fsyncs ``args`` makes, run here."""
    calls = [0]
    real = os.fsync

    def count(fd):
        calls[0] += 1
        real(fd)

    os.fsync = count
    try:
        assert main([str(a) for a in args]) == 0
    finally:
        os.fsync = real
    return calls[0]


def kill_everywhere(args, out, rerun, at=None):
    """Kill ``args`` at each of its fsyncs (or those in ``at``, -1 the last); after each, ``out`` must be whole: as
    before the command ("old", which may be absent) or as after it ("new"). The rerun must remove every leftover.
    Returns the outcomes seen, in order."""
    before = tree_or_none(out)
    n = fsyncs(args)
    after = tree_or_none(out)
    assert after != before
    restore(out, before)
    seen = []
    for nth in [k if k > 0 else n + 1 + k for k in at] if at else range(1, n + 1):
        assert killed(args, nth) == -signal.SIGKILL
        state = tree_or_none(out)
        assert state in (before, after), f"killed at fsync {nth} of {n}: {state}"
        seen.append("old" if state == before else "new")
        assert main([str(a) for a in rerun]) in (0, 2)
        assert not [p for p in os.listdir(Path(out).parent) if p.startswith(f".{Path(out).name}.")]
        restore(out, before)
    return seen


def tree_or_none(out):
    out = Path(out)
    if not out.exists():
        return None
    return tree(out) if out.is_dir() else {"": digest(out)}


SAVED: dict[str, bytes] = {}


def restore(out, state):
    """Put ``out`` back as ``state`` describes (its files were saved by :func:`save_old`)."""
    import shutil

    out = Path(out)
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    if state is None:
        return
    if "" in state:
        out.write_bytes(SAVED[""])
        return
    out.mkdir()
    for name in state:
        (out / name).write_bytes(SAVED[name])


def save_old(out):
    SAVED.clear()
    out = Path(out)
    if out.is_dir():
        SAVED.update({p.name: p.read_bytes() for p in out.iterdir()})
    elif out.exists():
        SAVED[""] = out.read_bytes()


def test_kill_9_during_convert_to_hf_over_an_old_directory(hf_dir, model_file, one_thread):
    """Two files and the staging directory written, synced (5 fsyncs): the old directory stays; the swap done (the
    6th syncs it): the new one is whole, and the old one, now in the staging directory's place, goes at the rerun."""
    save_old(hf_dir)
    args = ["convert", model_file, hf_dir, "--to", "hf", "--force"]
    assert kill_everywhere(args, hf_dir, args) == ["old"] * 5 + ["new"]


def test_kill_9_during_convert_to_a_file(tmp_path, model_file, one_thread):
    dst = tmp_path / "dst.safetensors"
    dst.write_text("old")
    save_old(dst)
    args = ["convert", model_file, dst, "--force"]
    assert kill_everywhere(args, dst, args) == ["old", "new"]


def test_kill_9_during_explore(tmp_path, model_file, one_thread):
    out = tmp_path / "e.html"
    save_old(out)
    args = ["explore", model_file, "--out", out]
    assert kill_everywhere(args, out, [*args, "--force"]) == ["old", "new"]


def test_kill_9_during_inspect(tmp_path, model_file, one_thread):
    """Killed as the first figure's temporary is synced in the staging directory, and after the swap."""
    out = tmp_path / "out"
    save_old(out)
    args = ["inspect", model_file, "--out", out, *INSPECT]
    assert kill_everywhere(args, out, [*args, "--force"], at=(1, -1)) == ["old", "new"]
