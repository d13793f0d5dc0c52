"""Weights that move: torchvision, timm and Hugging Face ViTs into vit-einops and back, files and resolution.

    from vit_einops.interop import load_torchvision
    model = load_torchvision("vit_b_16.pth")   # config read off the state dict; heads from Table 1
    logits = model(images)

Requires the ``interop`` extra (safetensors). Neither torchvision nor timm is imported: conversion works on
state dicts alone. Features (pre-logits, intermediate layers, a frozen backbone, a new head) are the model's own
methods, as in timm: ``forward_head(..., pre_logits=True)``, ``forward_intermediates``, ``freeze_backbone``,
``reset_classifier``.
"""

from collections.abc import Sequence
from typing import Any

import torch

from .._checks import check_index, check_nonnegative_int
from .._lazy import warn_deprecated
from ..model import ViT
from .hf import from_hf, hf_config, load_hf, preprocessing_from_hf, preprocessing_to_hf, save_hf, to_hf
from .io import load_state_dict_file, save_state_dict_file
from .keys import HEADS_BY_DIM
from .resample import RESAMPLE_MODES, resample_pos_embed, resample_vit
from .timm import from_timm, load_timm, timm_class, timm_config, timm_kwargs, to_timm
from .torchvision import from_torchvision, load_torchvision, to_torchvision, torchvision_config, torchvision_kwargs

__all__ = [
    "HEADS_BY_DIM",
    "RESAMPLE_MODES",
    "from_hf",
    "from_timm",
    "from_torchvision",
    "hf_config",
    "load_hf",
    "load_state_dict_file",
    "load_timm",
    "load_torchvision",
    "preprocessing_from_hf",
    "preprocessing_to_hf",
    "resample_pos_embed",
    "resample_vit",
    "save_hf",
    "save_state_dict_file",
    "timm_class",
    "timm_config",
    "timm_kwargs",
    "to_hf",
    "to_timm",
    "to_torchvision",
    "torchvision_config",
    "torchvision_kwargs",
]


# --- deprecated: the functional feature wrappers, kept for one release with a warning naming the model's method ---


def _check_vit(model: ViT) -> None:
    if not isinstance(model, ViT):
        raise TypeError(f"expected a vit_einops.ViT, got {type(model).__name__}")


def _pre_logits(model: ViT, x: torch.Tensor) -> torch.Tensor:
    _check_vit(model)
    return model.forward_head(model.forward_features(x), pre_logits=True)


def _intermediate_layers(model: ViT, x: torch.Tensor, layers: Sequence[int], *, norm: bool = False) -> list[Any]:
    """Every token of the blocks in ``layers``, in the order asked, the class token first in each (b, N, D)."""
    _check_vit(model)
    depth = len(model.blocks)
    if isinstance(layers, (int, str)) or not isinstance(layers, Sequence) or not layers:
        raise TypeError(f"layers must be a non-empty sequence of block indices, got {layers!r}")
    wanted = [check_index("layer index", i, depth, f"a ViT of depth {depth}") for i in layers]
    taken = sorted(set(wanted))
    pairs = model.forward_intermediates(
        x, taken, return_prefix_tokens=True, norm=norm, stop_early=True, output_fmt="NLC", intermediates_only=True
    )
    tokens = {i: torch.cat([prefix, patches], dim=1) for i, (patches, prefix) in zip(taken, pairs, strict=True)}
    return [tokens[i] for i in wanted]


def _replace_head(model: ViT, num_classes: int) -> ViT:
    """The paper's fine-tuning head swap: the tanh pre_logits layer goes too, then reset_classifier."""
    _check_vit(model)
    num_classes = check_nonnegative_int("num_classes", num_classes)  # before anything is removed
    if "pre_logits" in model.head._modules:
        del model.head.pre_logits
    model.reset_classifier(num_classes)
    return model


def _freeze_backbone(model: ViT) -> list[str]:
    _check_vit(model)
    return model.freeze_backbone()


_DEPRECATED_WRAPPERS = {
    "pre_logits": (_pre_logits, "model.forward_head(model.forward_features(x), pre_logits=True)"),
    "intermediate_layers": (
        _intermediate_layers,
        "model.forward_intermediates(x, layers, return_prefix_tokens=True, output_fmt='NLC', intermediates_only=True)"
        " or model.get_intermediate_layers(x, layers)",
    ),
    "replace_head": (_replace_head, "model.reset_classifier(num_classes) (after del model.head.pre_logits, if any)"),
    "freeze_backbone": (_freeze_backbone, "model.freeze_backbone()"),
}


def __getattr__(name: str) -> Any:
    if name not in _DEPRECATED_WRAPPERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    function, instead = _DEPRECATED_WRAPPERS[name]
    warn_deprecated(f"{__name__}.{name}", instead, stacklevel=2)
    return function
