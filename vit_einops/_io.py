"""Crash-safe file writes, shared by checkpoints, weight exports, metrics, figures and benchmark results."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


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
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise ValueError(f"{path}: {kind}; expected a {what}")
    return path


def refuse_existing(path: str | os.PathLike, hint: str) -> None:
    """FileExistsError if ``path`` exists (a dangling symlink counts): outputs never replace a user's file unasked."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} already exists; {hint}")
