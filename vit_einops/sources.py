"""Where a model comes from: the registry of sources, and :func:`load_model`, the one door that loads any of them.

This module sits above the tools: it imports the converters (:mod:`vit_einops.interop`) and the checkpoint reader
(:mod:`vit_einops.train.checkpoint`) inside the loaders that need them, so loading a model file pays for neither.
Every command that takes a model, and the README, load through here. Importing it imports no torch (every loader
imports what it needs), so the command line's ``--help`` lists the sources from here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base.checks import check_choice
from .base.io import check_regular_file

if TYPE_CHECKING:
    from .network.model import ViT


def _load_vit_einops(path: Path, **kwargs: Any) -> ViT:
    """A model file, a training run directory (its model.safetensors, else its checkpoint), or a checkpoint."""
    if path.is_dir() or path.name == "checkpoint.json":
        return _load_from_run(path, **kwargs)
    from .modelfile import load_vit

    return load_vit(path, **kwargs)


def _load_torchvision(path: Path, **kwargs: Any) -> ViT:
    from .interop.torchvision import load_torchvision

    return load_torchvision(path, **kwargs)


def _load_timm(path: Path, **kwargs: Any) -> ViT:
    from .interop.timm import load_timm

    return load_timm(path, **kwargs)


def _load_hf(path: Path, **kwargs: Any) -> ViT:
    from .interop.hf import load_hf

    return load_hf(path, **kwargs)


# The forms a model arrives in, each with its loader: ``--from`` on the command line, ``source=`` in Python.
SOURCES: dict[str, Callable[..., ViT]] = {
    "vit-einops": _load_vit_einops,
    "torchvision": _load_torchvision,
    "timm": _load_timm,
    "hf": _load_hf,
}


def load_model(path: str | os.PathLike, *, source: str | None = None, **kwargs: Any) -> ViT:
    """A ViT from any of the forms users hold, with its preprocessing and class names where known.

    - a vit-einops model file (``.safetensors`` from :func:`~vit_einops.save_vit`, ``vit-einops convert`` or
      ``train``);
    - a training run directory (holding ``model.safetensors`` or ``checkpoint/``), a checkpoint directory, or its
      ``checkpoint.json``;
    - a torchvision or timm state-dict file (``kwargs`` go to :func:`vit_einops.interop.load_torchvision` /
      :func:`~vit_einops.interop.load_timm`), with that library's preprocessing convention, and ImageNet-1k's class
      names when it has 1000 classes;
    - a Hugging Face ``save_pretrained`` directory, or its weights file next to config.json.

    ``source`` None recognises the form (:func:`detect_source`); naming it skips that. Every source takes
    ``attn_impl=`` (the attention path to run, as in :class:`~vit_einops.ViT`) and ``dtype=``.
    """
    if source is not None:
        check_choice("source", source, SOURCES)
    path = existing_model_path(path)
    return SOURCES[source or detect_source(path)](path, **kwargs)


def existing_model_path(path: str | os.PathLike, name: str = "path") -> Path:
    """``path`` as a Path that exists; ``name`` names the argument in the errors."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a model file or directory (str or os.PathLike), got {path!r}")
    if os.fspath(path) == "":
        # Path("") is ".": an empty string would load whatever model the current directory holds.
        raise ValueError(f"{name} is an empty string; expected a model file or directory")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model file or directory")
    return path


# Keys that a state dict of each form always holds, one set or another: its class token (timm and ours: E_pos, which
# SigLIP, with no class token, also has) and patch projection under that library's names; Hugging Face's CLIP and
# SigLIP towers by their patch projection and E_pos. A file's form is the one form whose keys it holds, read without
# the prefixes that Hugging Face's classifiers and older CLIP files put before the backbone
# (:data:`vit_einops.interop.hf_families.PREFIXES`).
KEY_SIGNATURES: dict[str, tuple[tuple[str, ...], ...]] = {
    "torchvision": (("class_token", "conv_proj.weight"),),
    "timm": (("pos_embed", "patch_embed.proj.weight"),),
    "hf": (
        ("embeddings.cls_token", "embeddings.patch_embeddings.projection.weight"),
        ("embeddings.patch_embedding.weight", "embeddings.position_embedding.weight"),
    ),
    "vit-einops": (("patch_embed.proj.weight", "patch_embed.pos_embed.weight"),),
}


