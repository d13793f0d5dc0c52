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


class LayerScale(nn.Module):
    """x * gamma, a learned per-channel scale on a residual branch (Touvron et al. 2021, CaiT; timm's LayerScale),
    gamma starting at ``init``. Shapes: (b, n, D) -> (b, n, D)."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"dim={self.gamma.shape[0]}, init={self.init:g}"


def _branch(config: ViTConfig, name: str, fn: nn.Module) -> ResidualAdd:
    """ResidualAdd(LayerNorm, fn[, LayerScale]): one pre-norm residual branch; ``ls`` when config.layer_scale."""
    stages = [("norm", nn.LayerNorm(config.dim, eps=config.layer_norm_eps)), (name, fn)]
    if config.layer_scale is not None:
        stages.append(("ls", LayerScale(config.dim, config.layer_scale)))
    return ResidualAdd(nn.Sequential(OrderedDict(stages)))


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), the GELU approximation OpenAI's CLIP was trained with (timm's and HF's quick_gelu)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(name: str) -> nn.Module:
    """The MLP nonlinearity ``name`` of ViTConfig.act: "gelu" exact (erf, the paper), "gelu_tanh" (the tanh
    approximation: HF's gelu_pytorch_tanh) or "quick_gelu"."""
    if name == "quick_gelu":
        return QuickGELU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class FeedForwardBlock(Sequential):
    """The MLP of Eq. 3: Linear(D, mlp_dim), GELU (exact, erf, unless ``config.act`` says otherwise), Dropout,
    Linear(mlp_dim, D), Dropout.

    Reads ``dim``, ``mlp_dim``, ``act`` and ``dropout`` of its :class:`ViTConfig`. Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "FeedForwardBlock")
        super().__init__(
            OrderedDict(
                fc1=nn.Linear(config.dim, config.mlp_dim),
                act=activation(config.act),
                drop1=nn.Dropout(config.dropout),
                fc2=nn.Linear(config.mlp_dim, config.dim),
                drop2=nn.Dropout(config.dropout),
            )
        )


class TransformerEncoderBlock(Sequential):
    """One layer l of the encoder, built from a :class:`ViTConfig`.

    ``attn``: z'_l = MSA(LN(z_{l-1})) + z_{l-1}   (Eq. 2)
    ``mlp``:  z_l  = MLP(LN(z'_l)) + z'_l         (Eq. 3)

    With ``config.layer_scale`` each branch ends in a :class:`LayerScale` ``ls`` (DINOv2, DeiT III): MSA and MLP
    outputs are scaled per channel before the addition.

    Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "TransformerEncoderBlock")
        super().__init__(
            OrderedDict(
                attn=_branch(config, "mha", MultiHeadAttention(config)),
                mlp=_branch(config, "ff", FeedForwardBlock(config)),
            )
        )


class TransformerEncoder(Sequential):
    """``config.depth`` TransformerEncoderBlocks in a row (l = 1..L). Shapes: (b, n, D) -> (b, n, D)."""

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "TransformerEncoder")
        super().__init__(*(TransformerEncoderBlock(config) for _ in range(config.depth)))
