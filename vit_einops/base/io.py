"""Crash-safe file writes, shared by checkpoints, weight exports, metrics, figures and benchmark results.

Every check that decides whether a write may go ahead is made again at its commit, on what is there at that moment:
a file is created with a rename that never replaces (``renameat2(RENAME_NOREPLACE)``, else an exclusive hard link),
and replaced only if what is there just before the rename is a regular file. A folder of outputs is written into
a staging directory beside its target and swapped in whole, a swap undone if what it took out was not ours.

Outputs of a command are written under a lock (:class:`LockFile`: a file of ours beside them, or in a training run's
directory), so a second writer fails at once, naming the first. What a write under a lock may leave when killed (a
temporary, a staging directory, a directory set aside) is recorded in that lock file before it can be left, and the
next holder removes exactly those entries: nothing is ever removed, truncated or replaced for its name alone, and
nothing for a lock file or an entry that another user owns.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from .text import printable

# renameat2 flags (linux/fs.h) and AT_FDCWD (fcntl.h): create without replacing; swap two existing paths.
_NOREPLACE, _EXCHANGE, _AT_FDCWD = 1, 2, -100

# The first line of every lock file of ours. A file at a lock's path that starts otherwise is not ours: it is never
# written, truncated or removed.
LOCK_HEADER = b"vit-einops lock\n"
_MAX_LOCK_BYTES = 1 << 20  # a lock file holds a line per entry in progress: a few hundred bytes; larger is not ours


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
    length that does not match), the temporary is deleted and ``path`` is left as it was.

    The temporary (``.NAME.<random>.tmp`` beside ``path``) is recorded in the lock this process holds over ``path``
    (its :func:`output_lock`, or a :class:`LockFile` over a directory above it, as a training run's), so that a kill
    leaves it to the next holder to remove. Written under no lock, a temporary is still removed on any exception,
    but one a kill left stays until removed by hand.
    """
    path = Path(path)
    lock = _covering(path)
    fd, tmp = tempfile.mkstemp(**_leftover(path, ".tmp"))
    forget = _nothing
    try:
        with os.fdopen(fd, "wb") as f:
            forget = _record(lock, Path(tmp), os.fstat(fd))
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
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
    finally:
        forget()  # after the commit or the unlink: until then a kill leaves the record
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
        raise ValueError(f"{path} is {kind_of(mode)}, not a regular file; it is never replaced, even with --force")


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


# What a write of a target NAME may leave beside it: ".NAME.<tempfile's random part>" and one of these suffixes.
_LEFTOVER_SUFFIXES = (".tmp", ".staging", ".replaced")


def _leftover(target: Path, suffix: str) -> dict[str, Any]:
    """tempfile's arguments (``dir``, ``prefix``, ``suffix``) for an entry a write of ``target`` makes beside it."""
    return {"dir": target.parent, "prefix": f".{target.name}.", "suffix": suffix}


def _target_of(entry: Path) -> Path | None:
    """The target whose write makes an entry of ``entry``'s name (as :func:`_leftover` names it), else None."""
    for suffix in _LEFTOVER_SUFFIXES:
        stem, _, random = entry.name.removesuffix(suffix).rpartition(".")  # tempfile's random part has no "."
        if not (random and stem.startswith(".") and len(stem) > 1):
            continue
        target = entry.parent / stem[1:]
        made = _leftover(target, suffix)
        if made["prefix"] + random + made["suffix"] == entry.name:
            return target
    return None


def write_file(path: str | Path, data: bytes, *, replace: bool = False) -> Path:
    """Write one output file of a command, under its lock (:func:`output_lock`, whose taking removes what killed
    writes of it left), with :func:`atomic_write_bytes`'s checks at the commit. Returns the path."""
    path = Path(path)
    with output_lock(path):
        atomic_write_bytes(path, data, replace=replace)
    return path


