"""Hostile locks and leftovers: a lock never follows a link, and never truncates or removes what is not ours; what a
killed write leaves is removed by its record in the lock file, never by its name (issue 24, cases 2, 5, 8 and the
killed downloads' temporaries of 3). Each case asserts its exact outcome: the error and its message, the files
around the output hashed before and after. Killed writers are forked children (_fork), SIGKILLed mid-write.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import stat
from pathlib import Path

import pytest
from _fork import exit_code, fork
from _hostile import assert_user_error, bounded, run_cli
from test_hostile_writes import digits_model, tree

from vit_einops.base import io as _io
from vit_einops.base.io import LOCK_HEADER, atomic_write_bytes, atomic_write_chunks, output_lock, staged_directory
from vit_einops.modelfile import save_vit
from vit_einops.train.rundir import LOCK_NAME, RunDir

NOTES = b"my notes\nline two\n"
TRAIN = ["train", "--limit", "32", "--epochs", "1", "--no-progress"]  # refused before any data is read


def refused_lock(file, what) -> str:
    """The message for ``what`` at the lock path ``file``, as a regex."""
    return re.escape(
        f"{file} is {what}, where vit-einops keeps a lock file; it was left as it is: move it away, or choose "
        "another output"
    )


USERS_FILE = "a file that is not a vit-einops lock (those start 'vit-einops lock')"


@pytest.fixture
def notes(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(NOTES)
    return path


# --- a lock never follows a link --------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["a user's file", "nothing"])
def test_a_train_lock_that_is_a_symlink_is_refused_by_the_cli_and_its_target_kept(tmp_path, notes, target):
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_NAME
    lock.symlink_to(notes if target == "a user's file" else tmp_path / "absent.txt")
    before = tree(tmp_path)
    done = run_cli(*TRAIN, "--out", run)
    assert_user_error(done, refused_lock(lock, "a symbolic link"))
    assert tree(tmp_path) == before and notes.read_bytes() == NOTES
    with pytest.raises(ValueError, match=f"^{refused_lock(lock, 'a symbolic link')}$"):
        RunDir.open(run)
    assert tree(tmp_path) == before


def test_an_output_lock_that_is_a_symlink_is_refused_and_its_target_kept(tmp_path, notes):
    lock = tmp_path / ".page.html.lock"
    lock.symlink_to(notes)
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=f"^{refused_lock(lock, 'a symbolic link')}$"):
        with output_lock(tmp_path / "page.html"):
            pytest.fail("the lock was taken")
    assert tree(tmp_path) == before and notes.read_bytes() == NOTES


# --- a user's file at a lock's path is never truncated or removed -----------------------------------------------------


def test_explore_refuses_a_users_file_at_its_lock_path_and_keeps_it(tmp_path):
    model = save_vit(digits_model(), tmp_path / "m.safetensors")
    lock = tmp_path / ".page.html.lock"
    lock.write_bytes(NOTES)
    before = tree(tmp_path)
    assert_user_error(run_cli("explore", model, "--out", tmp_path / "page.html"), refused_lock(lock, USERS_FILE))
    assert tree(tmp_path) == before and lock.read_bytes() == NOTES


def test_a_download_refuses_a_users_file_at_its_lock_path_and_keeps_it(tmp_path, monkeypatch):
    from vit_einops import create_vit
    from vit_einops.pretrained import PRETRAINED

    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    lock = cache / f".{PRETRAINED['vit_b_16'].file}.lock"
    lock.write_bytes(NOTES)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", "http://127.0.0.1:9")  # never reached: the lock comes first
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=refused_lock(lock, USERS_FILE)):
        create_vit("vit_b_16", pretrained=True)
    assert tree(tmp_path) == before and lock.read_bytes() == NOTES


def test_training_refuses_a_users_file_at_the_run_lock_and_keeps_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_NAME
    lock.write_bytes(NOTES)
    before = tree(tmp_path)
    assert_user_error(run_cli(*TRAIN, "--out", run, "--overwrite"), refused_lock(lock, USERS_FILE))
    with pytest.raises(ValueError, match=f"^{refused_lock(lock, USERS_FILE)}$"):
        RunDir.open(run, overwrite=True)
    assert tree(tmp_path) == before and lock.read_bytes() == NOTES


@pytest.mark.parametrize("kind", ["a FIFO", "a directory"])
def test_a_fifo_or_directory_at_a_lock_path_is_refused_naming_it_without_hanging(tmp_path, kind):
    made = os.mkfifo if kind == "a FIFO" else os.mkdir
    made(tmp_path / ".out.lock")
    (tmp_path / "run").mkdir()
    made(tmp_path / "run" / LOCK_NAME)
    before = tree(tmp_path)
    with bounded(10):
        with pytest.raises(ValueError, match=f"^{refused_lock(tmp_path / '.out.lock', kind)}$"):
            with output_lock(tmp_path / "out"):
                pytest.fail("the lock was taken")
        with pytest.raises(ValueError, match=f"^{refused_lock(tmp_path / 'run' / LOCK_NAME, kind)}$"):
            RunDir.open(tmp_path / "run")
    assert tree(tmp_path) == before


# --- files that only look like our leftovers are never touched --------------------------------------------------------

LOOKALIKES = {  # what a killed writer of each output would leave, by its name only
    ".page.html.notes001.tmp": "file",
    ".page.html.abcdefgh.tmp": "file",
    ".report.abcdefgh.tmp": "file",
    ".report.abcdefgh.staging": "dir",
    ".report.zzzzzzzz.replaced": "dir",
}


def plant_lookalikes(directory: Path) -> None:
    for name, kind in LOOKALIKES.items():
        if kind == "dir":
            (directory / name).mkdir()
            (directory / name / "attention.png").write_bytes(NOTES)
        else:
            (directory / name).write_bytes(NOTES)


def lookalikes(root: Path) -> dict[str, str]:
    return {name: v for name, v in tree(root).items() if name.split("/")[0] in LOOKALIKES}


def test_files_named_like_our_leftovers_are_kept_through_writes_beside_them(tmp_path):
    """A report with no folder yet, beside a user's ``.report.zzzzzzzz.replaced/``: the write creates ``report`` with
    its own content, and never takes that folder for a swap a kill left halfway."""
    plant_lookalikes(tmp_path)
    before = tree(tmp_path)
    _io.write_file(tmp_path / "page.html", b"<html>")
    with staged_directory(tmp_path / "report", owned={"attention.png"}) as staging:
        (staging / "attention.png").write_bytes(b"new")
    atomic_write_bytes(tmp_path / "report.txt", b"no lock held")
    after = tree(tmp_path)
    assert {name: after[name] for name in before} == before
    assert sorted(set(after) - set(before)) == ["page.html", "report", "report.txt", "report/attention.png"]
    assert (tmp_path / "report" / "attention.png").read_bytes() == b"new"


# --- what a killed writer leaves, the next holder removes: exactly that -----------------------------------------------


def killed_in(work) -> None:
    """Run ``work(ready)`` in a forked child; once it calls ``ready()``, SIGKILL it (as a kill -9 would, mid-write)."""
    ready_r, ready_w = os.pipe()
    stall_r, stall_w = os.pipe()

    def child():
        def ready():
            os.write(ready_w, b"1")
            os.read(stall_r, 1)  # never written: the child waits here to be killed

        work(ready)
        os.write(ready_w, b"0")  # ended without reaching ready(): the test fails at once

    pid = fork(child)
    try:
        with bounded(60):
            assert os.read(ready_r, 1) == b"1", "the child ended before its write point"
    finally:
        os.kill(pid, signal.SIGKILL)
        for fd in (ready_r, ready_w, stall_r, stall_w):
            os.close(fd)
    assert exit_code(pid) == -signal.SIGKILL


def stalling(ready):
    """A download's chunks that stop coming after the first MiB."""
    yield bytes(1 << 20)
    ready()


def hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


LOCK_FORMS = {  # the path written, the lock file that records its temporary, the lock's holding
    "its own output lock": ("page.html", ".page.html.lock", lambda root: output_lock(root / "page.html")),
    "a directory's output lock (bench)": ("out/results.json", ".out.lock", lambda root: output_lock(root / "out")),
    "the training run's lock": (
        "run/checkpoint/model-0123456789abcdef.safetensors",
        f"run/{LOCK_NAME}",
        lambda root: RunDir.open(root / "run", overwrite=True),
    ),
}


@pytest.mark.parametrize("form", LOCK_FORMS)
def test_a_temporary_left_by_a_killed_write_is_removed_by_the_next_holder_and_nothing_else(tmp_path, form):
    written, lock_file, hold = LOCK_FORMS[form]
    target, lock = tmp_path / written, tmp_path / lock_file

    def work(ready):
        with hold(tmp_path):
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_chunks(target, stalling(ready))

    killed_in(work)
    [left] = [name for name in hidden(target.parent) if name.endswith(".tmp")]
    assert re.fullmatch(rf"\.{re.escape(target.name)}\.\w{{8}}\.tmp", left)
    assert (target.parent / left).stat().st_size == 1 << 20
    assert lock.read_bytes().startswith(LOCK_HEADER)  # the killed holder's: ours, so taken over
    theirs = target.parent / f".{target.name}.notes001.tmp"
    theirs.write_bytes(NOTES)
    with hold(tmp_path):
        pass
    assert hidden(target.parent) == [theirs.name] and theirs.read_bytes() == NOTES
    assert not target.exists() and not lock.exists()


