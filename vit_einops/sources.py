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

from ._checks import check_choice

if TYPE_CHECKING:
    from .model import ViT


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
    - with ``source="torchvision"`` or ``"timm"``: a state-dict file of that library (``kwargs`` go to
      :func:`vit_einops.interop.load_torchvision` / :func:`~vit_einops.interop.load_timm`), with that library's
      preprocessing convention;
    - with ``source="hf"``: a Hugging Face ``save_pretrained`` directory, or its weights file next to config.json.

    Every source takes ``attn_impl=`` (the attention path to run, as in :class:`~vit_einops.ViT`) and ``dtype=``.
    """
    source = "vit-einops" if source is None else check_choice("source", source, SOURCES)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model file or directory")
    return SOURCES[source](path, **kwargs)


def _load_from_run(path: Path, *, attn_impl: str | Sequence[str] | None = None, **overrides: Any) -> ViT:
    """A training run directory (its model.safetensors, else its checkpoint) or a checkpoint directory."""
    from .config import ViTConfig
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

    checkpoint = load_checkpoint(found)
    check_free_fields(overrides)
    config = ViTConfig.from_dict({**checkpoint.config.to_dict(), **overrides})
    state_dict = convert_patchify(dict(checkpoint.state_dict), config, checkpoint.config.patchify, config.patchify)
    model = build_vit(config, state_dict, checkpoint.attn_impl if attn_impl is None else attn_impl).eval()
    data = checkpoint.train_state.get("data") or {}
    classes = data.get("classes") if isinstance(data, dict) else None
    model.class_names = checked_class_names(classes, model.config.num_classes, f"{checkpoint.path} classes")
    model.preprocessing = Preprocessing.plain(model.config.image_size, model.config.in_channels)
    model.source = {"library": "vit-einops", "file": str(checkpoint.path)}
    return model
