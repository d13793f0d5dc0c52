"""torchvision's ``VisionTransformer`` (vit_b_16, vit_b_32, vit_l_16, vit_l_32, vit_h_14) <-> vit-einops.

torchvision keeps the same tensors under other names: ``nn.MultiheadAttention.in_proj_weight`` is our
fused ``qkv`` in the same (qkv h d) layout, ``mlp.0``/``mlp.3`` are ``fc1``/``fc2``, ``encoder.ln`` is the final
LayerNorm of Eq. 4 and ``heads`` the classifier (``heads.pre_logits`` + tanh when ``representation_size`` is set).
Its LayerNorms use eps 1e-6, as ours do; its dropouts sit where ours do, so train-mode behaviour matches too.

Read off the state dict: patch size P and channels C (``conv_proj.weight``), width D, depth L (block count),
MLP size, image size (position rows and P; square unless ``image_size`` is given), classes and
representation size (``heads``). Not readable: the number of heads h (defaults to Table 1's by D).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..network.config import ViTConfig
from ..imagenet import assume_imagenet_names
from ..network.model import ViT
from ..statedict import build_vit, check_free_fields, check_state_dict
from ..preprocess import Preprocessing
from .io import weights_reader
from .keys import (
    ATTN_NORM,
    FF,
    MHA,
    MLP_NORM,
    KeyLayout,
    check_pos_rows,
    count_blocks,
    infer_heads,
    infer_image_size,
    model_and_config,
    require,
)

SOURCE = "torchvision"
_LAYER = r"encoder.layers.encoder_layer_\1"
LAYOUT = KeyLayout(
    SOURCE,
    (
        (r"patch_embed\.proj\.(weight|bias)", r"conv_proj.\1"),
        (r"patch_embed\.cls_token\.weight", "class_token"),
        (r"patch_embed\.pos_embed\.weight", "encoder.pos_embedding"),
        (ATTN_NORM + r"(weight|bias)", _LAYER + r".ln_1.\2"),
        (MHA + r"qkv\.(weight|bias)", _LAYER + r".self_attention.in_proj_\2"),
        (MHA + r"proj\.(weight|bias)", _LAYER + r".self_attention.out_proj.\2"),
        (MLP_NORM + r"(weight|bias)", _LAYER + r".ln_2.\2"),
        (FF + r"fc1\.(weight|bias)", _LAYER + r".mlp.0.\2"),
        (FF + r"fc2\.(weight|bias)", _LAYER + r".mlp.3.\2"),
        (r"head\.norm\.(weight|bias)", r"encoder.ln.\1"),
        (r"head\.pre_logits\.fc\.(weight|bias)", r"heads.pre_logits.\1"),
        (r"head\.fc\.(weight|bias)", r"heads.head.\1"),
    ),
)


# Checkpoints saved before torchvision's MLP refactor (pytorch/vision PR 6053, 2022) name the MLP layers
# linear_1/linear_2; torchvision renames them on load (MLPBlock._load_from_state_dict), and so do we.
_LEGACY_MLP = re.compile(r"(encoder\.layers\.encoder_layer_\d+\.mlp\.)linear_([12])\.(weight|bias)")


def upgrade_legacy_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``mlp.linear_1`` / ``mlp.linear_2`` (older torchvision checkpoints) renamed to ``mlp.0`` / ``mlp.3``."""
    state_dict = check_state_dict(state_dict, SOURCE)
    renamed = {}
    for key, value in state_dict.items():
        m = _LEGACY_MLP.fullmatch(key)
        renamed[f"{m[1]}{3 * (int(m[2]) - 1)}.{m[3]}" if m else key] = value
    return renamed


