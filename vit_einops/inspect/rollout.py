"""Attention rollout (Abnar and Zuidema 2020) and class-token attention, mapped back onto the patch grid.

Axes: l layers, b images, h heads, i queries, j keys, gh gw the patch grid.
"""

from __future__ import annotations

import torch
from einops import rearrange, reduce

from .._checks import check_choice

HEAD_FUSIONS = ("mean", "max", "min")


def _check_maps(maps: torch.Tensor) -> None:
    if not isinstance(maps, torch.Tensor) or maps.ndim != 5 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(
            f"expected attention maps (layers, b, h, n, n), got {getattr(maps, 'shape', type(maps).__name__)}"
        )


def attention_rollout(maps: torch.Tensor, residual: float = 0.5, head_fusion: str = "mean") -> torch.Tensor:
    """How much each token's final state draws on each input token, through every layer.

    Per layer, heads are fused (mean by default), the residual connection is mixed in as
    ``A' = residual * I + (1 - residual) * A`` (Abnar and Zuidema use 0.5), rows are renormalised to sum to 1,
    and the layers are multiplied in order: ``R = A'_L ... A'_2 A'_1``.

    Shapes: maps (l, b, h, n, n) -> R (b, n, n); row i of R is token i's mixture over input tokens.
    """
    _check_maps(maps)
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    check_choice("head_fusion", head_fusion, HEAD_FUSIONS)
    fused = reduce(maps, "l b h i j -> l b i j", head_fusion)
    eye = torch.eye(maps.shape[-1], dtype=maps.dtype, device=maps.device)
    mixed = residual * eye + (1.0 - residual) * fused
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)
    rollout = eye.expand_as(mixed[0])
    for layer in mixed:
        rollout = layer @ rollout  # layer l acts on what layers 1..l-1 already mixed
    return rollout


def class_attention_grid(attention: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
    """The class token's row (query 0) over the patch keys, laid out on the patch grid.

    Shapes: (..., n, n) with n = gh * gw + 1 -> (..., gh, gw). The class token's weight on itself is dropped.
    """
    gh, gw = grid_size
    if attention.shape[-1] != gh * gw + 1:
        raise ValueError(
            f"attention over {attention.shape[-1]} tokens does not fit a {gh}x{gw} grid plus the class token"
        )
    return rearrange(attention[..., 0, 1:], "... (gh gw) -> ... gh gw", gh=gh, gw=gw)


def last_layer_class_attention(maps: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
    """Each head's class-token attention in the last recorded layer: maps (l, b, h, n, n) -> (b, h, gh, gw)."""
    _check_maps(maps)
    return class_attention_grid(maps[-1], grid_size)
