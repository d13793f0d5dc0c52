"""Crash-safe file writes, shared by checkpoints, weight exports, metrics, figures and benchmark results.

Every check that decides whether a write may go ahead is made again at its commit, on what is there at that moment:
a file is created with a rename that never replaces (``renameat2(RENAME_NOREPLACE)``, else an exclusive hard link),
and replaced only if what is there just before the rename is a regular file. A folder of outputs is written into
a staging directory beside its target and swapped in whole, a swap undone if what it took out was not ours.
Outputs of a command are written under a lock beside them, so a second writer fails at once, naming the first.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# atomic_write_bytes's temporaries: "." + the target's name + "." + mkstemp's 8 random characters + ".tmp".
_TEMP = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")
# What a killed write leaves beside its target: a temporary file, a staging directory (new content, or the old
# content after the swap), or the old directory set aside where the system has no exchanging rename.
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.(?P<kind>tmp|staging|replaced)")

# renameat2 flags (linux/fs.h) and AT_FDCWD (fcntl.h): create without replacing; swap two existing paths.
_NOREPLACE, _EXCHANGE, _AT_FDCWD = 1, 2, -100

# Lock files this process holds, with how many nested users each has: a command locks its output for the whole
# run and the library function it calls locks it again at the commit (flock would refuse the second open).
_HELD: dict[str, int] = {}


def atomic_write_bytes(path: str | Path, data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    ``replace=False``: ``path`` is created, never replaced; if anything is there at the commit (even a file that
    appeared while the data was written), FileExistsError and nothing changes. ``replace=True`` replaces only a
    regular file, keeping its permission bits; a FIFO, device, socket or directory there (or a link to one),
    checked just before the rename, is a ValueError and stays as it was.
    """
    atomic_write_chunks(path, (data,), replace=replace)


def atomic_write_chunks(
    path: str | Path, chunks: Iterable[bytes], check: Callable[[], None] | None = None, *, replace: bool = True
) -> None:
    """Write the concatenated ``chunks`` to ``path`` as :func:`atomic_write_bytes` does, streaming (a download need
    not fit in memory). ``check`` runs once every chunk is on disk and before the commit: if it raises (a hash or
    length that does not match), the temporary is deleted and ``path`` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # matches _TEMP
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check()
        if replace:
            _replace_file(tmp, path)
        else:
            _create(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _create(tmp: str | Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``, failing if anything is at ``path`` at that moment."""
    try:
        if not _rename2(tmp, path, _NOREPLACE):
            os.link(tmp, path)  # fails if path exists; then the temporary goes
            os.unlink(tmp)
    except FileExistsError:
        raise FileExistsError(f"{path} already exists at the commit; it was left as it is") from None


def _replace_file(tmp: str, path: Path) -> None:
    try:
        info = os.stat(path)  # through a symlink: a link to /dev/null is refused like /dev/null
    except FileNotFoundError:
        pass  # nothing there (or a dangling link, which the file replaces)
    else:
        _refuse_special(path, info.st_mode)
        os.chmod(tmp, stat.S_IMODE(info.st_mode))  # a 0600 file stays 0600
    # Checked just before: the rename itself cannot refuse a kind (a swap that checks after, as directories get
    # with RENAME_EXCHANGE, would hide the checkpoint writes' rename from the kill tests that stop at it).
    os.replace(tmp, path)


def _refuse_special(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is {_kind(mode)}, not a regular file; it is never replaced, even with --force")


@functools.cache
def _renameat2():
    """libc's renameat2 (Linux, glibc 2.28+), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _rename2(src: str | Path, dst: str | Path, flags: int) -> bool:
    """renameat2(src, dst, flags): True once done, False where the system or filesystem lacks it; OSError else."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def write_file(path: str | Path, data: bytes, *, replace: bool = False) -> Path:
    """Write one output file of a command, under its lock (:func:`output_lock`, which also removes what killed
    writes of it left), with :func:`atomic_write_bytes`'s checks at the commit. Returns the path."""
    path = Path(path)
    with output_lock(path):
        atomic_write_bytes(path, data, replace=replace)
    return path


@contextmanager
def staged_directory(path: str | Path, *, owned: Collection[str], replace: bool = False) -> Iterator[Path]:
    """A directory of outputs, written as one unit: yields an empty staging directory beside ``path`` to write the
    files into; when the block ends without an error, the staging directory becomes ``path`` in one swap. A kill at
    any point leaves the whole old content or the whole new one, and none of the old files stays beside the new.

    ``path`` may be absent, or a directory that holds nothing but names from ``owned`` (what this writer writes);
    one that holds anything else is never replaced (ValueError naming it), and a non-empty one only with
    ``replace``. Checked before the block and again on what the swap took out (a swap that took out anything else
    is undone). Parent directories are created.
    """
    path = Path(path)
    with output_lock(path, parents=True):
        _check_directory(path, owned, replace)
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".staging"))
        try:
            yield staging
            for entry in staging.iterdir():
                if entry.name not in owned:
                    raise ValueError(f"{entry.name!r} was written into {path}, which takes only {sorted(owned)}")
            _fsync_dir(staging)
            _commit_directory(staging, path, owned, replace)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # the new content on failure, the old after a swap