def detect_source(path: str | os.PathLike) -> str:
    """The form (a key of :data:`SOURCES`) of the model file or directory at ``path``, read from it:

    - a directory: a training run or checkpoint directory (a ``model.safetensors`` that vit-einops wrote,
      ``checkpoint.json``, ``checkpoint/``) is "vit-einops"; else one with a ``config.json`` is "hf";
    - ``checkpoint.json``, or a safetensors file whose metadata says vit-einops: "vit-einops";
    - any other weights file (safetensors, or a .pth/.bin pickle read with ``torch.load(weights_only=True)``): the
      form whose keys it holds (:data:`KEY_SIGNATURES`).

    A file whose keys fit no form, or more than one, is a ValueError that lists what was found; it is never a guess.
    """
    path = existing_model_path(path)
    if path.is_dir():
        weights = path / "model.safetensors"
        if (path / "checkpoint.json").exists() or (path / "checkpoint").is_dir():
            return "vit-einops"
        if weights.is_file() and _is_vit_einops_file(weights):
            return "vit-einops"
        return "hf" if (path / "config.json").is_file() else "vit-einops"  # vit-einops explains an empty directory
    if path.name == "checkpoint.json":
        return "vit-einops"  # its loader refuses a FIFO or a directory there, and says why
    check_regular_file(path, "model file")  # a FIFO would block the reads below
    if path.suffix.lower() == ".safetensors" and _is_vit_einops_file(path):
        return "vit-einops"
    from .interop.hf_families import PREFIXES
    from .interop.io import state_dict_shapes

    keys = list(state_dict_shapes(path))
    held = set(keys) | {k.removeprefix(prefix) for k in keys for prefix in PREFIXES}
    fits = [name for name, signatures in KEY_SIGNATURES.items() if any(map(held.issuperset, signatures))]
    if len(fits) > 1:
        raise ValueError(
            f"{path}: ambiguous: its keys fit {' and '.join(fits)}; name its form with source= (--from)"
        )
    if not fits:
        shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
        expected = "; ".join(
            f"{name}: {' or '.join(', '.join(signature) for signature in signatures)}"
            for name, signatures in KEY_SIGNATURES.items()
        )
        raise ValueError(
            f"{path}: not a ViT state dict of a known form: its {len(keys)} keys ({shown or 'none'}) lack the keys "
            f"each form holds ({expected})"
        )
    if fits == ["vit-einops"]:
        raise ValueError(
            f"{path}: a vit-einops state dict without its config (no vit-einops metadata); save models with "
            f"save_vit, which records the config, or build the ViT and call its load_state_dict"
        )
    return fits[0]


def _is_vit_einops_file(path: Path) -> bool:
    """A safetensors file whose metadata says it is a vit-einops model file (an unreadable one says no)."""
    from safetensors import SafetensorError, safe_open

    from .modelfile import FORMAT_KEY, FORMAT_NAME

    try:
        with safe_open(path, framework="pt") as f:
            return (f.metadata() or {}).get(FORMAT_KEY) == FORMAT_NAME
    except (SafetensorError, ValueError, OSError):
        return False


def _load_from_run(path: Path, *, attn_impl: str | Sequence[str] | None = None, **overrides: Any) -> ViT:
    """A training run directory (its model.safetensors, else its checkpoint) or a checkpoint directory."""
    import torch

    from .network.config import ViTConfig
    from .modelfile import checked_class_names, load_vit
    from .preprocess import Preprocessing
    from .statedict import build_vit, check_free_fields, convert_patchify

    if path.is_dir() and (path / "model.safetensors").exists():
        return load_vit(path / "model.safetensors", attn_impl=attn_impl, **overrides)
    candidates = [path] if path.name == "checkpoint.json" else [path / "checkpoint.json", path / "checkpoint"]
    found = next((c for c in candidates if c.exists()), None)
    if found is None:
        if path.is_dir() and (path / "config.json").is_file():
            raise ValueError(f"{path}: looks like a Hugging Face directory (config.json); pass source='hf' (--from hf)")
        raise ValueError(
            f"{path}: a directory without model.safetensors or a training checkpoint (checkpoint.json); "
            f"expected a vit-einops model file, a training run or checkpoint directory"
        )
    from .train.checkpoint import load_checkpoint  # the tools' layer: imported only for a run

    dtype = overrides.pop("dtype", torch.float32)  # as load_vit's
    check_free_fields(overrides)
    checkpoint = load_checkpoint(found, dtype=dtype)
    config = ViTConfig.from_dict({**checkpoint.config.to_dict(), **overrides})
    state_dict = convert_patchify(dict(checkpoint.state_dict), config, checkpoint.config.patchify, config.patchify)
    model = build_vit(config, state_dict, "einsum" if attn_impl is None else attn_impl).eval()
    data = checkpoint.train_state.get("data") or {}
    classes = data.get("classes") if isinstance(data, dict) else None
    model.class_names = checked_class_names(classes, model.config.num_classes, f"{checkpoint.path} classes")
    model.preprocessing = Preprocessing.plain(model.config.image_size, model.config.in_channels)
    model.source = {"library": "vit-einops", "file": str(checkpoint.path)}
    return model
