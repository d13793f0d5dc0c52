"""Weights that move: torchvision, timm and Hugging Face ViTs into vit-einops and back, files, resolution and features.

    from vit_einops.interop import load_torchvision
    model = load_torchvision("vit_b_16.pth")   # config read off the state dict; heads from Table 1
    logits = model(images)

Requires the ``interop`` extra (safetensors). Neither torchvision nor timm is imported: conversion works on
state dicts alone.
"""

from .features import freeze_backbone, intermediate_layers, pre_logits, replace_head
from .hf import from_hf, hf_config, load_hf, preprocessing_from_hf, preprocessing_to_hf, save_hf, to_hf
from .io import load_state_dict_file, save_state_dict_file
from .keys import HEADS_BY_DIM
from .resample import RESAMPLE_MODES, resample_pos_embed, resample_vit
from .timm import from_timm, load_timm, timm_config, timm_kwargs, to_timm
from .torchvision import from_torchvision, load_torchvision, to_torchvision, torchvision_config, torchvision_kwargs

__all__ = [
    "HEADS_BY_DIM",
    "RESAMPLE_MODES",
    "freeze_backbone",
    "from_hf",
    "from_timm",
    "from_torchvision",
    "hf_config",
    "intermediate_layers",
    "load_hf",
    "load_state_dict_file",
    "load_timm",
    "load_torchvision",
    "pre_logits",
    "preprocessing_from_hf",
    "preprocessing_to_hf",
    "replace_head",
    "resample_pos_embed",
    "resample_vit",
    "save_hf",
    "save_state_dict_file",
    "timm_config",
    "timm_kwargs",
    "to_hf",
    "to_timm",
    "to_torchvision",
    "torchvision_config",
    "torchvision_kwargs",
]