def check_directory_output(path: str | Path, owned: Collection[str], replace: bool) -> None:
    """What :func:`staged_directory` checks before its block, for a command to check before its work."""
    _check_directory(Path(path), owned, replace)


def _check_directory(path: Path, owned: Collection[str], replace: bool) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise ValueError(f"{path} is a symbolic link; give the directory itself")
    if not stat.S_ISDIR(mode):
        raise ValueError(f"{path} exists and is {_kind(mode)}, not a directory")
    names = sorted(entry.name for entry in os.scandir(path))
    if names and not replace:
        raise FileExistsError(f"{path} already holds {', '.join(names)}; pass --force to replace them")
    foreign = [name for name in names if name not in owned or not os.path.isfile(path / name)]
    if foreign:
        raise ValueError(
            f"{path} holds {', '.join(foreign)}, which vit-einops does not write there; it is never replaced, "
            f"even with --force: choose another directory"
        )


def _commit_directory(staging: Path, path: Path, owned: Collection[str], replace: bool) -> None:
    while True:
        if not os.path.lexists(path):
            try:
                if not _rename2(staging, path, _NOREPLACE):
                    os.rename(staging, path)  # no atomic no-replace here: fails on a non-empty directory at path
            except (FileExistsError, OSError) as err:
                if os.path.lexists(path):
                    continue  # appeared meanwhile: check what it is
                raise err
            break
        _check_directory(path, owned, replace)
        if _rename2(staging, path, _EXCHANGE):
            try:  # staging now holds what was at path at the moment of the swap
                _check_directory(staging, owned, replace)
            except (ValueError, FileExistsError) as err:
                _rename2(staging, path, _EXCHANGE)  # put it back
                raise type(err)(str(err).replace(str(staging), str(path))) from None
        else:  # set the old one aside, move the new in: a kill between leaves it aside (remove_leftovers restores it)
            aside = tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".replaced")
            os.rename(path, aside)
            os.rename(staging, path)
            shutil.rmtree(aside)
        break
    _fsync_dir(path.parent)


def remove_leftovers(path: str | Path) -> list[Path]:
    """Remove what killed writes of ``path`` left beside it (temporaries, staging directories); returns them.

    Only names our writers give (``.NAME.xxxxxxxx.tmp`` / ``.staging`` / ``.replaced``) for this very ``path`` are
    touched. A directory set aside by a swap that was killed halfway is put back if ``path`` is missing. Call it
    under :func:`output_lock`, so that no live writer of ours is using them.
    """
    path = Path(path)
    removed = []
    if not path.parent.is_dir():
        return removed
    for entry in sorted(path.parent.iterdir()):
        match = _LEFTOVER.fullmatch(entry.name)
        if match is None or match["name"] != path.name or entry.is_symlink():
            continue
        if match["kind"] == "replaced" and not os.path.lexists(path):
            os.rename(entry, path)
        elif match["kind"] == "tmp" and entry.is_file():
            entry.unlink()
            removed.append(entry)
        elif match["kind"] != "tmp" and entry.is_dir():
            shutil.rmtree(entry)
            removed.append(entry)
    return removed


@contextmanager
def output_lock(path: str | Path, *, parents: bool = False) -> Iterator[None]:
    """Hold the lock of the output ``path`` (an flock on ``.NAME.lock`` beside it, holding the holder's pid), and
    once it is taken, remove what killed writes of ``path`` left (:func:`remove_leftovers`): no writer of ours is
    using them then.

    A second process that asks for it gets BlockingIOError naming the holder, at once; the same process may nest
    it. ``parents`` creates the directories above ``path``; otherwise a missing one is a FileNotFoundError.
    """
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise FileNotFoundError(f"the directory {path.parent} does not exist")
    lock = path.parent / f".{path.name}.lock"
    key = os.path.abspath(lock)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    fd = _acquire(lock, path)
    _HELD[key] = 1
    try:
        remove_leftovers(path)
        yield
    finally:
        del _HELD[key]
        if fd is not None:
            Path(lock).unlink(missing_ok=True)  # while still locked: a waiter that opened it retries (_acquire)
            os.close(fd)


