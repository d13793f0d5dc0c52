"""timm's ``VisionTransformer`` (vit_*_patch*_* with a class token) <-> vit-einops.

timm's names are closest to ours: ``blocks.i.attn.qkv`` is our fused ``qkv`` in the same (qkv h d)
layout, ``norm1``/``norm2`` the two pre-norms, ``mlp.fc1``/``mlp.fc2`` the MLP, ``norm`` the final LayerNorm and
``head`` the classifier (absent when timm's ``num_classes=0``).

Supported: a class token, with its own position row or without (``no_embed_class``, our ``pos_embed_prefix``),
register tokens (``reg_tokens``, key ``reg_token``), LayerScale (``init_values``, keys ``blocks.i.ls1.gamma`` and
``ls2.gamma``), biases on qkv, no pre-norm, and pooling ``global_pool="token"`` (our ``pool="cls"``) or
``global_pool="avg"`` (our ``pool="mean"``), with the final LayerNorm before pooling (timm's ``norm``) or after it
(timm's ``fc_norm``, its default for ``avg``; our ``fc_norm=True``).

Read off the state dict: P, C, D, L, MLP size, image size (square unless ``image_size`` is given), classes,
fc_norm (from the key ``fc_norm.weight``), register tokens, LayerScale, and whether E_pos covers the prefix tokens
(from its number of rows).
Not readable: the heads h (Table 1's by D unless given) and the pooling (``global_pool``, default "token").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._checks import check_choice, to_pair
from ..config import ViTConfig
from ..imagenet import assume_imagenet_names
from ..model import ViT
from ..statedict import build_vit, cast_weights, check_free_fields, check_state_dict
from ..preprocess import Preprocessing
from .io import load_state_dict_file
from .keys import (
    KeyLayout,
    count_blocks,
    infer_heads,
    infer_image_size,
    model_and_config,
    require,
)

SOURCE = "timm"
# timm's global_pool -> our pool.
GLOBAL_POOLS = {"token": "cls", "avg": "mean"}
# LayerScale's initial gamma is not in the weights (they hold the trained gamma): timm's default init_values.
LAYER_SCALE_INIT = 1e-5
_RULES = (
    (r"patch_embed\.proj\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"patch_embed\.cls_token\.weight", "cls_token"),
    (r"patch_embed\.reg_token\.weight", "reg_token"),
    (r"blocks\.(\d+)\.attn\.fn\.ls\.gamma", r"blocks.\1.ls1.gamma"),
    (r"blocks\.(\d+)\.mlp\.fn\.ls\.gamma", r"blocks.\1.ls2.gamma"),
    (r"patch_embed\.pos_embed\.weight", "pos_embed"),
    (r"blocks\.(\d+)\.attn\.fn\.norm\.(weight|bias)", r"blocks.\1.norm1.\2"),
    (r"blocks\.(\d+)\.attn\.fn\.mha\.qkv\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),
    (r"blocks\.(\d+)\.attn\.fn\.mha\.proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"blocks\.(\d+)\.mlp\.fn\.norm\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (r"blocks\.(\d+)\.mlp\.fn\.ff\.(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"head\.fc\.(weight|bias)", r"head.\1"),
)
# Our head.norm is timm's norm (before pooling) or fc_norm (after it, our fc_norm=True; timm's norm is then Identity).
LAYOUT = KeyLayout(SOURCE, (*_RULES, (r"head\.norm\.(weight|bias)", r"norm.\1")))
FC_NORM_LAYOUT = KeyLayout(SOURCE, (*_RULES, (r"head\.norm\.(weight|bias)", r"fc_norm.\1")))


def _layout(config: ViTConfig) -> KeyLayout:
    return FC_NORM_LAYOUT if config.fc_norm else LAYOUT


def timm_config(
    state_dict: Mapping[str, torch.Tensor],
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    global_pool: str = "token",
    pos_embed_prefix: bool | None = None,
    **overrides: Any,
) -> ViTConfig:
    """The ViTConfig of a timm ViT state dict.

    Args:
        state_dict: timm ``VisionTransformer.state_dict()`` (keys ``cls_token``, ``pos_embed``, ``blocks.i...``).
        heads: h; not stored in any shape, so by default Table 1's value for the width D.
        image_size: the checkpoint's (H, W); by default a square grid is assumed.
        global_pool: the timm model's ``global_pool``, "token" or "avg"; the state dicts of both have the same
            keys, so it cannot be inferred.
        pos_embed_prefix: whether pos_embed has rows for the class and register tokens (False: timm's
            no_embed_class); None reads it off the rows for a model with registers or LayerScale, and takes the
            paper's True for any other.
        **overrides: fields no tensor holds: dropout, attn_dropout, patchify, layer_norm_eps.
    """
    check_free_fields(overrides)
    check_choice("global_pool", global_pool, GLOBAL_POOLS)
    state_dict = check_state_dict(state_dict, SOURCE)
    if "cls_token" not in state_dict:
        raise ValueError("timm state dict has no cls_token; vit-einops needs a class token (class_token=True)")
    dim, in_channels, *patch = require(state_dict, "patch_embed.proj.weight", 4, SOURCE).shape
    pos = require(state_dict, "pos_embed", 3, SOURCE)
    fc1 = require(state_dict, "blocks.0.mlp.fc1.weight", 2, SOURCE)
    head = state_dict.get("head.weight")
    registers = require(state_dict, "reg_token", 3, SOURCE).shape[1] if "reg_token" in state_dict else 0
    layer_scale = "blocks.0.ls1.gamma" in state_dict
    if pos_embed_prefix is None:
        # Only the families with registers or LayerScale (DINOv2, DeiT III) drop the prefix rows; a plain ViT keeps
        # the paper's layout, so that its pos_embed rows alone say whether the grid is square.
        pos_embed_prefix = not (registers or layer_scale) or _pos_embed_prefix(
            pos.shape[1], 1 + registers, tuple(patch), image_size
        )
    elif not isinstance(pos_embed_prefix, bool):
        raise TypeError(f"pos_embed_prefix must be a bool or None, got {type(pos_embed_prefix).__name__}")
    return ViTConfig(
        image_size=infer_image_size(pos.shape[1] - (1 + registers) * pos_embed_prefix, tuple(patch), image_size, SOURCE),
        patch_size=tuple(patch),
        in_channels=in_channels,
        num_classes=0 if head is None else head.shape[0],
        dim=dim,
        depth=count_blocks(state_dict, r"blocks\.(\d+)\.", SOURCE),
        heads=infer_heads(dim, heads),
        mlp_dim=fc1.shape[0],
        pool=GLOBAL_POOLS[global_pool],
        fc_norm="fc_norm.weight" in state_dict,
        layer_scale=LAYER_SCALE_INIT if layer_scale else None,
        register_tokens=registers,
        pos_embed_prefix=pos_embed_prefix,
        **overrides,
    )


def _pos_embed_prefix(rows: int, prefix: int, patch: tuple[int, int], image_size: Any) -> bool:
    """Whether timm's pos_embed of ``rows`` rows covers the ``prefix`` tokens (no_embed_class=False) or the patch
    grid alone: the grid of ``image_size`` when given, else the one reading that leaves a square grid."""
    if image_size is not None:
        h, w = to_pair("image_size", image_size)
        return rows != (h // patch[0]) * (w // patch[1])  # a wrong size is refused by infer_image_size
    square = [n > 0 and round(n**0.5) ** 2 == n for n in (rows - prefix, rows)]
    if all(square):
        raise ValueError(
            f"the timm pos_embed has {rows} rows: a square grid both with its {prefix} prefix tokens' rows and "
            f"without them (no_embed_class); pass image_size=(H, W) to tell which"
        )
    return square[0] or not square[1]  # neither square: infer_image_size names the rows and asks for image_size


def from_timm(state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """A timm state dict renamed to ours for ``config``; every key and shape is checked
    (:class:`~vit_einops.statedict.StateDictMismatchError` lists what is missing, unexpected or mis-shaped)."""
    return _layout(config).to_ours(state_dict, config)


def to_timm(
    model_or_state: ViT | Mapping[str, torch.Tensor], config: ViTConfig | None = None
) -> dict[str, torch.Tensor]:
    """Our weights (a ViT, or its state dict plus ``config``) as a timm ``VisionTransformer`` state dict;
    build the timm model with :func:`timm_kwargs`."""
    state_dict, config = model_and_config(model_or_state, config)
    timm_kwargs(config)  # raises if timm's VisionTransformer cannot express this config
    return _layout(config).from_ours(state_dict, config)


def timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Arguments of ``timm.models.vision_transformer.VisionTransformer`` that build the architecture of ``config``."""
    if config.representation_size is not None:
        raise ValueError(
            f"timm's VisionTransformer has no pre-logits layer (representation_size {config.representation_size})"
        )
    if config.layer_norm_eps != 1e-6:
        raise ValueError(f"timm's LayerNorm eps is 1e-6, got layer_norm_eps {config.layer_norm_eps}")
    mlp_ratio = config.mlp_dim / config.dim
    if int(config.dim * mlp_ratio) != config.mlp_dim:  # timm builds int(dim * mlp_ratio) hidden units
        raise ValueError(f"timm cannot express mlp_dim {config.mlp_dim} as int(dim {config.dim} * mlp_ratio)")
    return dict(
        img_size=config.image_size,
        patch_size=config.patch_size,
        in_chans=config.in_channels,
        num_classes=config.num_classes,
        global_pool={v: k for k, v in GLOBAL_POOLS.items()}[config.pool],
        fc_norm=config.fc_norm,
        embed_dim=config.dim,
        depth=config.depth,
        num_heads=config.heads,
        mlp_ratio=mlp_ratio,
        qkv_bias=True,
        class_token=True,
        reg_tokens=config.register_tokens,
        no_embed_class=not config.pos_embed_prefix,
        init_values=config.layer_scale,
        proj_drop_rate=config.dropout,
        pos_drop_rate=config.dropout,
        attn_drop_rate=config.attn_dropout,
    )


