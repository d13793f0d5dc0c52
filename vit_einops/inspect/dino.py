"""DINO's view of a ViT (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers", Fig. 3):
each head's class-token attention over the patches in the last layer, and the mask that keeps 60% of its mass.

The mask is their ``visualize_attention.py``'s: per head, the attention over the patches is normalised to sum to
1, sorted ascending and summed cumulatively; the patches whose cumulative sum exceeds ``1 - keep`` are kept, so
the highest patches whose mass adds up to about ``keep``. Tied weights are kept or dropped together (each patch
counts the whole mass of the weights up to its own, its ties included), so the mask depends on the values alone,
never on where the tied patches sit; without ties it is theirs exactly.

Axes: l layers, b images, h heads, j patches, gh gw the patch grid.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..base.checks import check_index, check_real
from ..network.patch_embed import TokenLayout
from .rollout import check_maps, class_attention_grid

DINO_KEEP = 0.6  # Caron et al.'s threshold: the mask keeps 60% of the attention mass


def _check_keep(keep: Any) -> float:
    expected = "a float in (0, 1]"
    keep = check_real("keep", keep, expected)
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be {expected}, got {keep}")
    return keep


def dino_mask(class_attention: torch.Tensor, keep: float = DINO_KEEP) -> torch.Tensor:
    """The patches that hold ``keep`` of the attention's mass (see the module docstring): a bool tensor of
    ``class_attention``'s shape.

    Args:
        class_attention: (..., j), attention weights over the patches along the last axis (any leading axes, e.g.
            (b, h, j)); non-negative and finite. They need not sum to 1: each row is normalised first, as DINO
            does once the class token's weight on the prefix tokens is dropped. A row of zeros (a head whose weight
            on every patch underflowed: it reads only prefix tokens) has no mass to keep: its mask is all False.
        keep: the share of the mass to keep, in (0, 1]; 1 keeps every patch with any weight.
    """
    keep = _check_keep(keep)
    if not isinstance(class_attention, torch.Tensor):
        raise TypeError(f"class_attention must be a torch.Tensor, got {type(class_attention).__name__}")
    if not class_attention.is_floating_point() or class_attention.ndim < 1 or class_attention.shape[-1] == 0:
        raise ValueError(
            "class_attention must be floating-point weights over at least one patch (..., patches), got "
            f"{class_attention.dtype} {tuple(class_attention.shape)}"
        )
    weights = class_attention.detach().double()
    if not torch.isfinite(weights).all():
        raise ValueError("class_attention contains non-finite values (nan or inf)")
    if (weights < 0).any():
        raise ValueError(f"class_attention must be >= 0, got a minimum of {weights.min().item():.3g}")
    total = weights.sum(dim=-1, keepdim=True)
    # A head whose weight on the patches all underflowed to 0 (it reads only prefix tokens) has no mass to keep.
    weights = weights / torch.where(total > 0, total, 1.0)
    ascending = weights.sort(dim=-1).values
    below = ascending.cumsum(dim=-1)  # below[k]: the mass of the k + 1 smallest weights
    # Each patch's position after its last tie in the ascending order: the mass up to and including its value.
    last_tie = torch.searchsorted(ascending.contiguous(), weights.contiguous(), right=True) - 1
    return (below.gather(-1, last_tie) > 1.0 - keep) & (total > 0)


class DinoView(NamedTuple):
    """:func:`dino_view`'s result: ``attention`` (b, h, gh, gw), each head's class-token attention over the patches
    as the model gave it (not renormalised), and ``mask`` (b, h, gh, gw), the patches :func:`dino_mask` keeps."""

    attention: torch.Tensor
    mask: torch.Tensor


def dino_view(maps: torch.Tensor, layout: TokenLayout, *, keep: float = DINO_KEEP, layer: int = -1) -> DinoView:
    """DINO's Fig. 3 for recorded attention: each head's class-token attention over the patches in ``layer`` (by
    default the last, as DINO draws) on the patch grid, and the mask keeping ``keep`` of its mass.

    Args:
        maps: (l, b, h, n, n), as :func:`~vit_einops.inspect.record_attention` or
            :class:`~vit_einops.inspect.AttentionRecorder` give them.
        layout: the recorded input's (``recorder.layout``): the class token's row is read, and every prefix
            token's column skipped (registers included). A model without a class token is refused.
    """
    check_maps(maps)
    layer = check_index("layer", layer, maps.shape[0], f"{maps.shape[0]} recorded layers")
    attention = class_attention_grid(maps[layer], layout)  # (b, h, gh, gw)
    mask = dino_mask(attention.flatten(-2), keep).unflatten(-1, layout.grid)
    return DinoView(attention, mask)