def _acquire(lock: Path, path: Path) -> int | None:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the commit's own checks still hold
        return None
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        fd = os.open(lock, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise BlockingIOError(
                f"{path} is being written by another vit-einops process (pid {holder}, lock {lock}); "
                f"wait for it to finish, or choose another output"
            ) from None
        try:
            current = os.stat(lock).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(fd).st_ino:  # its holder removed it as we opened it: take the new one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd


def check_output(path: str | Path, inputs: Iterable[str | Path]) -> None:
    """ValueError if the output ``path`` is one of the command's ``inputs``, a link to one (symbolic or hard),
    lies inside one, or holds one: whatever the flags, a command never writes over what it reads.

    Paths are compared by device and inode, along their real (symlink-resolved) parent chains.
    """
    out = Path(path)
    out_id, out_above = _identity(out), _parents(out)
    for item in inputs:
        item_id = _identity(Path(item))
        if item_id is None:
            continue
        if item_id == out_id:
            relation = "is"
        elif item_id in out_above:
            relation = "lies inside"
        elif out_id is not None and out_id in _parents(Path(item)):
            relation = "holds"
        else:
            continue
        raise ValueError(f"the output {out} {relation} the input {item}; refused even with --force: write elsewhere")


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what ``path`` names, through links; None if nothing."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _parents(path: Path) -> list[tuple[int, int]]:
    """The identities of the real directories above ``path`` (its links resolved)."""
    return [i for i in map(_identity, path.resolve().parents) if i is not None]


def read_regular_file(path: str | Path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path``, refusing (ValueError) anything but a regular file, or one over ``max_bytes``.

    Opened non-blocking and checked on the open descriptor, so a FIFO in a file's place is refused at once instead
    of waiting forever for a writer, and a file swapped between the check and the read cannot slip through.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{str(path)!r} is {_kind(info.st_mode)}, not a regular file")
        if max_bytes is not None and info.st_size > max_bytes:
            raise ValueError(f"{str(path)!r} is {info.st_size:,} bytes, over the {max_bytes:,} this file type may hold")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()


def sha256_of(f: BinaryIO) -> str:
    """The SHA-256 hex digest of what is left to read in the open binary file ``f``, read in 1 MiB chunks (a weights
    file need not fit in memory)."""
    digest = hashlib.sha256()
    while chunk := f.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def temp_target(name: str) -> str | None:
    """The file name whose temporary ``name`` would be while :func:`atomic_write_bytes` writes it, else None."""
    match = _TEMP.fullmatch(name)
    return match["name"] if match else None


def remove_orphan_temps(directory: str | Path, names: re.Pattern[str]) -> list[Path]:
    """Delete the temporaries that :func:`atomic_write_bytes` leaves when killed mid-write, for targets whose
    name fully matches ``names``; returns what was deleted.

    Only regular files named like our temporaries of those targets are touched, so a caller that passes the
    names it writes never deletes a file it did not write. Call it only while no writer of ours is active there.
    """
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        target = temp_target(entry.name)
        if target is not None and names.fullmatch(target) and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    # The rename itself is durable only once the directory entry is on disk (POSIX; Windows has no dir fds).
    if os.name == "posix":
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` as a Path, after checking it names a regular file: FileNotFoundError if missing, ValueError for a
    directory, FIFO, socket or device (reading a FIFO would block until some other process writes to it)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: {_kind(mode)}; expected a {what}")
    return path


def _kind(mode: int) -> str:
    """What a path is, for error messages."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISREG, "a file"))
    return next((name for test, name in kinds if test(mode)), "a device or socket")


def check_file_output(path: str | os.PathLike, replace: bool, hint: str) -> None:
    """Before the work, what the commit will check: without ``replace``, :func:`refuse_existing`; with it, a
    ValueError for a FIFO, device, socket or directory at ``path`` (or a link to one), which is never replaced."""
    if not replace:
        refuse_existing(path, hint)
        return
    try:
        _refuse_special(Path(path), os.stat(path).st_mode)
    except FileNotFoundError:
        pass


def refuse_existing(path: str | os.PathLike, hint: str) -> None:
    """FileExistsError if ``path`` exists (a dangling symlink counts): outputs never replace a user's file unasked."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} already exists; {hint}")
