"""Checkpoints that never unpickle: safetensors for every tensor, JSON for everything else.

A checkpoint is a directory::

    checkpoint.json                      config, training state, the optimizer's and scheduler's scalars,
                                         and the name and SHA-256 of each tensor file below
    model-<sha256 prefix>.safetensors    the model's state dict, keys as in ``ViT.state_dict()``
    optimizer-<sha256 prefix>.safetensors  the optimizer's tensors (Adam moments, step counts), if saved

Crash safety: tensor files are named by their content hash and written first (temp file in the same
directory, fsync, ``os.replace``); ``checkpoint.json`` is replaced last, the one commit point. A crash at any
moment therefore leaves either the old or the new ``checkpoint.json``, each naming complete files with
matching hashes. Loading verifies the hashes, so a corrupt or truncated file is reported by name instead of
being loaded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..base.io import atomic_write_bytes, check_regular_file, read_regular_file, sha256_of
from ..base.json import loads
from ..network.config import ViTConfig
from ..network.model import ViT
from ..statedict import (
    check_finite,
    check_keys,
    expected_shapes,
    load_weights,
    read_safetensors,
    safetensors_bytes,
)
from .rundir import CHECKPOINT_FILES, CheckpointError
from .rundir import CHECKPOINT_FORMAT as FORMAT
from .rundir import CHECKPOINT_META as META_NAME
from .rundir import MAX_META_BYTES

VERSION = 1
DTYPE = torch.float32  # what training keeps its weights and optimizer moments in, and what a checkpoint holds


# --- nested state <-> (JSON tree, flat tensor dict) -------------------------------------------------------
# Optimizer and scheduler states are trees of dicts, lists, tuples, numbers and tensors, some dicts keyed by
# int (parameter ids). Tensors move to the safetensors file under their path; the rest becomes JSON, with
# tuples and int-keyed dicts tagged so that decoding gives back exactly the tree torch produced.


_TAGS = {"__tensor__", "__int_keys__", "__tuple__"}


def encode_tree(obj: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """JSON-ready copy of ``obj`` with each tensor replaced by ``{"__tensor__": key}`` and stored in ``tensors``."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous()
        return {"__tensor__": path}
    if isinstance(obj, dict):
        if obj and all(isinstance(k, int) and not isinstance(k, bool) for k in obj):
            return {"__int_keys__": {str(k): encode_tree(v, tensors, f"{path}.{k}") for k, v in obj.items()}}
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(
                f"cannot store dict keys {list(obj)!r} at {path or 'top level'!r}: expected all str or all int"
            )
        if reserved := sorted(set(obj) & _TAGS):
            raise TypeError(f"cannot store dict keys {reserved} at {path or 'top level'!r}: reserved by the codec")
        return {k: encode_tree(v, tensors, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_tree(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_tree(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {path!r} in a checkpoint (JSON and tensors only)")


def decode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`encode_tree`."""
    if isinstance(obj, dict):
        if obj.keys() == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if obj.keys() == {"__int_keys__"}:
            return {int(k): decode_tree(v, tensors) for k, v in obj["__int_keys__"].items()}
        if obj.keys() == {"__tuple__"}:
            return tuple(decode_tree(v, tensors) for v in obj["__tuple__"])
        return {k: decode_tree(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_tree(v, tensors) for v in obj]
    return obj


# --- save ---------------------------------------------------------------------------------------------------


def weights_bytes(model: nn.Module) -> bytes:
    """The model's state dict as a safetensors file: what a checkpoint's model file holds, byte for byte, so its
    SHA-256 is the one the checkpoint records (training summaries hash this too)."""
    return safetensors_bytes(model.state_dict())


def checkpoint_files(
    model: ViT,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    train_state: dict[str, Any] | None = None,
) -> dict[str, bytes]:
    """The files of a checkpoint of ``model`` (and optionally the optimizer, LR scheduler and a JSON-ready
    ``train_state`` dict): {name: content}, the tensor files first and checkpoint.json, the commit point, last."""
    if not isinstance(getattr(model, "config", None), ViTConfig):
        raise TypeError(f"expected a vit_einops ViT (with .config), got {type(model).__name__}")
    files: dict[str, bytes] = {}
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "config": model.config.to_dict(),
        "train_state": train_state or {},
        "files": {"model": _tensor_file(files, "model", weights_bytes(model))},
    }
    if optimizer is not None:
        tensors: dict[str, torch.Tensor] = {}
        meta["optimizer"] = encode_tree(optimizer.state_dict(), tensors, "optimizer")
        meta["files"]["optimizer"] = _tensor_file(files, "optimizer", safetensors_bytes(tensors))
    if scheduler is not None:
        no_tensors: dict[str, torch.Tensor] = {}
        meta["scheduler"] = encode_tree(scheduler.state_dict(), no_tensors, "scheduler")
        if no_tensors:
            raise TypeError(
                f"scheduler state holds tensors {sorted(no_tensors)}; only scalar scheduler states are supported"
            )
    files[META_NAME] = (json.dumps(meta, indent=1) + "\n").encode()
    return files


def _tensor_file(files: dict[str, bytes], kind: str, data: bytes) -> dict[str, str]:
    digest = hashlib.sha256(data).hexdigest()
    name = f"{kind}-{digest[:16]}.safetensors"
    files[name] = data
    return {"name": name, "sha256": digest}


def write_checkpoint(directory: str | Path, files: dict[str, bytes]) -> Path:
    """Write :func:`checkpoint_files`' ``files`` into ``directory`` (created if needed), each atomically and in
    order, so checkpoint.json replaces the previous one last; then delete the tensor files it no longer names.
    Returns the path of checkpoint.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta_path = directory / META_NAME
    previous = _named_files(meta_path)
    for name, data in files.items():
        atomic_write_bytes(directory / name, data)
    for stale in directory.iterdir():
        if stale.name not in files and _is_our_tensor_file(stale, previous):
            stale.unlink(missing_ok=True)
    return meta_path


def save_checkpoint(
    directory: str | Path,
    model: ViT,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Save ``model`` (its config and weights), and optionally the optimizer, LR scheduler and a JSON-ready
    ``train_state`` dict, as a checkpoint directory (created if needed). Returns the path of checkpoint.json.

    Tensor files that the new checkpoint.json no longer names are deleted after it is committed.
    """
    files = checkpoint_files(model, optimizer=optimizer, scheduler=scheduler, train_state=train_state)
    return write_checkpoint(directory, files)


def _named_files(meta_path: Path) -> set[str]:
    """The tensor file names an existing checkpoint.json records (none if it is missing or unreadable)."""
    try:
        raw = read_regular_file(meta_path, max_bytes=MAX_META_BYTES)
        files = loads(raw, meta_path.name, max_bytes=MAX_META_BYTES).get("files", {})
        return {entry["name"] for entry in files.values()}
    except (OSError, ValueError, AttributeError, TypeError, KeyError, RecursionError):
        return set()


def _is_our_tensor_file(path: Path, previous: set[str]) -> bool:
    """A tensor file this module wrote: one the previous checkpoint named, or an orphan of a killed save whose
    name is the SHA-256 prefix of its content (a file of the user's with such a name is kept)."""
    if not CHECKPOINT_FILES.fullmatch(path.name) or path.name == META_NAME or not path.is_file():
        return False
    if path.name in previous:
        return True
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return False
    return path.name.endswith(f"-{digest[:16]}.safetensors")


# --- load ---------------------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` read: the config, the model's state dict, and the training state."""

    path: Path
    config: ViTConfig
    state_dict: dict[str, torch.Tensor]
    train_state: dict[str, Any] = field(default_factory=dict)
    optimizer_state: dict[str, Any] | None = None
    scheduler_state: dict[str, Any] | None = None

    def build_model(self, attn_impl: str | Sequence[str] = "einsum") -> ViT:
        """A ViT of the saved config with the saved weights, in eval mode, running ``attn_impl``."""
        model = ViT.from_config(self.config, attn_impl=attn_impl)
        model.load_state_dict(self.state_dict)
        return model.eval()


def _meta_path(path: str | Path) -> Path:
    path = Path(path)
    return path / META_NAME if path.is_dir() else path


def _named_file(directory: Path, entry: Any, meta_path: Path, field: str) -> tuple[Path, int]:
    """The tensor file a checkpoint.json entry names, and its size, after checking that its SHA-256 is the one
    recorded (read in chunks: nothing of it is held)."""
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("name"), str)
        or not isinstance(entry.get("sha256"), str)
    ):
        raise CheckpointError(
            f"{meta_path}: field {field!r} is {entry!r}, expected {{'name': <file name>, 'sha256': <hex digest>}}"
        )
    file = directory / entry["name"]
    if Path(entry["name"]).name != entry["name"]:
        raise CheckpointError(f"{meta_path}: file name {entry['name']!r} must not contain a directory")
    try:
        with open(check_regular_file(file, "tensor file"), "rb") as f:
            size, digest = os.fstat(f.fileno()).st_size, sha256_of(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {file} named by {meta_path}: {err}") from err
    if digest != entry["sha256"]:
        raise CheckpointError(
            f"{file} is corrupt or truncated: its SHA-256 differs from the one recorded in {meta_path}"
        )
    return file, size


def _read_tensor_file(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint's file, each float32."""
    tensors = read_safetensors(file)
    others = sorted(k for k, v in tensors.items() if v.dtype != DTYPE)
    if others:
        raise CheckpointError(
            f"{file} holds {tensors[others[0]].dtype} tensors (e.g. {others[0]!r}); a training checkpoint holds "
            f"{DTYPE} only, what the training loop keeps its weights and optimizer moments in"
        )
    return tensors


def _field(meta: dict[str, Any], name: str, kind: type, meta_path: Path, *, required: bool = True) -> Any:
    """meta[name] if it is a ``kind``; CheckpointError naming the file and the field otherwise."""
    if name not in meta:
        if required:
            raise CheckpointError(f"{meta_path} has no field {name!r}")
        return None
    value = meta[name]
    if not isinstance(value, kind):
        raise CheckpointError(
            f"{meta_path}: field {name!r} is {type(value).__name__} {value!r:.80}, expected {kind.__name__}"
        )
    return value


def load_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None) -> Checkpoint:
    """Read a checkpoint directory (or its checkpoint.json) and verify it: hashes, config, weight names and shapes,
    field types and tensor dtypes. ``dtype`` casts the model's weights (None keeps the checkpoint's float32).

    Raises :class:`CheckpointError` naming the offending file (and field) when anything is missing, corrupt,
    truncated or inconsistent. Only JSON and safetensors are parsed; nothing is unpickled, and only regular files
    are read (a FIFO or a directory in a file's place is refused, not waited on).
    """
    meta_path = _meta_path(path)
    if not meta_path.exists():
        raise CheckpointError(f"no checkpoint at {meta_path} (expected a directory with {META_NAME})")
    try:
        raw = read_regular_file(meta_path, max_bytes=MAX_META_BYTES)
    except (OSError, ValueError) as err:  # ValueError: a directory, FIFO or device, or too large
        raise CheckpointError(f"cannot read {meta_path}: {err}") from err
    try:
        meta = loads(raw, meta_path.name, max_bytes=MAX_META_BYTES)
    except ValueError as err:  # not UTF-8, not JSON, nested too deep
        raise CheckpointError(f"{meta_path} is corrupt or truncated: {err}") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{meta_path} is not a vit-einops checkpoint "
            f"(format {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})"
        )
    if meta.get("version") != VERSION:
        raise CheckpointError(
            f"{meta_path} has checkpoint version {meta.get('version')!r}; this vit-einops reads version {VERSION}"
        )
    try:
        stored = _field(meta, "config", dict, meta_path)
        config = ViTConfig.from_dict(stored)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"{meta_path}: field 'config' is invalid: {err}") from err
    files = _field(meta, "files", dict, meta_path)
    if "model" not in files:
        raise CheckpointError(f"{meta_path} has no field 'files.model' (the weights file)")
    train_state = _field(meta, "train_state", dict, meta_path, required=False) or {}
    directory = meta_path.parent
    try:  # the one ending of every loader, then the keys; a refusal names the file, as a CheckpointError
        model_file, size = _named_file(directory, files["model"], meta_path, "files.model")
        read = functools.partial(_read_tensor_file, model_file)
        state_dict = load_weights(config, read, str(model_file), dtype, file_bytes=size)
        check_keys(state_dict, expected_shapes(config), str(model_file))
        optimizer_state = None
        if "optimizer" in files:
            file, _ = _named_file(directory, files["optimizer"], meta_path, "files.optimizer")
            tensors = _read_tensor_file(file)
            check_finite(tensors, str(file))
            optimizer_state = _decode(_field(meta, "optimizer", dict, meta_path), tensors, meta_path, "optimizer")
    except ValueError as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(str(err)) from err
    scheduler_state = None
    if "scheduler" in meta:
        scheduler_state = _decode(_field(meta, "scheduler", dict, meta_path), {}, meta_path, "scheduler")
    return Checkpoint(meta_path, config, state_dict, train_state, optimizer_state, scheduler_state)


def _decode(tree: dict[str, Any], tensors: dict[str, torch.Tensor], meta_path: Path, field: str) -> Any:
    try:
        return decode_tree(tree, tensors)
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError) as err:
        raise CheckpointError(f"{meta_path}: field {field!r} is malformed: {type(err).__name__}: {err}") from err


def load_checkpoint_model(path: str | Path) -> ViT:
    """The ViT saved at ``path`` (a checkpoint directory or its checkpoint.json), in eval mode: the weights alone.

    :func:`vit_einops.load_model` loads the same directory with the run's class names and preprocessing too."""
    return load_checkpoint(path).build_model()


def restore_training(
    checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, *, step: int
) -> None:
    """Load the saved weights, optimizer and scheduler states into freshly built objects for a resumed run.

    ``optimizer`` and ``scheduler`` must be as the run built them (before any step), and ``step`` the number of
    optimizer steps the saved epoch implies. The learning-rate schedule is a function of the recipe and the step,
    so the saved scheduler state and the optimizer's hyperparameters must equal what the fresh objects give at
    ``step``; anything else (an edited rate, a moved step count) is refused instead of silently trained with.
    """
    if checkpoint.optimizer_state is None or checkpoint.scheduler_state is None:
        raise CheckpointError(
            f"{checkpoint.path} holds weights only (no optimizer or scheduler state); cannot resume from it"
        )
    _check_schedule(checkpoint, optimizer, scheduler, step)
    model.load_state_dict(checkpoint.state_dict)
    try:
        optimizer.load_state_dict(checkpoint.optimizer_state)
        scheduler.load_state_dict(checkpoint.scheduler_state)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RuntimeError) as err:
        raise CheckpointError(
            f"optimizer state in {checkpoint.path} does not fit this optimizer: {type(err).__name__}: {err}"
        ) from err


def _check_schedule(checkpoint: Checkpoint, optimizer: torch.optim.Optimizer, scheduler: Any, step: int) -> None:
    fresh = scheduler.state_dict()
    # base_lr * lambda(step), as LambdaLR computes it: the same float operations, so equality is exact.
    lrs = [base * fn(step) for base, fn in zip(fresh["base_lrs"], scheduler.lr_lambdas, strict=True)]
    expected_scheduler = {**fresh, "last_epoch": step, "_step_count": step + 1, "_last_lr": lrs}
    groups = optimizer.state_dict()["param_groups"]
    expected_groups = [{**group, "lr": lr} for group, lr in zip(groups, lrs, strict=True)]
    saved = checkpoint.optimizer_state
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise CheckpointError(f"{checkpoint.path}: field 'optimizer' has no 'state' and 'param_groups'")
    for name, got, want in (
        ("scheduler", checkpoint.scheduler_state, expected_scheduler),
        ("optimizer.param_groups", saved.get("param_groups"), expected_groups),
    ):
        where = _first_difference(got, want, name)
        if where is not None:
            path, value, expected = where
            raise CheckpointError(
                f"{checkpoint.path}: {path} is {value!r:.80}, but this recipe gives {expected!r:.80} at optimizer "
                f"step {step} (the saved epoch); the learning-rate state was edited or belongs to another run"
            )
    for index, state in saved["state"].items():
        count = state.get("step") if isinstance(state, dict) else None
        if not isinstance(count, torch.Tensor) or count.numel() != 1 or not 0 <= count.item() <= step:
            raise CheckpointError(
                f"{checkpoint.path}: optimizer.state.{index}.step is {count!r:.80}, expected a count in 0..{step}"
            )


def _first_difference(got: Any, want: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first (path, got, want) where two JSON-like trees differ, or None if they are equal."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got), key=str):
            if key not in got or key not in want:
                return f"{path}.{key}", got.get(key, "<missing>"), want.get(key, "<not expected>")
            where = _first_difference(got[key], want[key], f"{path}.{key}")
            if where is not None:
                return where
        return None
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)) and len(want) == len(got):
        if type(want) is not type(got):
            return path, got, want
        for i, (a, b) in enumerate(zip(got, want, strict=True)):  # lengths checked above
            where = _first_difference(a, b, f"{path}.{i}")
            if where is not None:
                return where
        return None
    if type(got) is not type(want) or got != want:
        return path, got, want
    return None