def torchvision_config(
    state_dict: Mapping[str, torch.Tensor],
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    **overrides: Any,
) -> ViTConfig:
    """The ViTConfig of a torchvision ViT state dict.

    Args:
        state_dict: torchvision ``VisionTransformer.state_dict()`` (keys ``conv_proj.weight``, ``encoder...``).
        heads: h; not stored in any shape, so by default Table 1's value for the width D
            (768 -> 12, 1024 -> 16, 1280 -> 16; 192 -> 3 and 384 -> 6 for the DeiT sizes).
        image_size: the checkpoint's (H, W); by default a square grid is assumed.
        **overrides: fields no tensor holds: dropout, attn_dropout, patchify, layer_norm_eps.
    """
    check_free_fields(overrides)
    state_dict = upgrade_legacy_keys(state_dict)
    dim, in_channels, *patch = require(state_dict, "conv_proj.weight", 4, SOURCE).shape
    pos = require(state_dict, "encoder.pos_embedding", 3, SOURCE)
    fc1 = require(state_dict, "encoder.layers.encoder_layer_0.mlp.0.weight", 2, SOURCE)
    head = require(state_dict, "heads.head.weight", 2, SOURCE)
    pre_logits = state_dict.get("heads.pre_logits.weight")
    check_pos_rows(pos, "encoder.pos_embedding", 1, SOURCE)
    return ViTConfig(
        image_size=infer_image_size(pos.shape[1] - 1, tuple(patch), image_size, SOURCE),
        patch_size=tuple(patch),
        in_channels=in_channels,
        num_classes=head.shape[0],
        dim=dim,
        depth=count_blocks(state_dict, r"encoder\.layers\.encoder_layer_(\d+)\.", SOURCE),
        heads=infer_heads(dim, heads),
        mlp_dim=fc1.shape[0],
        pool="cls",  # torchvision reads the class token, x[:, 0]
        representation_size=None if pre_logits is None else pre_logits.shape[0],
        **overrides,
    )


def from_torchvision(state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """A torchvision state dict (current or legacy MLP names) renamed to ours for ``config``; every key and shape
    is checked (:class:`~vit_einops.statedict.StateDictMismatchError` lists what is missing, unexpected or
    mis-shaped)."""
    return LAYOUT.to_ours(upgrade_legacy_keys(state_dict), config)


def to_torchvision(
    model_or_state: ViT | Mapping[str, torch.Tensor], config: ViTConfig | None = None
) -> dict[str, torch.Tensor]:
    """Our weights (a ViT, or its state dict plus ``config``) as a torchvision ``VisionTransformer`` state dict."""
    state_dict, config = model_and_config(model_or_state, config)
    torchvision_kwargs(config)  # raises if torchvision cannot express this config
    return LAYOUT.from_ours(state_dict, config)


def torchvision_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Arguments of ``torchvision.models.VisionTransformer`` that build the same architecture as ``config``."""
    (h, w), (ph, pw) = config.image_size, config.patch_size
    problems = []
    if h != w or ph != pw:
        problems.append(
            f"square images and patches only (image_size {config.image_size}, patch_size {config.patch_size})"
        )
    if config.in_channels != 3:
        problems.append(f"3 input channels only (in_channels {config.in_channels})")
    if config.num_classes == 0:
        problems.append("a classifier always (num_classes 0)")
    if config.pool != "cls":
        problems.append(f"class-token pooling only (pool {config.pool!r})")
    if config.layer_norm_eps != 1e-6:
        problems.append(f"LayerNorm eps 1e-6 (layer_norm_eps {config.layer_norm_eps})")
    if config.beyond_paper():
        problems.append(f"the paper's blocks and tokens only ({', '.join(config.beyond_paper())})")
    if problems:
        raise ValueError("torchvision's VisionTransformer cannot express this config: it has " + "; ".join(problems))
    return dict(
        image_size=h,
        patch_size=ph,
        num_layers=config.depth,
        num_heads=config.heads,
        hidden_dim=config.dim,
        mlp_dim=config.mlp_dim,
        dropout=config.dropout,
        attention_dropout=config.attn_dropout,
        num_classes=config.num_classes,
        representation_size=config.representation_size,
    )


def load_torchvision(
    source: str | os.PathLike | Mapping[str, torch.Tensor],
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    dtype: torch.dtype | None = torch.float32,
    attn_impl: str | Sequence[str] = "einsum",
    **overrides: Any,
) -> ViT:
    """A ViT holding torchvision weights: from a file (safetensors, .pth, .bin) or a state dict.

    Args: as :func:`torchvision_config`; ``dtype`` casts the weights (None keeps theirs); ``attn_impl`` as in
    :class:`~vit_einops.ViT`. The model records
    torchvision's preprocessing (``model.transforms()``: shorter side to 256, centre crop 224 at 224 px, ImageNet
    mean and std). Resample to another resolution afterwards with
    :func:`vit_einops.interop.resample_vit` (``mode="torchvision"`` matches torchvision's own).
    """
    shapes, read = weights_reader(source, SOURCE)
    config = torchvision_config(shapes, heads=heads, image_size=image_size, **overrides)
    model = build_vit(config, from_torchvision(read(config, dtype), config), attn_impl)
    model.preprocessing = Preprocessing.torchvision(crop=config.image_size)
    model.source = {"library": SOURCE, "file": None if isinstance(source, Mapping) else str(source)}
    assume_imagenet_names(model)  # the file holds no names; 1000 logits are ImageNet-1k's
    return model
