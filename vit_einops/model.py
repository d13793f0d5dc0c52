"""The Vision Transformer: PatchEmbedding (Eq. 1) -> TransformerEncoder (Eqs. 2-3) -> ClassificationHead (Eq. 4)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from ._checks import check_choice
from ._init import trunc_normal_
from ._sequential import Sequential
from .attention import MultiHeadAttention
from .blocks import TransformerEncoder
from .config import ATTN_IMPLS, ViTConfig
from .head import ClassificationHead
from .patch_embed import PatchEmbedding
from .preprocess import Preprocessing

# timm's default for every Linear in the encoder and head; the embeddings have their own init.
LINEAR_INIT_STD = 0.02


class ViT(Sequential):
    """Vision Transformer (Dosovitskiy et al. 2021), children ``patch_embed``, ``blocks``, ``head``.

    Every argument is keyword-only and is a field of :class:`ViTConfig` (see there for defaults and
    their sources); the validated config is kept as ``model.config``.

    Shapes: (b, C, H, W) float -> (b, num_classes) logits.
    """

    def __init__(self, **kwargs: Any) -> None:
        config = ViTConfig(**kwargs)
        super().__init__(
            OrderedDict(
                patch_embed=PatchEmbedding(
                    config.image_size,
                    config.patch_size,
                    config.in_channels,
                    config.dim,
                    config.dropout,
                    config.patchify,
                ),
                blocks=TransformerEncoder(
                    config.depth,
                    config.dim,
                    config.heads,
                    config.mlp_dim,
                    dropout=config.dropout,
                    attn_dropout=config.attn_dropout,
                    attn_impl=config.attn_impl,
                    layer_norm_eps=config.layer_norm_eps,
                ),
                head=ClassificationHead(
                    config.dim,
                    config.num_classes,
                    config.pool,
                    config.representation_size,
                    config.layer_norm_eps,
                    config.fc_norm,
                ),
            )
        )
        self.config = config
        # What a model file carries beside the weights (vit_einops.modelfile): plain attributes, set by the loaders
        # and by training, None when unknown.
        self.preprocessing: Preprocessing | None = None  # how an image becomes this model's input
        self.class_names: list[str] | None = None  # one name per logit
        self.source: dict[str, Any] | None = None  # where the weights came from (library, file)
        for module in (self.blocks, self.head):
            for m in module.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, LINEAR_INIT_STD)
                    nn.init.zeros_(m.bias)

    @classmethod
    def from_config(cls, config: ViTConfig) -> "ViT":
        return cls(**config.to_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return super().forward(x)

    def check_input(self, x: Any) -> None:
        """Raise TypeError/ValueError unless x is a float (b, C, H, W) tensor of this model's C, H, W."""
        c, (h, w) = self.config.in_channels, self.config.image_size
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape (b, {c}, {h}, {w}), got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point image tensor, got dtype {x.dtype}")
        if x.ndim != 4:
            raise ValueError(f"expected a 4-D tensor (b, {c}, {h}, {w}), got {x.ndim}-D of shape {tuple(x.shape)}")
        if x.shape[1] != c:
            raise ValueError(f"expected {c} channels, got {x.shape[1]} (input shape {tuple(x.shape)})")
        if tuple(x.shape[2:]) != (h, w):
            raise ValueError(
                f"expected height, width ({h}, {w}), got {tuple(x.shape[2:])} (input shape {tuple(x.shape)})"
            )

    def transforms(self) -> Preprocessing:
        """The callable that maps a PIL image to the (C, H, W) tensor this model expects, like torchvision's
        ``weights.transforms()``. Raises ValueError when the model records no preprocessing (a fresh model)."""
        if self.preprocessing is None:
            raise ValueError(
                "this model records no preprocessing; set one, e.g. model.preprocessing = "
                "Preprocessing.torchvision() (torchvision weights), Preprocessing.timm() (timm's augreg ViTs) or "
                f"Preprocessing.plain({self.config.image_size}, channels={self.config.in_channels}) (resize and scale to [0, 1], "
                "as vit-einops train)"
            )
        return self.preprocessing

    def set_attn_impl(self, impl: str) -> "ViT":
        """Switch every attention layer to ``impl`` ("einsum", "chunked" or "sdpa"); returns the model."""
        set_attn_impl(self, impl)
        self.config.attn_impl = impl
        return self


def set_attn_impl(model: nn.Module, impl: str) -> nn.Module:
    """Set ``impl`` on every MultiHeadAttention inside ``model``; returns the model."""
    check_choice("attention impl", impl, ATTN_IMPLS)
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.impl = impl
    return model
