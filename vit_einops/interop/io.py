"""Weights on disk: safetensors, or .pth/.bin through ``torch.load(weights_only=True)``; nothing else is unpickled.

Two kinds of file:
- a *state dict file* (any key layout: torchvision's, timm's, ours), read by :func:`load_state_dict_file` and
  written by :func:`save_state_dict_file`;
- a *vit-einops file*: one safetensors file whose metadata holds the model's ViTConfig as JSON, so the file alone
  rebuilds the model (:func:`save_vit`, :func:`load_vit`).
Every write goes through ``vit_einops._io.atomic_write_bytes``: a temporary file in the target's
directory, fsync, then ``os.replace``; a crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from .._io import atomic_write_bytes
from ..config import ViTConfig
from ..model import ViT
from .keys import build_vit, check_free_fields, check_keys, check_state_dict, convert_patchify, expected_shapes

SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# Training scripts wrap the weights: timm's train.py under "state_dict", DeiT and MAE under "model".
WRAPPER_KEYS = ("state_dict", "model", "module")
# The metadata entries that mark a vit-einops file.
FORMAT_KEY, FORMAT_NAME, CONFIG_KEY = "format", "vit-einops", "vit_einops_config"


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
    tensors and plain containers (and so could run code) is refused with a ValueError. A checkpoint that wraps
    its weights under one of ``"state_dict"``, ``"model"``, ``"module"`` is unwrapped.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such weights file")
    if suffix in SAFETENSORS_SUFFIXES:
        try:
            return load_file(path, device="cpu")
        except (SafetensorError, ValueError, OSError) as e:
            raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from e
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path}: refused to load: the pickle holds objects other than tensors, which "
            f"torch.load(weights_only=True) will not build (they could run code). Original error: {e}"
        ) from e
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"{path}: not a readable torch file (truncated or corrupt?): {e}") from e
    return _unwrap(obj, path)


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


def safetensors_bytes(state_dict: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """``state_dict`` as the bytes of a safetensors file (CPU, contiguous; tensors that share storage are copied)."""
    # safetensors stores each tensor once, densely: make every tensor contiguous and unshared.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    return save(tensors, metadata=metadata)


def save_state_dict_file(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write a state dict atomically, as safetensors or (for .pth/.pt/.bin/.ckpt) with ``torch.save``."""
    path = Path(path)
    state_dict = check_state_dict(state_dict, "state dict to save")
    if _suffix(path) in SAFETENSORS_SUFFIXES:
        data = safetensors_bytes(state_dict)
    else:
        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
        data = buffer.getvalue()
    atomic_write_bytes(path, data)
    return path


def save_vit(model: ViT, path: str | os.PathLike) -> Path:
    """Write ``model`` as one safetensors file whose metadata carries its ViTConfig (JSON); atomically."""
    if not isinstance(model, ViT):
        raise TypeError(f"save_vit expects a vit_einops.ViT, got {type(model).__name__}")
    path = Path(path)
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES:
        raise ValueError(f"{path}: a vit-einops file is safetensors; use the suffix .safetensors")
    metadata = {FORMAT_KEY: FORMAT_NAME, CONFIG_KEY: json.dumps(model.config.to_dict())}
    atomic_write_bytes(path, safetensors_bytes(model.state_dict(), metadata))
    return path


def read_vit_config(path: str | os.PathLike) -> ViTConfig:
    """The ViTConfig stored in a vit-einops file (see :func:`save_vit`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such weights file")
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from e
    if metadata.get(FORMAT_KEY) != FORMAT_NAME or CONFIG_KEY not in metadata:
        raise ValueError(
            f"{path}: a safetensors file without a vit-einops config in its metadata; "
            f"load a torchvision or timm file with load_torchvision / load_timm"
        )
    try:
        return ViTConfig.from_dict(json.loads(metadata[CONFIG_KEY]))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: the stored vit-einops config is invalid: {e}") from e


def load_vit(path: str | os.PathLike, **overrides: Any) -> ViT:
    """Rebuild the ViT stored by :func:`save_vit`; ``overrides`` change config fields that hold no tensor
    (e.g. ``attn_impl="sdpa"``, ``dropout=0.1``). Keys and shapes are checked against the stored config."""
    check_free_fields(overrides)
    stored_config = read_vit_config(path)
    state_dict = load_state_dict_file(path)
    check_keys(state_dict, expected_shapes(stored_config), str(path))
    config = ViTConfig.from_dict({**stored_config.to_dict(), **overrides})
    return build_vit(config, convert_patchify(state_dict, config, stored_config.patchify, config.patchify))