@contextmanager
def staged_directory(path: str | Path, *, owned: Collection[str], replace: bool = False) -> Iterator[Path]:
    """A directory of outputs, written as one unit: yields an empty staging directory beside ``path`` to write the
    files into; when the block ends without an error, the staging directory becomes ``path`` in one swap. A kill at
    any point leaves the whole old content or the whole new one, and none of the old files stays beside the new;
    what it leaves beside ``path`` (the staging directory, the old directory set aside) is recorded in the lock of
    ``path``, so that the next writer of ``path`` removes it, or puts the old directory back if ``path`` is missing.

    ``path`` may be absent, or a directory that holds nothing but names from ``owned`` (what this writer writes);
    one that holds anything else is never replaced (ValueError naming it), and a non-empty one only with
    ``replace``. Checked before the block and again on what the swap took out (a swap that took out anything else
    is undone). Parent directories are created.
    """
    path = Path(path)
    with output_lock(path, parents=True):
        _check_directory(path, owned, replace)
        lock = _covering(path)
        staging = Path(tempfile.mkdtemp(**_leftover(path, ".staging")))
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; give the folder the permissions mkdir would
        forgets: list[Callable[[], None]] = []
        try:
            forgets.append(_record(lock, staging))
            yield staging
            for entry in staging.iterdir():
                if entry.name not in owned:
                    raise ValueError(f"{entry.name!r} was written into {path}, which takes only {sorted(owned)}")
            _fsync_dir(staging)
            _commit_directory(staging, path, owned, replace, lock, forgets)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # the new content on failure, the old after a swap
            for forget in forgets:
                forget()


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
        raise ValueError(f"{path} exists and is {kind_of(mode)}, not a directory")
    names = sorted(entry.name for entry in os.scandir(path))
    if names and not replace:
        raise FileExistsError(f"{path} already holds {', '.join(names)}; pass --force to replace them")
    foreign = [name for name in names if name not in owned or not os.path.isfile(path / name)]
    if foreign:
        raise ValueError(
            f"{path} holds {', '.join(foreign)}, which vit-einops does not write there; it is never replaced, "
            f"even with --force: choose another directory"
        )


def _commit_directory(
    staging: Path,
    path: Path,
    owned: Collection[str],
    replace: bool,
    lock: LockFile | None,
    forgets: list[Callable[[], None]],
) -> None:
    """Move ``staging`` to ``path``; each entry this leaves beside ``path`` until the caller's cleanup is recorded in
    ``lock`` first, and its forgetting added to ``forgets``."""
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
        old = os.lstat(path)
        forgets.append(_record(lock, staging, old))  # after the swap, the staging name holds the old directory
        if _rename2(staging, path, _EXCHANGE):
            try:  # staging now holds what was at path at the moment of the swap
                _check_directory(staging, owned, replace)
            except (ValueError, FileExistsError) as err:
                _rename2(staging, path, _EXCHANGE)  # put it back
                raise type(err)(str(err).replace(str(staging), str(path))) from None
        else:  # set the old one aside, move the new in: a kill between leaves it aside, to be put back
            aside = Path(tempfile.mkdtemp(**_leftover(path, ".replaced")))
            forgets.append(_record(lock, aside))  # the empty directory that holds the name
            forgets.append(_record(lock, aside, old, restore=path))
            os.rename(path, aside)
            os.rename(staging, path)
            shutil.rmtree(aside)
        break
    _fsync_dir(path.parent)


@contextmanager
def output_lock(path: str | Path, *, parents: bool = False) -> Iterator[None]:
    """Hold the lock of the output ``path``: a :class:`LockFile` ``.NAME.lock`` beside it, covering ``path`` and,
    for a directory, what lies inside. Taking it removes what killed writes under it left (their record is in it).

    A second process that asks for it gets BlockingIOError naming the holder, at once; the same process may nest
    it. A link, FIFO, device or directory at the lock's path, or a file that is not a lock of ours, is a ValueError
    naming it, and stays as it was. ``parents`` creates the directories above ``path``; otherwise a missing one is a
    FileNotFoundError.
    """
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise FileNotFoundError(f"the directory {path.parent} does not exist")
    file = path.parent / f".{path.name}.lock"
    if any(lock.file == os.path.abspath(file) for lock in _HELD):
        yield  # nested in this process: the outer use holds it, and releases it
        return

    def busy(holder: str) -> OSError:
        return BlockingIOError(
            f"{path} is being written by another vit-einops process (pid {holder}, lock {file}); "
            f"wait for it to finish, or choose another output"
        )

    lock = LockFile.take(file, path, busy)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


# --- locks and what they record -------------------------------------------------------------------------------------

# The locks this process holds, latest last: a write finds the one covering its target here (_covering).
_HELD: list[LockFile] = []


