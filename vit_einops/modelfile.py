"""Model files: one safetensors file that carries everything needed to use a ViT.

The tensors are the model's state dict under its own keys (``blocks.0.attn.fn.mha.qkv.weight``...). The file's
string metadata holds, as JSON:

    format            "vit-einops"
    format_version    "2" (version 1 files, config only, still load)
    vit_einops_config the ViTConfig, which rebuilds the architecture
    preprocessing     the Preprocessing record (resize, crop, interpolation, mean, std), if known
    class_names       one name per logit, if known
    source            where the weights came from, e.g. {"library": "torchvision", "file": "vit_b_16.pth"}

:func:`save_vit` writes it atomically and never over an existing file unless asked; :func:`load_vit` reads it back,
checking every field's type, every key and shape against the config, and every tensor's dtype and values.
:func:`load_model` is the one front door for "a model in any form": a model file, a training run or checkpoint
directory, or (with ``source=``) a torchvision, timm or Hugging Face file.

This module also owns the checks of our own key layout (:func:`expected_shapes`, :func:`check_keys`), which the
converters and the training checkpoints share.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ._io import atomic_write_bytes, check_regular_file, refuse_existing
from .config import ViTConfig
from .model import ViT, check_class_names
from .patch_embed import conv_to_linear_weight, linear_to_conv_weight
from .preprocess import Preprocessing

FORMAT_KEY, FORMAT_NAME, VERSION_KEY, FORMAT_VERSION = "format", "vit-einops", "format_version", 2
CONFIG_KEY, PREPROCESSING_KEY, CLASSES_KEY, SOURCE_KEY = "vit_einops_config", "preprocessing", "class_names", "source"
SOURCES = ("vit-einops", "torchvision", "timm", "hf")

# The ViTConfig fields a state dict cannot pin down and that change no tensor: callers may set them freely.
FREE_FIELDS = ("dropout", "attn_dropout", "attn_impl", "patchify", "layer_norm_eps")
PATCH_WEIGHT = "patch_embed.proj.weight"


class StateDictMismatchError(ValueError):
    """A state dict does not fit the expected layout; lists every missing, unexpected and mis-shaped key."""

    def __init__(
        self,
        source: str,
        missing: list[str],
        unexpected: list[str],
        mis_shaped: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
    ) -> None:
        self.missing, self.unexpected, self.mis_shaped = missing, unexpected, mis_shaped
        lines = [f"{source} state dict does not match the expected layout:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        for key, (got, want) in mis_shaped.items():
            lines.append(f"  mis-shaped {key}: got {tuple(got)}, expected {tuple(want)}")
        super().__init__("\n".join(lines))


# --- our key layout -------------------------------------------------------------------------------------------


def check_state_dict(state_dict: Any, source: str) -> dict[str, torch.Tensor]:
    """Return ``state_dict`` as a plain dict after checking it maps str keys to tensors."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{source} state dict must be a mapping of str to torch.Tensor, got {type(state_dict).__name__}"
        )
    for key, value in state_dict.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{source} state dict must map str to torch.Tensor; key {key!r} holds {type(value).__name__}"
            )
    return dict(state_dict)


def check_keys(state_dict: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], source: str) -> None:
    """Raise :class:`StateDictMismatchError` unless ``state_dict`` has exactly the keys and shapes of ``expected``."""
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mis_shaped = {
        k: (tuple(v.shape), tuple(expected[k]))
        for k, v in state_dict.items()
        if k in expected and tuple(v.shape) != tuple(expected[k])
    }
    if missing or unexpected or mis_shaped:
        raise StateDictMismatchError(source, missing, unexpected, mis_shaped)


