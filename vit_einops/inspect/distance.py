"""Mean attention distance, the paper's Figure 7 (right) and Figure 11: how far in the image each head looks.

For query patch i, the attention-weighted mean of the pixel distances to key patches j; averaged over queries
and images, it gives one number per (layer, head), the analogue of a CNN's receptive field size.
"""

from __future__ import annotations

import torch
from einops import einsum, rearrange

from ..base.budget import check_memory
from ..base.checks import check_grid, to_pair
from ..network.patch_embed import TokenLayout
from .tokens import check_layout


def patch_distances(grid: tuple[int, int], patch_size: int | tuple[int, int]) -> torch.Tensor:
    """Euclidean pixel distance between the centres of every pair of patches of a (gh, gw) ``grid``, (N', N'),
    row-major patch order. The (N', N') float64 matrix is checked against the memory budget before it is
    allocated."""
    (gh, gw), (ph, pw) = check_grid("grid", grid), to_pair("patch_size", patch_size)
    patches = gh * gw
    check_memory(8 * patches**2, f"the pixel distances between every pair of {patches:,} patches ({gh}x{gw} grid)")
    rows, cols = torch.meshgrid(torch.arange(gh) * float(ph), torch.arange(gw) * float(pw), indexing="ij")
    centres = rearrange(torch.stack([rows, cols], dim=-1), "gh gw yx -> (gh gw) yx").double()
    return torch.cdist(centres, centres)


def distance_sums(
    maps: torch.Tensor, layout: TokenLayout, patch_size: int | tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two sums the mean attention distance is the ratio of, per layer, image and head (float64):

        weighted = sum_{i, j patches} A_ij d_ij,    mass = sum_{i, j patches} A_ij

    over patch queries i and patch keys j of ``layout`` (the prefix tokens have no position in the image), d_ij the
    pixel distance between the patch centres. Sums, not means, so batches combine by adding them.

    Shapes: maps (l, b, h, n, n) with n = layout.num_tokens -> ((l, b, h), (l, b, h)).
    """
    if maps.ndim != 5 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"expected maps (layers, b, h, n, n), got {tuple(maps.shape)}")
    patches = maps[..., check_layout(layout, maps.shape[-1]).patches, layout.patches].double()
    weighted = einsum(patches, patch_distances(layout.grid, patch_size).to(patches.device), "l b h i j, i j -> l b h")
    return weighted, patches.sum(dim=(-2, -1))


def mean_attention_distance(maps: torch.Tensor, layout: TokenLayout, patch_size: int | tuple[int, int]) -> torch.Tensor:
    """Mean attention distance in pixels per layer and head: the distance that the head's patch-to-patch
    attention travels, on average over all of it,

        D = sum_{b, i, j patches} A_bij d_ij / sum_{b, i, j patches} A_bij    (see :func:`distance_sums`),

    pooled over images b, patch queries i and patch keys j of ``layout`` (the prefix tokens' rows and columns
    skipped). Equivalently: each patch query's weights over the patch keys renormalised to sum to 1, their mean
    distance, averaged over queries weighted by the attention mass each query gives to patches. Where every query
    gives the patches the same mass (no prefix-token attention, or the same share everywhere) that is the plain mean
    over queries.

    A head that attends only to prefix tokens (all its patch queries put their whole weight on the class token or
    the registers, common in trained ViTs) sends no attention between patches: its distance is undefined and
    returned as nan. Tell such heads apart by their patch mass (``head_statistics(...)["patch_mass"]`` is 0),
    never by the nan alone. A query that puts only part of its weight on prefix tokens counts with the part it
    puts on patches.

    Shapes: maps (l, b, h, n, n) with n = layout.num_tokens -> (l, h), in maps' dtype.
    """
    weighted, mass = distance_sums(maps, layout, patch_size)
    return ratio_or_nan(weighted.sum(dim=1), mass.sum(dim=1)).to(maps.dtype)


def ratio_or_nan(weighted: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """weighted / mass, nan where mass is 0 (no attention between patches: the distance is undefined)."""
    return torch.where(mass > 0, weighted / torch.where(mass > 0, mass, 1), torch.nan)
