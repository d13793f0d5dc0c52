"""Weights that move: torchvision, timm and Hugging Face ViTs into vit-einops and back, files and resolution.

    from vit_einops.interop import load_torchvision
    model = load_torchvision("vit_b_16.pth")   # config read off the state dict; heads from Table 1
    logits = model(images)

Requires the ``interop`` extra (safetensors). Neither torchvision nor timm is imported: conversion works on
state dicts alone. Features (pre-logits, intermediate layers, a frozen backbone, a new head) are the model's own
methods, as in timm: ``forward_head(..., pre_logits=True)``, ``forward_intermediates``, ``freeze_backbone``,
``reset_classifier``.
"""

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

