"""The encoder: Eq. 2 and Eq. 3 as pre-norm residual blocks, composed so that print(model) shows them."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ._sequential import Sequential
from .attention import MultiHeadAttention
from .config import ViTConfig, check_config


class ResidualAdd(nn.Module):
    """fn(x) + x, out of place (the input tensor is never modified)."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.fn(x, **kwargs) + x


class FeedForwardBlock(Sequential):
    """The MLP of Eq. 3: Linear(D, mlp_dim), exact (erf) GELU, Dropout, Linear(mlp_dim, D), Dropout.

    Reads ``dim``, ``mlp_dim`` and ``dropout`` of its :class:`ViTConfig`. Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "FeedForwardBlock")
        super().__init__(
            OrderedDict(
                fc1=nn.Linear(config.dim, config.mlp_dim),
                act=nn.GELU(),  # approximate="none": the paper's GELU, not the tanh approximation
                drop1=nn.Dropout(config.dropout),
                fc2=nn.Linear(config.mlp_dim, config.dim),
                drop2=nn.Dropout(config.dropout),
            )
        )


class TransformerEncoderBlock(Sequential):
    """One layer l of the encoder, built from a :class:`ViTConfig`.

    ``attn``: z'_l = MSA(LN(z_{l-1})) + z_{l-1}   (Eq. 2)
    ``mlp``:  z_l  = MLP(LN(z'_l)) + z'_l         (Eq. 3)

    Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "TransformerEncoderBlock")
        super().__init__(
            OrderedDict(
                attn=ResidualAdd(
                    nn.Sequential(
                        OrderedDict(
                            norm=nn.LayerNorm(config.dim, eps=config.layer_norm_eps),
                            mha=MultiHeadAttention(config),
                        )
                    )
                ),
                mlp=ResidualAdd(
                    nn.Sequential(
                        OrderedDict(
                            norm=nn.LayerNorm(config.dim, eps=config.layer_norm_eps),
                            ff=FeedForwardBlock(config),
                        )
                    )
                ),
            )
        )


class TransformerEncoder(Sequential):
    """``config.depth`` TransformerEncoderBlocks in a row (l = 1..L). Shapes: (b, n, D) -> (b, n, D)."""

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "TransformerEncoder")
        super().__init__(*(TransformerEncoderBlock(config) for _ in range(config.depth)))
