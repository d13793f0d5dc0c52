"""Weights that move: torchvision and timm ViTs into vit-einops and back, files, resolution and features.

    from vit_einops.interop import load_torchvision
    model = load_torchvision("vit_b_16.pth")   # config read off the state dict; heads from Table 1
    logits = model(images)

Requires the ``interop`` extra (safetensors). Neither torchvision nor timm is imported: conversion works on
state dicts alone.
"""

from .features import freeze_backbone, intermediate_layers, pre_logits, replace_head
from .io import load_state_dict_file, load_vit, read_vit_config, save_state_dict_file, save_vit
from .keys import HEADS_BY_DIM, StateDictMismatchError
from .resample import RESAMPLE_MODES, resample_pos_embed, resample_vit
from .timm import from_timm, load_timm, timm_config, timm_kwargs, to_timm
from .torchvision import from_torchvision, load_torchvision, to_torchvision, torchvision_config, torchvision_kwargs

__all__ = [
    "HEADS_BY_DIM",
    "RESAMPLE_MODES",
    "StateDictMismatchError",
    "freeze_backbone",
    "from_timm",
    "from_torchvision",
    "intermediate_layers",
    "load_state_dict_file",
    "load_timm",
    "load_torchvision",
    "load_vit",
    "pre_logits",
    "read_vit_config",
    "replace_head",
    "resample_pos_embed",
    "resample_vit",
    "save_state_dict_file",
    "save_vit",
    "timm_config",
    "timm_kwargs",
    "to_timm",
    "to_torchvision",
    "torchvision_config",
    "torchvision_kwargs",
]
