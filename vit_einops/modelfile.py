"""Model files: one safetensors file that carries everything needed to use a ViT.

The tensors are the model's state dict under its own keys (``blocks.0.attn.mha.qkv.weight``...). The file's
string metadata holds, as JSON:

    format            "vit-einops"
    format_version    "2" (version 1 files, config only, still load)
    vit_einops_config the ViTConfig, which rebuilds the architecture
    preprocessing     the Preprocessing record (resize, crop, interpolation, mean, std), if known
    class_names       one name per logit, if known
    source            where the weights came from, e.g. {"library": "torchvision", "file": "vit_b_16.pth"}

:func:`save_vit` writes it atomically and never over an existing file unless asked; :func:`load_vit` reads it back,
checking every field's type, every key and shape against the config (:mod:`vit_einops.statedict`), and every
tensor's dtype and values. Models in other forms (training runs, torchvision, timm, Hugging Face) load through
:func:`vit_einops.load_model` (:mod:`vit_einops.sources`), which sits above this module.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .base.io import check_file_output, check_regular_file, write_file
from .base.json import loads
from .network.config import ViTConfig
from .network.model import ViT, check_class_names
from .preprocess import Preprocessing
from .statedict import (
    build_vit,
    check_free_fields,
    check_keys,
    convert_patchify,
    expected_shapes,
    load_weights,
    read_safetensors,
    safetensors_bytes,
)

FORMAT_KEY, FORMAT_NAME, VERSION_KEY, FORMAT_VERSION = "format", "vit-einops", "format_version", 2
CONFIG_KEY, PREPROCESSING_KEY, CLASSES_KEY, SOURCE_KEY = "vit_einops_config", "preprocessing", "class_names", "source"


def checked_class_names(class_names: Any, num_classes: int, source: str) -> list[str] | None:
    """The model's own check (None, or one str per logit), its message prefixed with where the names came from."""
    try:
        return check_class_names(class_names, num_classes)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{source}: {err}") from err


def model_metadata(model: ViT) -> dict[str, str]:
    """The string metadata :func:`save_vit` writes for ``model``."""
    config = model.config
    meta = {
        FORMAT_KEY: FORMAT_NAME,
        VERSION_KEY: str(FORMAT_VERSION),
        CONFIG_KEY: json.dumps(config.to_dict()),
    }
    preprocessing = getattr(model, "preprocessing", None)
    if preprocessing is not None:
        if not isinstance(preprocessing, Preprocessing):
            raise TypeError(f"model.preprocessing must be a Preprocessing or None, got {type(preprocessing).__name__}")
        if preprocessing.channels != config.in_channels:
            raise ValueError(
                f"model.preprocessing normalises {preprocessing.channels} channels; the model has "
                f"in_channels {config.in_channels}"
            )
        meta[PREPROCESSING_KEY] = json.dumps(preprocessing.to_dict())
    names = checked_class_names(getattr(model, "class_names", None), config.num_classes, "model")
    if names is not None:
        meta[CLASSES_KEY] = json.dumps(names)
    source = getattr(model, "source", None)
    if source is not None:
        if not isinstance(source, dict):
            raise TypeError(f"model.source must be a dict or None, got {type(source).__name__}")
        meta[SOURCE_KEY] = json.dumps(source)
    return meta


