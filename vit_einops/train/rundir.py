"""The output directory of a training run: checked before any work, locked while a run writes to it, and a manifest
that proves which of its files a run wrote.

A run writes these names, and nothing else, in its directory::

    metrics.jsonl  summary.json  curves.png  confusion.png  model.safetensors  checkpoint/  .vit-einops-run.json
    .vit-einops-train.lock

- The manifest (``.vit-einops-run.json``) records the name and SHA-256 of every file the run writes. It is
  written, atomically, *before* the files it names, and lists both the old and the new content of each until the
  new is in place, so that at every moment each file of ours on disk has its content recorded there. A run
  replaces or deletes a file only when the manifest proves it: the file is regular, and its SHA-256 is recorded
  under its name. A name alone proves nothing.
- A directory that already holds files is refused unless the caller continues the run there (``resume``) or asks
  to start over (``overwrite``). Either way, a file at one of the names above that the manifest does not prove
  ours (a user's file, a symbolic link, a FIFO, a file edited since) is refused, and the message lists it. Files
  at other names are kept.
- What a run killed before its first checkpoint left (nothing committed: the lock, temporaries, and files the
  manifest proves ours) is not a run: a plain rerun removes it and starts; ``resume`` starts from epoch 1 too.
- One run at a time: the first takes the lock file (:class:`vit_einops.base.io.LockFile`, the lock every output of
  vit-einops has) and holds it until it ends. The kernel drops the lock when the process dies, even by SIGKILL, so
  a killed run never blocks the next one, which takes its lock file over. A link, a FIFO or a user's file at the
  lock's name is refused, and left as it is.
- Each temporary the run writes (``.<name>.<random>.tmp`` beside its target, in the directory or in
  ``checkpoint/``) is recorded in the lock file before it is written; the next run removes exactly the recorded
  ones that a kill left, and never a file only because of its name.

Plain Python (no torch), so the command line can check ``--out`` before it loads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..base.io import LockFile, atomic_write_bytes, kind_of, read_regular_file, recorded_leftovers, sha256_of
from ..base.json import loads

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"
CURVES_NAME = "curves.png"
CONFUSION_NAME = "confusion.png"
MODEL_NAME = "model.safetensors"
MANIFEST_NAME = ".vit-einops-run.json"
MANIFEST_FORMAT = "vit-einops.run"  # the manifest's "format"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FORMAT = "vit-einops.checkpoint"  # checkpoint.json's "format"
CHECKPOINT_META = "checkpoint.json"
COMMITTED = f"{CHECKPOINT_DIR}/{CHECKPOINT_META}"  # a run has an epoch to resume once this file exists
MAX_META_BYTES = 64 * 2**20  # checkpoint.json and the manifest are kilobytes; anything this large is not ours
LOCK_NAME = ".vit-einops-train.lock"
# What we write in the run directory and in checkpoint/ (the tensor files are named by their SHA-256 prefix).
RUN_FILES = re.compile(
    "|".join(map(re.escape, (METRICS_NAME, SUMMARY_NAME, CURVES_NAME, CONFUSION_NAME, MODEL_NAME, MANIFEST_NAME)))
)
CHECKPOINT_FILES = re.compile(r"checkpoint\.json|(model|optimizer)-[0-9a-f]{16}\.safetensors")


class RunDirLockedError(OSError):
    """Another training run holds the output directory."""


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, truncated, or disagrees with itself; the message names the file."""


@dataclass
class Survey:
    """What an output directory holds, as a run sees it (paths relative to the directory, "/"-separated)."""

    ours: dict[str, str] = field(default_factory=dict)  # files the manifest proves a run wrote -> their SHA-256
    unproven: dict[str, str] = field(default_factory=dict)  # entries at a run's names it cannot prove -> why
    held: list[str] = field(default_factory=list)  # top-level names that are neither a lock nor a temporary
    foreign: bool = False  # something at a name a run never writes (kept, whatever the flags)
    started: bool = False  # a lock file or a manifest: a run of ours began here

    @property
    def committed(self) -> bool:
        return COMMITTED in self.ours or COMMITTED in self.unproven


