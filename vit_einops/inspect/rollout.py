"""Attention rollout (Abnar and Zuidema 2020) and class-token attention, mapped back onto the patch grid.

Axes: l layers, b images, h heads, i queries, j keys, gh gw the patch grid. Tokens are in the order of the input's
``layout`` (:class:`~vit_einops.network.patch_embed.TokenLayout`): the prefix tokens, then the patches in row-major order.
"""

from __future__ import annotations

import torch
from einops import reduce

from ..base.checks import check_choice, check_dense_tensor, check_real_in_range
from ..network.patch_embed import TokenLayout
from .tokens import CLASS_TOKEN, check_layout

HEAD_FUSIONS = ("mean", "max", "min")


def check_maps(maps: torch.Tensor) -> None:
    """ValueError unless ``maps`` are attention maps (layers, b, h, n, n): a dense float tensor of at least one
    layer, its values finite and non-negative (each row a distribution over the keys, as softmax makes it)."""
    if not isinstance(maps, torch.Tensor) or maps.ndim != 5 or maps.shape[-1] != maps.shape[-2]:
        got = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise ValueError(f"expected attention maps (layers, b, h, n, n), got {got}")
    check_dense_tensor("maps", maps)
    if not maps.is_floating_point():
        raise TypeError(f"attention maps are floating point (softmax outputs), got dtype {maps.dtype}")
    if maps.numel() == 0:
        raise ValueError(f"the attention maps (layers, b, h, n, n) are empty: shape {tuple(maps.shape)}")
    if not torch.isfinite(maps).all():
        raise ValueError("the attention maps hold non-finite values (nan or inf)")
    if (maps < 0).any():
        raise ValueError(
            f"the attention maps hold negative values (down to {maps.min().item():.4g}); attention weights are "
            "softmax outputs, each row a distribution over the keys"
        )


def attention_rollout(maps: torch.Tensor, residual: float = 0.5, head_fusion: str = "mean") -> torch.Tensor:
    """How much each token's final state draws on each input token, through every layer.

    Per layer, heads are fused (mean by default), the residual connection is mixed in as
    ``A' = residual * I + (1 - residual) * A`` (Abnar and Zuidema use 0.5), rows are renormalised to sum to 1,
    and the layers are multiplied in order: ``R = A'_L ... A'_2 A'_1``. The maps are checked by :func:`check_maps`;
    with ``residual`` 0 a fused row of zeros cannot be renormalised, and is a ValueError.

    Shapes: maps (l, b, h, n, n) -> R (b, n, n); row i of R is token i's mixture over input tokens.
    """
    check_maps(maps)
    residual = check_real_in_range("residual", residual, 0.0, 1.0)
    check_choice("head_fusion", head_fusion, HEAD_FUSIONS)
    fused = reduce(maps, "l b h i j -> l b i j", head_fusion)
    eye = torch.eye(maps.shape[-1], dtype=maps.dtype, device=maps.device)
    mixed = residual * eye + (1.0 - residual) * fused
    totals = mixed.sum(dim=-1, keepdim=True)
    empty = (totals == 0).nonzero()
    if len(empty):
        layer, image, token = empty[0, :3].tolist()
        raise ValueError(
            f"with residual {residual:g}, the {head_fusion} of the heads' attention is all zeros in layer {layer}, "
            f"image {image}, row {token} ({len(empty)} such row{'s' * (len(empty) > 1)} in all): nothing to renormalise; use a residual above 0"
            + (" or another head_fusion" if head_fusion == "min" else "")
        )
    mixed = mixed / totals
    rollout = eye.expand_as(mixed[0])
    for layer in mixed:
        rollout = layer @ rollout  # layer l acts on what layers 1..l-1 already mixed
    return rollout


def class_attention_grid(attention: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The class token's row over the patch keys, laid out on the patch grid of ``layout`` (the recorded input's):
    every prefix token's column is skipped, so the map covers the patches alone. A model without a class token is
    refused with what to read instead (:func:`patch_attention_grid`).

    Shapes: (..., n, n) with n = layout.num_tokens -> (..., gh, gw).
    """
    if CLASS_TOKEN not in check_layout(layout, attention.shape[-1]).prefix:  # SigLIP: read the patches' own
        raise ValueError(
            "class_attention_grid reads the class token's row, but this model has none (prefix tokens "
            f"{layout.shown()}); use the mean over patch queries (patch_attention_grid) instead"
        )
    return layout.split(attention[..., layout.index(CLASS_TOKEN), :])[1]


def patch_attention_grid(attention: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The attention each patch receives from the patches, laid out on the grid: the mean over patch queries of
    their rows over the patch keys (prefix tokens' rows and columns skipped). The map to read where a model has
    no class token (SigLIP), or pools the mean of its patches.

    Shapes: (..., n, n) with n = layout.num_tokens -> (..., gh, gw).
    """
    queries = check_layout(layout, attention.shape[-1]).split(attention, dim=-2)[1]  # (..., gh, gw, n)
    return layout.split(reduce(queries, "... gh gw j -> ... j", "mean"))[1]