def save_vit(model: ViT, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write ``model`` (weights, config, preprocessing, class names, source) as one safetensors file, atomically.

    An existing file at ``path`` is refused (FileExistsError) unless ``overwrite=True``, checked again at the
    commit; ``overwrite`` replaces only a regular file, and keeps its permissions.
    """
    if not isinstance(model, ViT):
        raise TypeError(f"save_vit expects a vit_einops.ViT, got {type(model).__name__}")
    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        raise ValueError(f"{path}: a vit-einops model file is safetensors; use the suffix .safetensors")
    check_file_output(path, overwrite, "pass overwrite=True (--force on the command line) to replace it")
    write_file(path, safetensors_bytes(model.state_dict(), model_metadata(model)), replace=overwrite)
    return path


def _json_field(metadata: Mapping[str, str], key: str, path: Path) -> Any:
    return loads(metadata[key], f"{path}: metadata {key!r}")


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The decoded metadata of a model file: config (ViTConfig), preprocessing, class_names, source."""
    from safetensors import SafetensorError, safe_open

    path = check_regular_file(path, "model file")
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {err}") from err
    if metadata.get(FORMAT_KEY) != FORMAT_NAME or CONFIG_KEY not in metadata:
        raise ValueError(
            f"{path}: a safetensors file without a vit-einops config in its metadata; if it holds torchvision, "
            f"timm or Hugging Face weights, load it with source='torchvision'|'timm'|'hf' (--from on the command line)"
        )
    version = metadata.get(VERSION_KEY, "1")
    if version not in ("1", str(FORMAT_VERSION)):
        raise ValueError(f"{path}: model file format version {version!r}; this vit-einops reads 1 and {FORMAT_VERSION}")
    raw_config = _json_field(metadata, CONFIG_KEY, path)
    if not isinstance(raw_config, dict):
        raise ValueError(f"{path}: the stored config is not a JSON object: {raw_config!r:.200}")
    try:
        config = ViTConfig.from_dict(raw_config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: the stored vit-einops config is invalid: {err}") from err
    info: dict[str, Any] = {
        "config": config,
        "preprocessing": None,
        "class_names": None,
        "source": None,
    }
    if PREPROCESSING_KEY in metadata:
        stored = _json_field(metadata, PREPROCESSING_KEY, path)  # its errors name the file and the key
        try:
            info["preprocessing"] = Preprocessing.from_dict(stored)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: the stored preprocessing is invalid: {err}") from err
    if CLASSES_KEY in metadata:
        stored = _json_field(metadata, CLASSES_KEY, path)
        try:
            info["class_names"] = checked_class_names(stored, config.num_classes, "stored class_names")
        except TypeError as err:
            raise ValueError(f"{path}: {err}") from err
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
    if SOURCE_KEY in metadata:
        source = _json_field(metadata, SOURCE_KEY, path)
        if not isinstance(source, dict):
            raise ValueError(f"{path}: the stored source is not a JSON object: {source!r:.200}")
        info["source"] = source
    return info


def read_vit_config(path: str | os.PathLike) -> ViTConfig:
    """The ViTConfig stored in a model file (see :func:`save_vit`)."""
    return read_metadata(path)["config"]


def load_vit(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | None = torch.float32,
    attn_impl: str | Sequence[str] | None = None,
    **overrides: Any,
) -> ViT:
    """Rebuild the ViT stored by :func:`save_vit`, with its preprocessing, class names and source.

    ``attn_impl`` is the attention path to run, as in :class:`ViT` (None: "einsum"). ``overrides`` change config
    fields that hold no tensor (e.g. ``dropout=0.1``). ``dtype`` casts the weights (default float32, the dtype images
    arrive in; None keeps the file's, which must then be one dtype). Keys and shapes are checked against the stored config; non-float or non-finite weights are refused.
    """
    check_free_fields(overrides)
    info = read_metadata(path)
    path, stored = Path(path), info["config"]
    shapes = read_safetensors(path, values=False)
    read = functools.partial(read_safetensors, path)
    state_dict = load_weights(stored, read, str(path), dtype, shapes=shapes, file_bytes=path.stat().st_size)
    check_keys(state_dict, expected_shapes(stored), str(path))
    config = ViTConfig.from_dict({**stored.to_dict(), **overrides})
    impl = "einsum" if attn_impl is None else attn_impl
    model = build_vit(config, convert_patchify(state_dict, config, stored.patchify, config.patchify), impl)
    model.preprocessing, model.class_names, model.source = info["preprocessing"], info["class_names"], info["source"]
    return model