def survey(out: Path) -> Survey:
    """Sort what ``out`` (an existing directory) holds into a run's files, files at a run's names that are not
    proven ours, and anything else."""
    found = Survey()
    leftovers = recorded_leftovers(out / LOCK_NAME)  # a ValueError if a link or a user's file is at the lock's name
    manifest, why_not = read_manifest(out)
    found.started = manifest is not None or os.path.lexists(out / LOCK_NAME)
    if why_not is not None:
        found.unproven[MANIFEST_NAME] = why_not
    for entry in sorted(out.iterdir()):
        name = entry.name
        if name == LOCK_NAME or name in leftovers:
            continue
        if name != MANIFEST_NAME:
            found.held.append(name)
        if name == CHECKPOINT_DIR:
            if entry.is_symlink() or not entry.is_dir():
                found.unproven[name] = kind_of(os.lstat(entry).st_mode) + ", not the run's directory"
                continue
            for inner in sorted(entry.iterdir()):
                if f"{name}/{inner.name}" in leftovers:
                    continue
                if CHECKPOINT_FILES.fullmatch(inner.name):
                    _prove(found, manifest, out, f"{name}/{inner.name}", tensor=inner.name != CHECKPOINT_META)
                else:
                    found.foreign = True
        elif RUN_FILES.fullmatch(name):
            if name != MANIFEST_NAME:
                _prove(found, manifest, out, name)
        else:
            found.foreign = True
    return found


def _prove(found: Survey, manifest: Mapping[str, list[str]] | None, out: Path, rel: str, tensor: bool = False) -> None:
    """Record ``rel`` as ours (its SHA-256 is in the manifest under its name) or as unproven, saying why.

    A tensor file whose name a run did not record is a user's file that only looks like ours: kept, not refused,
    since a new run names its tensor files by their content and so never writes over it."""
    digest, why_not = _sha256(out / rel)
    if digest is not None and manifest is not None and digest in manifest.get(rel, ()):
        found.ours[rel] = digest
    elif tensor and why_not is None:
        found.foreign = True
    else:
        if why_not is None:
            why_not = (
                "no manifest records it"
                if manifest is None
                else "changed since the run wrote it"
                if rel in manifest
                else "the manifest does not record it"
            )
        found.unproven[rel] = why_not