def load_timm(
    source: str | os.PathLike | Mapping[str, torch.Tensor],
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    global_pool: str = "token",
    pos_embed_prefix: bool | None = None,
    dtype: torch.dtype | None = torch.float32,
    attn_impl: str | Sequence[str] = "einsum",
    **overrides: Any,
) -> ViT:
    """A ViT holding timm weights: from a file (safetensors, .pth, .bin) or a state dict.

    Args: as :func:`timm_config`; ``dtype`` casts the weights (None keeps theirs); ``attn_impl`` as in
    :class:`~vit_einops.ViT`. The model records timm's eval
    preprocessing for the augreg ViTs (``model.transforms()``: crop_pct 0.9, bicubic, mean = std = 0.5); set
    ``model.preprocessing`` for checkpoints trained otherwise (DeiT: ImageNet mean/std, crop_pct 0.875). Resample to another resolution afterwards with
    :func:`vit_einops.interop.resample_vit` (``mode="timm"`` matches timm's own).
    """
    state_dict = source if isinstance(source, Mapping) else load_state_dict_file(source)
    config = timm_config(
        state_dict,
        heads=heads,
        image_size=image_size,
        global_pool=global_pool,
        pos_embed_prefix=pos_embed_prefix,
        **overrides,
    )
    model = build_vit(config, from_timm(cast_weights(state_dict, SOURCE, dtype), config), attn_impl)
    model.preprocessing = Preprocessing.timm(crop=config.image_size)  # the augreg ViTs' crop_pct 0.9, bicubic, 0.5
    model.source = {"library": SOURCE, "file": None if isinstance(source, Mapping) else str(source)}
    assume_imagenet_names(model)  # the file holds no names; 1000 logits are ImageNet-1k's
    return model