class LockFile:
    """An exclusive ``flock`` on a lock file of ours, and the record of what writes under it may leave when killed.

    The file starts with :data:`LOCK_HEADER`, then one JSON line naming the holder (``{"pid": N}``), then one for
    each entry a write under the lock has created and not yet committed or removed: a temporary file, a staging
    directory, an old directory set aside by a swap. A line gives the entry's path relative to the lock file's
    directory, its kind, device and inode, and for a set-aside directory the path it is put back at. It is written
    before the entry could be left behind (a kill keeps what a process wrote; a power cut may lose the latest line):
    the next holder removes (or puts back) exactly the recorded entries still there with that inode, and nothing
    else. A kill in the few system calls between creating an empty temporary and recording it leaves that one.

    The lock covers ``covers`` (a file or a directory) and what lies inside it: :func:`atomic_write_chunks` and
    :func:`staged_directory` record their temporaries in the lock this process holds over their target.
    The lock file is opened without following a link and without blocking, and judged on the open descriptor: a
    link, FIFO, device or directory is refused (ValueError naming it), and so is a regular file owned by another
    user (whose records, in a shared folder, could name any entry of ours), or one that is not empty and does not
    start with :data:`LOCK_HEADER` (a user's file; an empty one is a lock whose holder was killed as it created it).
    Neither is changed. A record is acted on only for an entry owned by this process's user and named as the
    writers name what they leave of the lock's target (:func:`_leftover`). A lock file left by a killed holder is
    taken over; at release the file is removed if its path still names it. On Windows (no ``flock``) nothing is
    locked or recorded.
    """

    def __init__(self, file: Path, covers: Path, fd: int) -> None:
        self.file = os.path.abspath(file)
        self.covers = os.path.realpath(covers)
        self.directory = os.path.realpath(file.parent)
        self._fd = fd
        self._identity = _identity_of(os.fstat(fd))
        self._entries: list[dict[str, Any]] = []
        self._size = os.fstat(fd).st_size

    @classmethod
    def take(cls, file: str | Path, covers: str | Path, busy: Callable[[str], OSError]) -> LockFile | None:
        """Take the lock file ``file`` for writes to ``covers``, remove what killed holders recorded, and return it;
        ``busy(pid)`` is raised at once if another holder has it (pid "unknown" if it is not yet written)."""
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the commit's own checks still hold
            return None
        file = Path(file)
        while True:
            fd = _open_lock(file, create=True)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise busy(_holder(_lock_content(fd, file))) from None
                try:
                    current = _identity_of(os.lstat(file))
                except FileNotFoundError:
                    current = None
                if current == _identity_of(os.fstat(fd)):
                    lock = cls(file, covers, fd)
                    lock._entries = _entries(_lock_content(fd, file))
                    lock._write()  # this process named as the holder, the killed holders' records kept until removed
                    lock._clean()
                    _HELD.append(lock)
                    return lock
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # its holder removed it as we opened it: take the new one

    def record(self, entry: Path, info: os.stat_result, restore: Path | None = None) -> Callable[[], None]:
        """Record ``entry`` (whose stat is ``info``; ``restore``: where to put it back if that is missing), and return
        what forgets it. An entry outside the lock file's directory is not recorded."""
        where = self._relative(entry)
        if where is None:
            return _nothing
        line: dict[str, Any] = {"path": where, "kind": "dir" if stat.S_ISDIR(info.st_mode) else "file"}
        line.update(dev=info.st_dev, ino=info.st_ino)
        if restore is not None and (back := self._relative(restore)) is not None:
            line["restore"] = back
        self._entries.append(line)
        self._write()

        def forget() -> None:
            self._entries = [e for e in self._entries if e is not line]
            self._write()

        return forget

    def release(self) -> None:
        """Remove what is still recorded, then the lock file (if its path still names it), and unlock."""
        _HELD.remove(self)
        try:
            self._clean()
            try:
                current = _identity_of(os.lstat(self.file))
            except FileNotFoundError:
                current = None
            if current == self._identity and not self._entries:  # what could not be removed stays recorded
                os.unlink(self.file)  # while still locked: a waiter that opened it retries (take)
        finally:
            os.close(self._fd)

    def _clean(self) -> None:
        """Remove (or put back) each recorded entry still there as recorded; those that fail stay recorded."""
        kept = []
        for line in self._entries:
            try:
                _remove_recorded(self.directory, self.covers, line)
            except OSError:
                kept.append(line)
        self._entries = kept
        self._write()

    def _write(self) -> None:
        """The lock file's content: the header, the holder, the entries. Written over the old content in one write,
        padded with blank lines to its length, then cut: a kill between leaves blank lines, never half a record."""
        lines = [json.dumps({"pid": os.getpid()}), *map(json.dumps, self._entries)]
        data = LOCK_HEADER + "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
        os.pwrite(self._fd, data + b"\n" * max(0, self._size - len(data)), 0)
        if self._size > len(data):
            os.ftruncate(self._fd, len(data))
        self._size = len(data)

    def _relative(self, entry: Path) -> str | None:
        where = os.path.relpath(os.path.join(os.path.realpath(entry.parent), entry.name), self.directory)
        return None if where == os.pardir or where.startswith(os.pardir + os.sep) else where.replace(os.sep, "/")