def _sha256(path: Path) -> tuple[str | None, str | None]:
    """(SHA-256 of the regular file at ``path``, None), or (None, what it is instead). Never follows a symlink, and
    never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        try:
            return None, kind_of(os.lstat(path).st_mode)
        except OSError as err:
            return None, f"unreadable ({err.strerror})"
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return None, kind_of(mode)
        return sha256_of(f), None


def read_manifest(out: Path) -> tuple[dict[str, list[str]] | None, str | None]:
    """(the manifest's {path: [SHA-256, ...]}, None); (None, None) when there is none; (None, why) when the file
    at its name is not a manifest of ours."""
    path = out / MANIFEST_NAME
    if not os.path.lexists(path):
        return None, None
    if path.is_symlink():
        return None, "a symbolic link"
    try:
        meta = loads(read_regular_file(path, max_bytes=MAX_META_BYTES), str(path), max_bytes=MAX_META_BYTES)
    except (OSError, ValueError) as err:  # ValueError: not UTF-8, not JSON, nested past the reader's cap
        return None, f"not a run manifest ({type(err).__name__})"
    files = meta.get("files") if isinstance(meta, dict) and meta.get("format") == MANIFEST_FORMAT else None
    if not isinstance(files, dict) or not all(
        isinstance(hashes, list) and all(isinstance(h, str) for h in hashes) for hashes in files.values()
    ):
        return None, "not a run manifest"
    return files, None


def check_out_dir(out: str | Path, *, resume: bool = False, overwrite: bool = False) -> Path:
    """Raise ValueError unless a run may write to ``out`` with these flags; returns it as a Path. Creates nothing.

    ``out`` must be a directory or not exist yet (its nearest existing ancestor then must be a directory). Without
    ``resume`` or ``overwrite`` it must hold no file, apart from what a killed run of ours left before its first
    checkpoint. With either, every file at a run's names must be proven ours by the manifest.
    ``resume`` needs a run to continue: :class:`CheckpointError` if no run of ours was ever started in ``out``.
    """
    _checked_survey(out, resume=resume, overwrite=overwrite)
    return Path(out)


def _checked_survey(out: str | Path, *, resume: bool, overwrite: bool) -> Survey | None:
    """:func:`check_out_dir`, returning what the directory holds (None: it does not exist yet)."""
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
        if resume:
            raise _nothing_to_resume(out)
        return None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"output directory {str(out)!r} is not writable")
    found = survey(out)
    if resume and not (found.committed or found.started):
        raise _nothing_to_resume(out)
    # Under resume, load_checkpoint judges checkpoint.json itself, by its content and the hashes it records.
    refused = {n: why for n, why in found.unproven.items() if not (resume and n == COMMITTED)}
    if (resume or overwrite) and refused:
        listed = "; ".join(f"{name} ({why})" for name, why in sorted(refused.items()))
        flag = "--resume (resume=True)" if resume else "--overwrite (overwrite=True)"
        raise ValueError(
            f"output directory {str(out)!r} holds files at a training run's names that no run of vit-einops is "
            f"recorded to have written: {listed}. {flag} replaces only files the run's manifest ({MANIFEST_NAME}) "
            "proves it wrote; move these away or choose another directory"
        )
    if not (resume or overwrite) and (found.committed or found.unproven or found.foreign):
        shown = ", ".join(found.held[:8]) + (f" and {len(found.held) - 8} more" if len(found.held) > 8 else "")
        raise ValueError(
            f"output directory {str(out)!r} already holds files ({shown}); continue that run with --resume "
            "(resume=True), start a new one over it with --overwrite (overwrite=True; it replaces only what a "
            "run recorded writing, and keeps any other file), or choose another directory"
        )
    return found


def _nothing_to_resume(out: Path) -> CheckpointError:
    return CheckpointError(
        f"no checkpoint at {out / CHECKPOINT_DIR / CHECKPOINT_META} and no run was started in {str(out)!r}: nothing "
        "to resume (run without --resume, resume=False, to start one)"
    )


class RunDir:
    """An output directory held for one run: :meth:`open` checks, creates, locks and cleans; :meth:`close` unlocks.
    :meth:`record` and :meth:`settle` keep the manifest ahead of every write.

    Use as a context manager. On platforms without ``fcntl`` (Windows) the directory is not locked.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: LockFile | None = None
        self.removed: list[str] = []  # what open() removed: a previous run's files (overwrite, or a killed start)
        self.committed = False  # open() found a checkpoint to resume from
        self._settled: dict[str, list[str]] = {}  # each file of ours on disk now -> its SHA-256 (a list of one)

    @classmethod
    def open(cls, out: str | Path, *, resume: bool = False, overwrite: bool = False) -> "RunDir":
        """Check ``out`` for a run with these flags, create and lock it (which removes the temporaries its lock file
        records: those of a killed run), and remove a previous run's files when this run starts afresh
        (``overwrite``, or nothing was committed)."""
        _checked_survey(out, resume=resume, overwrite=overwrite)
        run = cls(Path(out))
        run.path.mkdir(parents=True, exist_ok=True)
        run._lock = LockFile.take(run.path / LOCK_NAME, run.path, run._busy)
        try:
            # Checked again under the lock: a run that started between our first look and the lock has written.
            found = _checked_survey(run.path, resume=resume, overwrite=overwrite)
            run.committed = resume and found.committed
            if run.committed:
                run._settled = {name: [digest] for name, digest in found.ours.items()}
            else:
                run._start_afresh(found)
        except BaseException:
            run.close()
            raise
        return run

    def _start_afresh(self, found: Survey) -> None:
        """Delete the files of ours a previous run left (the commit point first, so that a kill halfway leaves no
        checkpoint naming missing files), then the manifest."""
        for name in sorted(found.ours, key=lambda n: n != COMMITTED):
            (self.path / name).unlink(missing_ok=True)
            self.removed.append(name)
        (self.path / MANIFEST_NAME).unlink(missing_ok=True)

    def record(self, files: Mapping[str, bytes]) -> dict[str, str]:
        """Write the manifest for files about to be written (paths relative to the run directory): every file of
        ours now on disk with its current SHA-256, and each of ``files`` with its new one. Returns the new
        {path: SHA-256} for :meth:`settle`, to be called once the files are written."""
        new = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
        entries = {name: list(hashes) for name, hashes in self._settled.items()}
        for name, digest in new.items():
            entries[name] = [h for h in entries.get(name, []) if h != digest] + [digest]
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "files": dict(sorted(entries.items()))}
        atomic_write_bytes(self.path / MANIFEST_NAME, (json.dumps(manifest, indent=1) + "\n").encode())
        return new

    def settle(self, written: Mapping[str, str]) -> None:
        """After the files :meth:`record` announced are written: each now holds its new content, and files of ours
        that the writes removed (a checkpoint's stale tensor files) drop out at the next :meth:`record`."""
        self._settled = {n: h for n, h in self._settled.items() if os.path.lexists(self.path / n)}
        self._settled.update((name, [digest]) for name, digest in written.items())

    def write(self, files: Mapping[str, bytes]) -> None:
        """Record, write atomically (in the given order) and settle ``files`` (paths relative to the directory)."""
        written = self.record(files)
        for name, data in files.items():
            atomic_write_bytes(self.path / name, data)
        self.settle(written)

    def _busy(self, holder: str) -> RunDirLockedError:
        return RunDirLockedError(
            f"output directory {str(self.path)!r} is in use by another training run (pid {holder}); wait for it to "
            "end or choose another directory"
        )

    def close(self) -> None:
        """Release the lock (its file removed first, so that a waiter retries on a fresh one)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
