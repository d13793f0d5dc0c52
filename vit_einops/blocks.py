"""The encoder: Eq. 2 and Eq. 3 as pre-norm residual blocks, composed so that print(model) shows them."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from ._checks import check_positive_float, check_positive_int, check_probability
from ._sequential import Sequential
from .attention import MultiHeadAttention
from .config import normalize_attn_impl


class ResidualAdd(nn.Module):
    """fn(x) + x, out of place (the input tensor is never modified)."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.fn(x, **kwargs) + x


class FeedForwardBlock(Sequential):
    """The MLP of Eq. 3: Linear(D, mlp_dim), exact (erf) GELU, Dropout, Linear(mlp_dim, D), Dropout.

    Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, dim: int, mlp_dim: int, dropout: float = 0.0) -> None:
        check_positive_int("dim", dim)
        check_positive_int("mlp_dim", mlp_dim)
        p = check_probability("dropout", dropout)
        super().__init__(
            OrderedDict(
                fc1=nn.Linear(dim, mlp_dim),
                act=nn.GELU(),  # approximate="none": the paper's GELU, not the tanh approximation
                drop1=nn.Dropout(p),
                fc2=nn.Linear(mlp_dim, dim),
                drop2=nn.Dropout(p),
            )
        )


class TransformerEncoderBlock(Sequential):
    """One layer l of the encoder.

    ``attn``: z'_l = MSA(LN(z_{l-1})) + z_{l-1}   (Eq. 2)
    ``mlp``:  z_l  = MLP(LN(z'_l)) + z'_l         (Eq. 3)

    Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_dim: int,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        attn_impl: str = "einsum",
        layer_norm_eps: float = 1e-6,
    ) -> None:
        layer_norm_eps = check_positive_float("layer_norm_eps", layer_norm_eps)
        super().__init__(
            OrderedDict(
                attn=ResidualAdd(
                    nn.Sequential(
                        OrderedDict(
                            norm=nn.LayerNorm(dim, eps=layer_norm_eps),
                            mha=MultiHeadAttention(
                                dim, heads, dropout=dropout, attn_dropout=attn_dropout, impl=attn_impl
                            ),
                        )
                    )
                ),
                mlp=ResidualAdd(
                    nn.Sequential(
                        OrderedDict(
                            norm=nn.LayerNorm(dim, eps=layer_norm_eps),
                            ff=FeedForwardBlock(dim, mlp_dim, dropout),
                        )
                    )
                ),
            )
        )


class TransformerEncoder(Sequential):
    """``depth`` TransformerEncoderBlocks in a row (l = 1..L). Shapes: (b, n, D) -> (b, n, D).

    ``attn_impl`` is one impl for every block, or a sequence of ``depth`` impls, one per block.
    """

    def __init__(
        self, depth: int, dim: int, heads: int, mlp_dim: int, attn_impl: str | Sequence[str] = "einsum", **block_kwargs
    ) -> None:
        depth = check_positive_int("depth", depth)
        impls = normalize_attn_impl(attn_impl, depth)
        impls = (impls,) * depth if isinstance(impls, str) else impls
        super().__init__(
            *(TransformerEncoderBlock(dim, heads, mlp_dim, attn_impl=impl, **block_kwargs) for impl in impls)
        )
