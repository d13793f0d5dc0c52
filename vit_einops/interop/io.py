"""Weights on disk: safetensors, or .pth/.bin through ``torch.load(weights_only=True)``; nothing else is unpickled.

This module reads and writes *state dict files* (any key layout: torchvision's, timm's, ours). vit-einops model
files, which carry a config, preprocessing and class names beside the weights, belong to :mod:`vit_einops.modelfile`.
Every write goes through ``vit_einops.base.io.write_file``: a temporary file in the target's directory, fsync, then a
rename that replaces only when asked; a crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..base.io import check_file_output, check_regular_file, write_file
from ..network.config import ViTConfig
from ..statedict import check_state_dict, load_weights, read_safetensors, safetensors_bytes

SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# Training scripts wrap the weights: timm's train.py under "state_dict", DeiT and MAE under "model".
WRAPPER_KEYS = ("state_dict", "model", "module")
# torch's refusal names the first class the pickle would build: "Unsupported global: GLOBAL torch.nn.Linear was ...".
PICKLED_GLOBAL = re.compile(r"GLOBAL ([A-Za-z_][\w.]*)")


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SAFETENSORS_SUFFIXES + PICKLE_SUFFIXES:
        raise ValueError(
            f"{path}: unknown weights file type {suffix or '(no suffix)'!r}; "
            f"expected one of {', '.join(SAFETENSORS_SUFFIXES + PICKLE_SUFFIXES)}"
        )
    return suffix


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a state dict (str -> tensor, on the CPU) from a safetensors, .pth, .pt, .bin or .ckpt file.

    Pickle files go through ``torch.load(weights_only=True)``: a file that would build any object other than
    tensors and plain containers (and so could run code), such as a whole model saved with ``torch.save(model)``, is
    refused with a ValueError saying to save ``model.state_dict()`` instead. A checkpoint that wraps
    its weights under one of ``"state_dict"``, ``"model"``, ``"module"`` is unwrapped.
    """
    path = Path(path)
    suffix = _suffix(path)
    check_regular_file(path, "weights file")
    if suffix in SAFETENSORS_SUFFIXES:
        return read_safetensors(path)
    head = _head(path)
    if not head.startswith(TORCH_FILE_STARTS):
        # Not a zip or a pickle: an HTML error page saved under the weights' name, a text file... torch.load would
        # call it a pickle of forbidden objects, or raise a bare KeyError.
        raise ValueError(
            f"{path}: not a torch file: " + (f"it starts with {head!r}" if head else "it is empty (0 bytes)") + "; "
            "torch.save writes a zip archive (b'PK') or a pickle (b'\\x80'). A failed download saved under its name?"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # Our own words, not torch's: its text carries terminal escapes and advises unpickling the file anyway.
        found = PICKLED_GLOBAL.search(str(e))
        raise ValueError(
            f"{path}: holds a pickled object ({found.group(1) if found else 'not tensors'}), not weights; objects are "
            "never unpickled here (that could run code): save the weights instead, with "
            "torch.save(model.state_dict(), PATH) where the model was made (or vit_einops.save_vit(model, PATH) for "
            "a vit-einops ViT)"
        ) from e
    except (RuntimeError, EOFError, OSError, KeyError) as e:
        raise ValueError(f"{path}: not a readable torch file (truncated or corrupt?): {e}") from e
    return _unwrap(obj, path)


# The first bytes of what torch.save writes: a zip archive (torch >= 1.6), or a pickle of protocol 2 or more (the
# legacy format; torch.save's default protocol is 2).
TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(16)


def state_dict_shapes(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in a weights file (unwrapped as :func:`load_state_dict_file` does) on the meta device: its keys,
    shapes and dtypes, reading no value where the format allows (a safetensors header, or a zip-format torch file
    memory-mapped)."""
    path = Path(path)
    suffix = _suffix(path)
    check_regular_file(path, "weights file")
    if suffix in SAFETENSORS_SUFFIXES:
        return read_safetensors(path, values=False)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError):
        obj = load_state_dict_file(path)  # not mappable (torch's legacy format), or unreadable: its own error
    return {k: v.to("meta") for k, v in _unwrap(obj, path).items()}


def weights_reader(
    source: str | os.PathLike | Mapping[str, torch.Tensor], library: str
) -> tuple[dict[str, torch.Tensor], Callable[[ViTConfig, torch.dtype | None], dict[str, torch.Tensor]]]:
    """(shapes, read) of weights to load, a file or a state dict in memory: their tensors' shapes at once (on the meta
    device for a file: no value read), for the loader to read its config off; and ``read(config, dtype)``, the
    values through the ending every loader shares (:func:`vit_einops.statedict.load_weights`). A file's messages
    name it, a state dict's its ``library``."""
    if isinstance(source, Mapping):
        shapes = check_state_dict(source, library)
        name, values, file_bytes = library, lambda: shapes, None
    else:
        path = Path(source)
        shapes = state_dict_shapes(path)
        name, values, file_bytes = str(path), lambda: load_state_dict_file(path), path.stat().st_size

    def read(config: ViTConfig, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        return load_weights(config, values, name, dtype, shapes=shapes, file_bytes=file_bytes)

    return shapes, read


def _unwrap(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    try:
        return check_state_dict(obj, str(path))
    except TypeError as e:
        raise ValueError(f"{path}: does not hold a state dict: {e}") from e


def save_state_dict_file(
    state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Write a state dict atomically, as safetensors or (for .pth/.pt/.bin/.ckpt) with ``torch.save``.

    An existing file at ``path`` is refused (FileExistsError) unless ``overwrite=True``, checked again at the
    commit; ``overwrite`` replaces only a regular file, and keeps its permissions."""
    path = Path(path)
    check_file_output(path, overwrite, "pass overwrite=True (--force on the command line) to replace it")
    state_dict = check_state_dict(state_dict, "state dict to save")
    if _suffix(path) in SAFETENSORS_SUFFIXES:
        data = safetensors_bytes(state_dict)
    else:
        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
        data = buffer.getvalue()
    write_file(path, data, replace=overwrite)
    return path
