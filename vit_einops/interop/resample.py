"""Position embeddings at a new resolution (paper, Section 3.2): 2-D interpolation of the patch rows, the class
token's row kept as it is.

A ViT's weights fit any image size but E_pos, which holds one row per patch of the training grid. The paper
fine-tunes at higher resolution by interpolating those rows "according to their location in the original image".
torchvision and timm both do so with bicubic interpolation, but not identically:
- "torchvision" (``interpolate_embeddings``): bicubic, ``align_corners=True``: the corner patches keep their
  embeddings exactly, the grid is stretched between them;
- "timm" (``resample_abs_pos_embed``): bicubic, ``align_corners=False``, ``antialias=True``: pixel-centre
  sampling, and a low-pass filter when shrinking the grid.
Pick the convention of the library the weights were trained with to reproduce its numbers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange

from .._budget import check_memory
from .._checks import check_choice, check_nonnegative_int, to_pair
from ..config import ViTConfig
from ..model import ViT
from ..statedict import build_vit

# F.interpolate arguments of each library's convention.
RESAMPLE_MODES: dict[str, dict[str, Any]] = {
    "torchvision": dict(mode="bicubic", align_corners=True, antialias=False),
    "timm": dict(mode="bicubic", align_corners=False, antialias=True),
}


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: int | tuple[int, int],
    old_grid: int | tuple[int, int] | None = None,
    *,
    num_prefix_tokens: int = 1,
    mode: str = "timm",
) -> torch.Tensor:
    """Interpolate the patch rows of a position embedding to a new patch grid.

    Args:
        pos_embed: (1, prefix + gh * gw, D), the ``num_prefix_tokens`` rows (the class token's) first,
            then the patch rows in row-major (h w) order.
        new_grid: (gh', gw') patches, or an int for a square grid.
        old_grid: (gh, gw) of ``pos_embed``; by default the patch rows are assumed to form a square.
        num_prefix_tokens: rows copied unchanged (1: the class token).
        mode: "torchvision" or "timm", see :data:`RESAMPLE_MODES`.

    Returns: (1, prefix + gh' * gw', D) in ``pos_embed``'s dtype; ``pos_embed`` itself when the grid is unchanged.
    Interpolation runs in float32 at least (bicubic is not implemented for half precision on every device).
    """
    options = RESAMPLE_MODES[check_choice("resample mode", mode, RESAMPLE_MODES)]
    if not isinstance(pos_embed, torch.Tensor) or pos_embed.ndim != 3 or pos_embed.shape[0] != 1:
        got = tuple(pos_embed.shape) if isinstance(pos_embed, torch.Tensor) else type(pos_embed).__name__
        raise ValueError(f"pos_embed must be a (1, N, D) tensor, got {got}")
    check_nonnegative_int("num_prefix_tokens", num_prefix_tokens)
    new_grid = to_pair("new_grid", new_grid)
    num_patches = pos_embed.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = round(max(num_patches, 0) ** 0.5)
        if num_patches <= 0 or side * side != num_patches:
            raise ValueError(f"pos_embed has {num_patches} patch rows, not a square grid; pass old_grid=(gh, gw)")
        old_grid = (side, side)
    old_grid = to_pair("old_grid", old_grid)
    if old_grid[0] * old_grid[1] != num_patches:
        raise ValueError(
            f"old_grid {old_grid} has {old_grid[0] * old_grid[1]} cells, pos_embed {num_patches} patch rows"
        )
    if new_grid == old_grid:
        return pos_embed
    # The new rows in float32 for the interpolation, in pos_embed's dtype, and once more concatenated.
    rows, dim = new_grid[0] * new_grid[1], pos_embed.shape[2]
    check_memory(
        rows * dim * (4 + 2 * pos_embed.element_size()),
        f"resampling the position embedding to a {new_grid[0]}x{new_grid[1]} grid ({rows:,} rows of {dim})",
    )
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    grid = rearrange(patches, "1 (h w) d -> 1 d h w", h=old_grid[0], w=old_grid[1])
    compute_dtype = torch.promote_types(grid.dtype, torch.float32)
    grid = F.interpolate(grid.to(compute_dtype), size=new_grid, **options).to(pos_embed.dtype)
    return torch.cat([prefix, rearrange(grid, "1 d h w -> 1 (h w) d")], dim=1)


def resample_vit(model: ViT, image_size: int | tuple[int, int], *, mode: str = "timm") -> ViT:
    """A new ViT for ``image_size`` with ``model``'s weights, its position embedding resampled to the new patch grid.

    The patch size stays; ``image_size`` must be divisible by it. ``model`` is left unchanged.
    """
    if not isinstance(model, ViT):
        raise TypeError(f"resample_vit expects a vit_einops.ViT, got {type(model).__name__}")
    config = ViTConfig.from_dict({**model.config.to_dict(), "image_size": list(to_pair("image_size", image_size))})
    state_dict = model.state_dict()
    key = "patch_embed.pos_embed.weight"
    prefix = config.num_prefix_tokens if config.pos_embed_prefix else 0  # rows copied unchanged
    state_dict[key] = resample_pos_embed(
        state_dict[key], config.grid_size, model.config.grid_size, num_prefix_tokens=prefix, mode=mode
    )
    return build_vit(config, state_dict, model.attn_impl).train(model.training)