def _nothing() -> None:
    pass


def _record(
    lock: LockFile | None, entry: Path, info: os.stat_result | None = None, restore: Path | None = None
) -> Callable[[], None]:
    """Record ``entry`` (just created; ``info``: the stat it will have, if not its own now) in ``lock``; returns what
    forgets it. No lock: nothing is recorded."""
    if lock is None:
        return _nothing
    return lock.record(entry, os.lstat(entry) if info is None else info, restore)


def _covering(path: Path) -> LockFile | None:
    """The lock this process holds over ``path`` or the nearest directory above it, if any."""
    if not _HELD:
        return None
    held = {lock.covers: lock for lock in _HELD}  # the latest lock over a path wins
    above = Path(os.path.realpath(path.parent))
    for key in (os.path.realpath(path), str(above), *map(str, above.parents)):
        if key in held:
            return held[key]
    return None


def _identity_of(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _open_lock(file: Path, *, create: bool) -> int:
    """A descriptor on the regular file ``file``, opened without following a link or blocking on a FIFO (and
    created if ``create``); ValueError naming anything else there, which is left as it is."""
    flags = (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(file, flags, 0o644)
    except OSError as err:  # a link (ELOOP), a directory (EISDIR), a socket (ENXIO)...
        try:
            mode = os.lstat(file).st_mode
        except OSError:
            raise err from None  # nothing there (FileNotFoundError), say
        if stat.S_ISREG(mode):
            raise  # a permission, say: its message names the file
        raise _not_a_lock(file, kind_of(mode)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_a_lock(file, kind_of(info.st_mode))
    if not _ours(info):  # another user's file in a shared folder: its records could name any of ours
        os.close(fd)
        raise _not_a_lock(file, f"a file owned by {_owner(info.st_uid)}, not by you (a lock file must be yours)")
    return fd


def _ours(info: os.stat_result) -> bool:
    """Whether the entry whose stat is ``info`` is owned by this process's effective user (always, where the system
    has no user ids)."""
    return not hasattr(os, "geteuid") or info.st_uid == os.geteuid()


def _owner(uid: int) -> str:
    """The user ``uid``, by name and id, for messages."""
    try:
        import pwd

        return f"{printable(pwd.getpwuid(uid).pw_name)} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _not_a_lock(file: Path, what: str) -> ValueError:
    return ValueError(
        f"{file} is {what}, where vit-einops keeps a lock file; it was left as it is: move it away, or choose another "
        "output"
    )


def _lock_content(fd: int, file: Path) -> bytes:
    """What the lock file open at ``fd`` holds; ValueError if that is not a lock of ours (left as it is)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, _MAX_LOCK_BYTES + 1)
    if (data and not data.startswith(LOCK_HEADER)) or len(data) > _MAX_LOCK_BYTES:
        raise _not_a_lock(file, f"a file that is not a vit-einops lock (those start {LOCK_HEADER.decode()[:-1]!r})")
    return data


def _holder(data: bytes) -> str:
    """The pid a lock file's content names, else "unknown"."""
    lines = data.splitlines()
    try:
        pid = json.loads(lines[1])["pid"]
    except (IndexError, ValueError, RecursionError, TypeError, KeyError):
        return "unknown"
    return str(pid) if type(pid) is int else "unknown"


def _entries(data: bytes) -> list[dict[str, Any]]:
    """The entries a lock file's content records; torn or malformed lines are skipped."""
    entries = []
    for raw in data.splitlines()[2:]:
        try:
            line = json.loads(raw.decode("utf-8", "surrogateescape"))
        except (ValueError, RecursionError):
            continue
        if (
            isinstance(line, dict)
            and isinstance(line.get("path"), str)
            and line.get("kind") in ("file", "dir")
            and all(type(line.get(key)) is int for key in ("dev", "ino"))
            and isinstance(line.get("restore", ""), str)
        ):
            entries.append(line)
    return entries


def _recorded_entry(directory: str, covers: str, line: dict[str, Any]) -> Path | None:
    """The recorded entry's path if it is still there as recorded (same kind, device and inode), owned by this
    process's user and named as a write of ``covers`` or of a path inside it names its leftovers (:func:`_leftover`),
    else None. Its path must stay inside ``directory`` through real directories: never ``..``, never a link."""
    entry = _inside(directory, line["path"])
    if entry is None:
        return None
    try:
        info = os.lstat(entry)
    except OSError:
        return None
    kind = "dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else None
    if (kind, *_identity_of(info)) != (line["kind"], line["dev"], line["ino"]) or not _ours(info):
        return None
    target = _target_of(entry)
    if target is None:
        return None
    # covers is a real path; the target itself may be a link to it (an output given as a link)
    if os.path.realpath(target) == covers or str(target).startswith(covers.rstrip(os.sep) + os.sep):
        return entry
    return None


def _inside(directory: str, where: str) -> Path | None:
    parts = where.split("/")
    if any(part in ("", os.curdir, os.pardir) for part in parts):
        return None
    path = Path(directory)
    for part in parts[:-1]:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path / parts[-1]


def _remove_recorded(directory: str, covers: str, line: dict[str, Any]) -> None:
    """Remove the recorded entry if it is still there as recorded; a set-aside directory whose place (its target)
    is empty goes back there instead."""
    entry = _recorded_entry(directory, covers, line)
    if entry is None:
        return
    if line["kind"] == "file":
        entry.unlink()
        return
    back = _inside(directory, line["restore"]) if "restore" in line else None
    if back is not None and back == _target_of(entry) and not os.path.lexists(back):
        os.rename(entry, back)
    else:
        shutil.rmtree(entry)


def recorded_leftovers(file: str | Path) -> set[str]:
    """The entries the lock file ``file`` of a directory (a training run's) records that are still there as
    recorded (paths relative to that directory, "/"-separated): what killed writers left, or what a live one is
    writing. Empty if there is no lock file; the ValueError of :class:`LockFile` if what is there is not a lock of
    ours. Reads, never changes, anything."""
    file = Path(file)
    try:
        fd = _open_lock(file, create=False)
    except FileNotFoundError:
        return set()
    try:
        data = _lock_content(fd, file)
    finally:
        os.close(fd)
    directory = os.path.realpath(file.parent)
    return {line["path"] for line in _entries(data) if _recorded_entry(directory, directory, line) is not None}


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
            raise ValueError(f"{str(path)!r} is {kind_of(info.st_mode)}, not a regular file")
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
        raise ValueError(f"{path}: {kind_of(mode)}; expected a {what}")
    return path


def kind_of(mode: int) -> str:
    """What a path whose mode is ``mode`` (from stat or lstat) is, for error messages."""
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISREG, "a file"),
    )
    return next((name for test, name in kinds if test(mode)), "a device or socket")


def check_file_output(path: str | os.PathLike, replace: bool, hint: str) -> None:
    """Before the work, what the commit will check: a ValueError for a FIFO, device, socket or directory at ``path``
    (or a link to one), which is never replaced, first, so that no message offers ``hint`` (--force) for what it
    cannot replace; then without ``replace``, :func:`refuse_existing`."""
    try:
        _refuse_special(Path(path), os.stat(path).st_mode)
    except FileNotFoundError:
        pass
    if not replace:
        refuse_existing(path, hint)


def refuse_existing(path: str | os.PathLike, hint: str) -> None:
    """FileExistsError if ``path`` exists (a dangling symlink counts): outputs never replace a user's file unasked."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} already exists; {hint}")