def check_weights(state_dict: Mapping[str, torch.Tensor], source: str, dtype: torch.dtype | None) -> None:
    """Every tensor floating point and finite; with ``dtype`` None, all of one dtype (a model runs in one)."""
    not_float = sorted(k for k, v in state_dict.items() if not v.is_floating_point())
    if not_float:
        k = not_float[0]
        raise ValueError(
            f"{source}: weights must be floating point; {len(not_float)} tensors are not, e.g. {k!r} "
            f"({state_dict[k].dtype})"
        )
    dtypes = sorted({str(v.dtype) for v in state_dict.values()})
    if dtype is None and len(dtypes) > 1:
        raise ValueError(f"{source}: tensors of several dtypes {dtypes}; pass dtype=torch.float32 to cast them")
    bad = [k for k, v in state_dict.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{source}: non-finite values (nan or inf) in {len(bad)} tensors, e.g. {bad[0]!r}")


def cast_weights(
    state_dict: Mapping[str, torch.Tensor], source: str, dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """:func:`check_weights`, then every tensor cast to ``dtype`` (None keeps them as they are)."""
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    state_dict = check_state_dict(state_dict, source)
    check_weights(state_dict, source, dtype)
    return state_dict if dtype is None else {k: v.to(dtype) for k, v in state_dict.items()}


def expected_shapes(config: ViTConfig) -> dict[str, torch.Size]:
    """Our state-dict keys and shapes for ``config``, from a model on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = ViT.from_config(config)
    return {k: v.shape for k, v in model.state_dict().items()}


def build_vit(config: ViTConfig, state_dict: Mapping[str, torch.Tensor]) -> ViT:
    """A ViT for ``config`` holding copies of ``state_dict``'s tensors, in their dtype and on their device.

    Built on the meta device: the random init that loading would overwrite is never computed (seconds for ViT-H).
    """
    with torch.device("meta"):
        model = ViT.from_config(config)
    model.load_state_dict({k: v.detach().clone() for k, v in state_dict.items()}, assign=True)
    return model


def check_free_fields(overrides: Mapping[str, Any]) -> None:
    """Only fields that no tensor pins down may be overridden when a config is inferred."""
    fixed = sorted(set(overrides) - set(FREE_FIELDS))
    if fixed:
        raise ValueError(
            f"{fixed} are read from the state dict and cannot be overridden; "
            f"the fields that can are {', '.join(FREE_FIELDS)}"
        )


def convert_patchify(
    state_dict: dict[str, torch.Tensor], config: ViTConfig, source: str, target: str
) -> dict[str, torch.Tensor]:
    """Move the patch projection between its Conv2d (D, C, p1, p2) and Linear (D, p1 p2 C) forms, in place."""
    if source != target:
        w = state_dict[PATCH_WEIGHT]
        state_dict[PATCH_WEIGHT] = (
            conv_to_linear_weight(w)
            if target == "linear"
            else linear_to_conv_weight(w, config.in_channels, config.patch_size)
        )
    return state_dict


# --- files ----------------------------------------------------------------------------------------------------


def safetensors_bytes(state_dict: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """``state_dict`` as the bytes of a safetensors file (CPU, contiguous; tensors that share storage are copied)."""
    from safetensors.torch import save

    # safetensors stores each tensor once, densely: make every tensor contiguous and unshared.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    return save(tensors, metadata=metadata)


def _class_names(class_names: Any, num_classes: int, source: str) -> list[str] | None:
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
    names = _class_names(getattr(model, "class_names", None), config.num_classes, "model")
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

    An existing file at ``path`` is refused (FileExistsError) unless ``overwrite=True``.
    """
    if not isinstance(model, ViT):
        raise TypeError(f"save_vit expects a vit_einops.ViT, got {type(model).__name__}")
    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        raise ValueError(f"{path}: a vit-einops model file is safetensors; use the suffix .safetensors")
    if not overwrite:
        refuse_existing(path, "pass overwrite=True (--force on the command line) to replace it")
    atomic_write_bytes(path, safetensors_bytes(model.state_dict(), model_metadata(model)))
    return path


def _json_field(metadata: Mapping[str, str], key: str, path: Path) -> Any:
    try:
        return json.loads(metadata[key])
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: metadata {key!r} is not valid JSON: {err}") from err


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
    info: dict[str, Any] = {"config": config, "preprocessing": None, "class_names": None, "source": None}
    if PREPROCESSING_KEY in metadata:
        try:
            info["preprocessing"] = Preprocessing.from_dict(_json_field(metadata, PREPROCESSING_KEY, path))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: the stored preprocessing is invalid: {err}") from err
    if CLASSES_KEY in metadata:
        try:
            info["class_names"] = _class_names(
                _json_field(metadata, CLASSES_KEY, path), config.num_classes, "stored class_names"
            )
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


def load_vit(path: str | os.PathLike, *, dtype: torch.dtype | None = torch.float32, **overrides: Any) -> ViT:
    """Rebuild the ViT stored by :func:`save_vit`, with its preprocessing, class names and source.

    ``overrides`` change config fields that hold no tensor (e.g. ``attn_impl="sdpa"``, ``dropout=0.1``).
    ``dtype`` casts the weights (default float32, the dtype images arrive in; None keeps the file's, which must then
    be one dtype). Keys and shapes are checked against the stored config; non-float or non-finite weights are refused.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    check_free_fields(overrides)
    info = read_metadata(path)
    path = Path(path)
    try:
        state_dict = load_file(path, device="cpu")
    except (SafetensorError, ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {err}") from err
    stored = info["config"]
    check_keys(state_dict, expected_shapes(stored), str(path))
    state_dict = cast_weights(state_dict, str(path), dtype)
    config = ViTConfig.from_dict({**stored.to_dict(), **overrides})
    model = build_vit(config, convert_patchify(state_dict, config, stored.patchify, config.patchify))
    model.preprocessing, model.class_names, model.source = info["preprocessing"], info["class_names"], info["source"]
    return model


def load_model(path: str | os.PathLike, *, source: str | None = None, **kwargs: Any) -> ViT:
    """A ViT from any of the forms users hold, with its preprocessing and class names where known.

    - a vit-einops model file (``.safetensors`` from :func:`save_vit`, ``vit-einops convert`` or ``train``);
    - a training run directory (holding ``model.safetensors`` or ``checkpoint/``), a checkpoint directory, or its
      ``checkpoint.json``;
    - with ``source="torchvision"`` or ``"timm"``: a state-dict file of that library (``kwargs`` go to
      :func:`vit_einops.interop.load_torchvision` / :func:`~vit_einops.interop.load_timm`), with that library's
      preprocessing convention;
    - with ``source="hf"``: a Hugging Face ``save_pretrained`` directory, or its weights file next to config.json.

    This is the front door above the tools: it imports the checkpoint reader and the converters only when asked.
    """
    if source is not None and source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)} or None, got {source!r}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model file or directory")
    if source in ("torchvision", "timm", "hf"):
        from . import interop

        loader = {"torchvision": interop.load_torchvision, "timm": interop.load_timm, "hf": interop.load_hf}[source]
        return loader(path, **kwargs)
    if path.is_dir() or path.name == "checkpoint.json":
        return _load_from_run(path, **kwargs)
    return load_vit(path, **kwargs)


def _load_from_run(path: Path, **kwargs: Any) -> ViT:
    """A training run directory (its model.safetensors, else its checkpoint) or a checkpoint directory."""
    if path.is_dir() and (path / "model.safetensors").exists():
        return load_vit(path / "model.safetensors", **kwargs)
    candidates = [path] if path.name == "checkpoint.json" else [path / "checkpoint.json", path / "checkpoint"]
    found = next((c for c in candidates if c.exists()), None)
    if found is None:
        if path.is_dir() and (path / "config.json").is_file():
            raise ValueError(f"{path}: looks like a Hugging Face directory (config.json); pass source='hf' (--from hf)")
        raise ValueError(
            f"{path}: a directory without model.safetensors or a training checkpoint (checkpoint.json); "
            f"expected a vit-einops model file, a training run or checkpoint directory"
        )
    from .train.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(found)
    model = checkpoint.build_model()
    if kwargs:
        check_free_fields(kwargs)
        model = build_vit(ViTConfig.from_dict({**model.config.to_dict(), **kwargs}), model.state_dict())
    data = checkpoint.train_state.get("data") or {}
    classes = data.get("classes") if isinstance(data, dict) else None
    model.class_names = _class_names(classes, model.config.num_classes, f"{checkpoint.path} classes")
    model.preprocessing = Preprocessing.plain(model.config.image_size, model.config.in_channels)
    model.source = {"library": "vit-einops", "file": str(checkpoint.path)}
    return model