def test_a_recorded_temporary_replaced_by_a_users_file_is_kept(tmp_path):
    """The record names an inode: a file put at the temporary's name since the kill is someone else's."""
    target = tmp_path / "page.html"

    def work(ready):
        with output_lock(target):
            atomic_write_chunks(target, stalling(ready))

    killed_in(work)
    [left] = [name for name in hidden(tmp_path) if name.endswith(".tmp")]
    (tmp_path / left).rename(tmp_path / "moved")  # still there, so the new file gets another inode
    (tmp_path / left).write_bytes(NOTES)
    with output_lock(target):
        pass
    assert hidden(tmp_path) == [left] and (tmp_path / left).read_bytes() == NOTES
    assert (tmp_path / "moved").stat().st_size == 1 << 20


def test_a_staging_directory_left_by_a_killed_write_is_removed_by_the_next_holder_and_nothing_else(tmp_path):
    report = tmp_path / "report"

    def work(ready):
        with staged_directory(report, owned={"attention.png"}) as staging:
            (staging / "attention.png").write_bytes(b"half")
            ready()

    killed_in(work)
    [left] = [name for name in hidden(tmp_path) if name.endswith(".staging")]
    assert os.listdir(tmp_path / left) == ["attention.png"]
    plant_lookalikes(tmp_path)
    planted = lookalikes(tmp_path)
    with output_lock(report):
        pass
    assert hidden(tmp_path) == sorted(LOOKALIKES) and lookalikes(tmp_path) == planted
    assert not report.exists()


def old_report(tmp_path) -> Path:
    report = tmp_path / "report"
    report.mkdir()
    (report / "attention.png").write_bytes(b"old")
    (report / "arrays.npz").write_bytes(b"old arrays")
    return report


@pytest.mark.parametrize("renames", [1, 2], ids=["old set aside", "new moved in"])
def test_a_swap_killed_with_the_old_directory_set_aside_is_undone_or_finished_by_the_next_holder(tmp_path, renames):
    """Where the system has no exchanging rename, the old directory is renamed aside, then the new one moved in.
    Killed after the first rename, the next holder puts the old one back, whole; after the second, it removes it."""
    report = old_report(tmp_path)
    old = tree(report)

    def work(ready):
        _io._rename2 = lambda src, dst, flags: False  # in the child only
        real, seen = os.rename, [0]

        def rename(src, dst):
            real(src, dst)
            seen[0] += 1
            if seen[0] == renames:
                ready()

        os.rename = rename
        with staged_directory(report, owned={"attention.png", "arrays.npz"}, replace=True) as staging:
            (staging / "attention.png").write_bytes(b"new")

    killed_in(work)
    if renames == 1:
        assert not report.exists()
        [aside] = [name for name in hidden(tmp_path) if name.endswith(".replaced")]
        assert tree(tmp_path / aside) == old
    plant_lookalikes(tmp_path)
    planted = lookalikes(tmp_path)
    with output_lock(report):
        pass
    if renames == 1:
        assert tree(report) == old
    else:
        assert os.listdir(report) == ["attention.png"] and (report / "attention.png").read_bytes() == b"new"
    assert hidden(tmp_path) == sorted(LOOKALIKES) and lookalikes(tmp_path) == planted


