"""Crash-safe file writes, shared by checkpoints, weight exports, metrics, figures and benchmark results."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

# atomic_write_bytes's temporaries: "." + the target's name + "." + mkstemp's 8 random characters + ".tmp".
_TEMP = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str | Path, chunks: Iterable[bytes], check: Callable[[], None] | None = None) -> None:
    """Write the concatenated ``chunks`` to ``path`` as :func:`atomic_write_bytes` does, streaming (a download need
    not fit in memory). ``check`` runs once every chunk is on disk and before the rename: if it raises (a hash or
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
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


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
    """What a path that is not a regular file is, for error messages."""
    return "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"


def refuse_existing(path: str | os.PathLike, hint: str) -> None:
    """FileExistsError if ``path`` exists (a dangling symlink counts): outputs never replace a user's file unasked."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} already exists; {hint}")
