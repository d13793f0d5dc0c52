"""The output directory of a training run: checked before any work, locked while a run writes to it.

What a run writes there (the names below, nothing else) is the only thing it ever replaces or deletes:

    metrics.jsonl  summary.json  curves.png  model.safetensors  checkpoint/  .vit-einops-train.lock

- A directory that already holds files is refused unless the caller continues the run there (``resume``) or asks to
  start over (``overwrite``); files this package did not write are kept either way.
- One run at a time: the first takes an exclusive ``fcntl.flock`` on the lock file and holds it until it ends. The
  kernel drops the lock when the process dies, even by SIGKILL, so a killed run never blocks the next one; the
  file itself is then just a name the next run locks again.
- Temporaries a killed run left behind (``.<name>.<random>.tmp`` of the names above) are deleted once the lock
  is held, when no writer of ours can be using them.

Plain Python (no torch), so the command line can check ``--out`` before it loads anything.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .._io import read_regular_file, remove_orphan_temps, temp_target
from .._json import loads

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"
CURVES_NAME = "curves.png"
MODEL_NAME = "model.safetensors"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FORMAT = "vit-einops.checkpoint"  # checkpoint.json's "format"
CHECKPOINT_META = "checkpoint.json"
MAX_META_BYTES = 64 * 2**20  # checkpoint.json is kilobytes; anything this large is not one of ours
LOCK_NAME = ".vit-einops-train.lock"
# What we write in the run directory and in checkpoint/ (the tensor files are named by their SHA-256 prefix).
RUN_FILES = re.compile("|".join(map(re.escape, (METRICS_NAME, SUMMARY_NAME, CURVES_NAME, MODEL_NAME))))
CHECKPOINT_FILES = re.compile(r"checkpoint\.json|(model|optimizer)-[0-9a-f]{16}\.safetensors")


class RunDirLockedError(OSError):
    """Another training run holds the output directory."""


def check_out_dir(out: str | Path, *, resume: bool = False, overwrite: bool = False) -> Path:
    """Raise ValueError unless a run may write to ``out`` with these flags; returns it as a Path. Creates nothing.

    ``out`` must be a directory or not exist yet (its nearest existing ancestor then must be a directory). Without
    ``resume`` or ``overwrite`` it must be empty, apart from what a killed run of ours left before writing
    anything (its lock file and temporaries).
    """
    out = Path(out)
    if resume and overwrite:
        raise ValueError("resume continues the run in the output directory and overwrite starts a new one: pick one")
    if out.exists() and not out.is_dir():
        raise ValueError(f"output directory {str(out)!r} is a file, expected a directory (or a path to create)")
    if not out.exists():
        ancestor = out.absolute().parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ValueError(f"cannot create output directory {str(out)!r}: {str(ancestor)!r} is a file")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ValueError(f"cannot create output directory {str(out)!r}: {str(ancestor)!r} is not writable")
        return out
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"output directory {str(out)!r} is not writable")
    if not (resume or overwrite):
        held = sorted(p.name for p in out.iterdir() if not _debris(p))
        if held:
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            raise ValueError(
                f"output directory {str(out)!r} already holds files ({shown}); continue that run with --resume "
                "(resume=True), start a new one over it with --overwrite (overwrite=True; files vit-einops did "
                "not write are kept), or choose another directory"
            )
    return out


def _debris(path: Path) -> bool:
    """A leftover of a killed run of ours that had not yet written anything: the lock file or a temporary."""
    target = temp_target(path.name)
    return path.name == LOCK_NAME or (target is not None and RUN_FILES.fullmatch(target) is not None)


class RunDir:
    """An output directory held for one run: :meth:`open` checks, creates, locks and cleans; :meth:`close` unlocks.

    Use as a context manager. On platforms without ``fcntl`` (Windows) the directory is not locked.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @classmethod
    def open(cls, out: str | Path, *, resume: bool = False, overwrite: bool = False) -> "RunDir":
        run = cls(check_out_dir(out, resume=resume, overwrite=overwrite))
        run.path.mkdir(parents=True, exist_ok=True)
        run._lock()
        try:
            # Checked again under the lock: a run that started between our first look and the lock has written.
            check_out_dir(run.path, resume=resume, overwrite=overwrite)
            remove_orphan_temps(run.path, RUN_FILES)
            remove_orphan_temps(run.path / CHECKPOINT_DIR, CHECKPOINT_FILES)
            if overwrite and _is_ours(run.path):  # else the old summary and curves sit beside the new run's files
                for name in (SUMMARY_NAME, CURVES_NAME):
                    (run.path / name).unlink(missing_ok=True)
        except BaseException:
            run.close()
            raise
        return run

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks of this kind
            return
        path = self.path / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunDirLockedError(
                    f"output directory {str(self.path)!r} is in use by another training run (pid {holder}); wait for "
                    "it to end or choose another directory"
                ) from None
            # The previous holder unlinks the file as it ends: if that happened between our open and our flock, we
            # locked a file nobody else will see, so try again on the current one.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def close(self) -> None:
        """Release the lock (unlink the file first, so that a waiter retries on a fresh one)."""
        if self._fd is not None:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_ours(run: Path) -> bool:
    """True if ``run`` holds a checkpoint of ours, so that summary.json and curves.png beside it are ours too."""
    try:
        # Read without blocking: a FIFO in the file's place is not ours, and must not hang the run.
        path = run / CHECKPOINT_DIR / CHECKPOINT_META
        meta = loads(read_regular_file(path, max_bytes=MAX_META_BYTES), str(path), max_bytes=MAX_META_BYTES)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == CHECKPOINT_FORMAT