def test_a_swap_killed_after_the_exchange_leaves_the_old_directory_for_the_next_holder_to_remove(tmp_path):
    report = old_report(tmp_path)

    def work(ready):
        real = _io._rename2

        def rename2(src, dst, flags):
            done = real(src, dst, flags)
            if flags == _io._EXCHANGE:
                ready()
            return done

        _io._rename2 = rename2  # in the child only
        with staged_directory(report, owned={"attention.png", "arrays.npz"}, replace=True) as staging:
            (staging / "attention.png").write_bytes(b"new")

    killed_in(work)
    [left] = [name for name in hidden(tmp_path) if name.endswith(".staging")]
    assert (tmp_path / left / "arrays.npz").read_bytes() == b"old arrays"  # the old directory, under the new name
    with output_lock(report):
        pass
    assert hidden(tmp_path) == [] and os.listdir(report) == ["attention.png"]


# --- a killed holder's lock file is taken over ------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["output lock", "run lock"])
def test_a_killed_holders_lock_file_is_taken_over_by_the_next(tmp_path, which):
    if which == "output lock":
        lock, hold = tmp_path / ".page.html.lock", lambda: output_lock(tmp_path / "page.html")
    else:
        lock, hold = tmp_path / "run" / LOCK_NAME, lambda: RunDir.open(tmp_path / "run")

    def work(ready):
        with hold():
            ready()

    killed_in(work)
    content = lock.read_bytes()
    assert content.startswith(LOCK_HEADER) and json.loads(content.splitlines()[1])["pid"] > 0
    with hold():
        assert json.loads(lock.read_bytes().splitlines()[1]) == {"pid": os.getpid()}
    assert not lock.exists()


# --- a lock file of ours planted with records never reaches outside its directory -------------------------------------


def test_a_planted_lock_file_cannot_send_cleanup_outside_its_directory(tmp_path, notes):
    """A folder received from someone else may hold a lock file in our format: its records name entries by path and
    inode, and only entries inside the lock's own directory, reached through no link, are ever removed."""
    out = tmp_path / "shared"
    out.mkdir()
    (out / "link").symlink_to(tmp_path, target_is_directory=True)
    info = os.lstat(notes)
    lines = [
        {"path": where, "kind": "file", "dev": info.st_dev, "ino": info.st_ino}
        for where in ("../notes.txt", "link/notes.txt", str(notes), "./../notes.txt")
    ]
    lock = out / ".page.html.lock"
    lock.write_bytes(LOCK_HEADER + b'{"pid": 1}\n' + "".join(json.dumps(line) + "\n" for line in lines).encode())
    with output_lock(out / "page.html"):
        pass
    assert notes.read_bytes() == NOTES and sorted(os.listdir(out)) == ["link"]


# --- a lock file or an entry of another user is never acted on --------------------------------------------------------


def forged_lock(lock: Path, *entries: Path, restore: Path | None = None) -> None:
    """A lock file in our format recording ``entries`` (their real device and inode, which anyone who can list the
    folder reads), as another user of a shared folder could plant it."""
    lines = []
    for entry in entries:
        info = os.lstat(entry)
        line = {"path": entry.name, "kind": "dir" if entry.is_dir() else "file", "dev": info.st_dev, "ino": info.st_ino}
        if restore is not None:
            line["restore"] = restore.name
        lines.append(json.dumps(line) + "\n")
    lock.write_bytes(LOCK_HEADER + b'{"pid": 1}\n' + "".join(lines).encode())


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "main.py").write_bytes(NOTES)
    return folder


