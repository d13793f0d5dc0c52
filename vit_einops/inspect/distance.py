"""Mean attention distance, the paper's Figure 7 (right) and Figure 11: how far in the image each head looks.

For query patch i, the attention-weighted mean of the pixel distances to key patches j; averaged over queries
and images, it gives one number per (layer, head), the analogue of a CNN's receptive field size.
"""

from __future__ import annotations

import torch
from einops import rearrange

from .._checks import to_pair


def patch_distances(grid_size: tuple[int, int], patch_size: int | tuple[int, int]) -> torch.Tensor:
    """Euclidean pixel distance between the centres of every pair of patches, (N', N'), row-major patch order."""
    (gh, gw), (ph, pw) = to_pair("grid_size", grid_size), to_pair("patch_size", patch_size)
    rows, cols = torch.meshgrid(torch.arange(gh) * float(ph), torch.arange(gw) * float(pw), indexing="ij")
    centres = rearrange(torch.stack([rows, cols], dim=-1), "gh gw yx -> (gh gw) yx").double()
    return torch.cdist(centres, centres)


def mean_attention_distance(
    maps: torch.Tensor, grid_size: tuple[int, int], patch_size: int | tuple[int, int]
) -> torch.Tensor:
    """Mean attention distance in pixels per layer and head.

    The class token is left out on both sides (it has no position in the image); each patch query's weights
    over the patch keys are renormalised to sum to 1, so the result is a weighted mean of distances.

    Shapes: maps (l, b, h, n, n) with n = gh * gw + 1 -> (l, h).
    """
    gh, gw = to_pair("grid_size", grid_size)
    if maps.ndim != 5 or maps.shape[-1] != maps.shape[-2] or maps.shape[-1] != gh * gw + 1:
        raise ValueError(f"expected maps (layers, b, h, n, n) with n = {gh}*{gw}+1, got {tuple(maps.shape)}")
    patches = maps[..., 1:, 1:].double()
    patches = patches / patches.sum(dim=-1, keepdim=True)
    distance = (patches * patch_distances((gh, gw), patch_size).to(patches.device)).sum(dim=-1)  # (l, b, h, i)
    return distance.mean(dim=(1, 3)).to(maps.dtype)