def another_users_lock(lock) -> str:
    """The message for a lock file owned by the user running the tests, while the process runs as uid 4242."""
    uid = os.lstat(lock).st_uid
    owner = f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    return refused_lock(lock, f"a file owned by {owner}, not by you (a lock file must be yours)")


def test_explore_refuses_a_lock_file_of_another_user_and_keeps_what_it_records(tmp_path, notes, monkeypatch):
    """In a shared folder (/tmp, a group's), another user may plant ``.page.html.lock`` in our format, recording a
    file of ours: the lock is not taken over, and nothing it records is removed."""
    model = save_vit(digits_model(), tmp_path / "m.safetensors")
    lock = tmp_path / ".page.html.lock"
    forged_lock(lock, notes)
    before = tree(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # we run as uid 4242; the lock is the test user's
    done = run_cli("explore", model, "--out", tmp_path / "page.html")
    assert_user_error(done, another_users_lock(lock))
    assert tree(tmp_path) == before and notes.read_bytes() == NOTES


def test_a_staged_directory_refuses_a_lock_file_of_another_user_and_keeps_the_folder_it_records(
    tmp_path, project, monkeypatch
):
    lock = tmp_path / ".hf.lock"
    forged_lock(lock, project, restore=tmp_path / "hf")
    before = tree(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with pytest.raises(ValueError, match=f"^{another_users_lock(lock)}$"):
        with staged_directory(tmp_path / "hf", owned={"config.json"}):
            pytest.fail("the lock was taken")
    assert tree(tmp_path) == before


def test_records_of_our_own_lock_naming_entries_we_never_leave_are_not_acted_on(tmp_path, notes, project):
    """A lock file of ours whose records name a user's file and folder by their inode (edited, or left from another
    target's write): those names are not what a write of the lock's target leaves, so they are kept, byte for byte,
    and the writes go ahead."""
    forged_lock(tmp_path / ".page.html.lock", notes)
    forged_lock(tmp_path / ".hf.lock", project, restore=tmp_path / "hf")
    other = tmp_path / ".other.html.abcdefgh.tmp"  # our writers' name, but for another target
    other.write_bytes(NOTES)
    forged_lock(tmp_path / ".report.html.lock", other)
    before = tree(tmp_path)
    _io.write_file(tmp_path / "page.html", b"<html>")
    _io.write_file(tmp_path / "report.html", b"<html>")
    with staged_directory(tmp_path / "hf", owned={"config.json"}) as staging:
        (staging / "config.json").write_bytes(b"{}")
    after = tree(tmp_path)
    locks = {".page.html.lock", ".hf.lock", ".report.html.lock"}
    assert {name: after[name] for name in set(before) - locks} == {name: before[name] for name in set(before) - locks}
    assert sorted(set(after) - set(before)) == ["hf", "hf/config.json", "page.html", "report.html"]
    assert not locks & set(after)  # taken over, their records dropped, removed at release


def test_a_recorded_leftover_owned_by_another_user_is_kept(tmp_path):
    """An entry named as our temporaries are, with the recorded inode, but another user's: kept. (chown: the tests
    run as root.)"""
    planted = tmp_path / ".page.html.abcdefgh.tmp"
    planted.write_bytes(NOTES)
    os.chown(planted, 4242, 4242)
    forged_lock(tmp_path / ".page.html.lock", planted)
    _io.write_file(tmp_path / "page.html", b"<html>")
    assert planted.read_bytes() == NOTES and os.lstat(planted).st_uid == 4242
    assert sorted(os.listdir(tmp_path)) == [".page.html.abcdefgh.tmp", "page.html"]


# --- a folder written whole gets the permissions a plain mkdir gives --------------------------------------------------


def test_a_staged_directory_gets_the_mode_mkdir_would_give():
    mask = os.umask(0o022)
    try:
        with staged_directory(Path("report"), owned={"attention.png"}) as staging:
            (staging / "attention.png").write_bytes(b"png")
        os.umask(0o027)
        with staged_directory(Path("other"), owned={"attention.png"}) as staging:
            (staging / "attention.png").write_bytes(b"png")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(os.lstat("report").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat("other").st_mode) == 0o750
