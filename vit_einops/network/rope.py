"""2-D rotary position embedding (RoPE) of the patch tokens, as EVA-02 uses it (Fang et al. 2023; Su et al. 2021).

Axes: b batch, h heads, n tokens, d head size D_h; a patch grid of gh rows and gw columns, n' = gh gw patch tokens.

RoPE encodes a token's position by rotating its q and k, not by adding to x. Each head's d channels form d/2 pairs
(2m, 2m+1); a pair (a, b) is rotated by an angle theta, that is the complex number a + ib is multiplied by
e^{i theta}: (a cos theta - b sin theta, b cos theta + a sin theta). Written per channel, as timm's ``rot`` does:

    rope(x) = x * cos + rot(x) * sin,   rot: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)

with each angle repeated for the two channels of its pair ("interleaved" pairs of neighbours, not the "rotate half"
of GPT-NeoX and LLaMA that pairs channel m with m + d/2). The first d/2 channels (d/4 pairs) rotate with the patch's
row y, the last d/2 with its column x; pair m of each half turns at the frequency

    omega_m = temperature ** (-m / (d/4)),   m = 0 .. d/4 - 1,   temperature 10000,

by the angle theta = y omega_m (first half) or x omega_m (second half). A patch's coordinates are scaled to the
reference grid the model was pre-trained at (EVA's ``ref_feat_shape``, 16 x 16 for 224 / 14): row i of gh is at
y = i / gh * ref_h, column j of gw at x = j / gw * ref_w. At the reference grid they are the plain indices; at
another grid the positions span the same range [0, ref), as a resampled E_pos would. The table is computed from
the grid, never learned, so any grid works (timm's ``dynamic_img_size``).

Rotations keep each pair's length, and the dot product of two rotated pairs depends only on the difference of
their angles: q_i . k_j after RoPE is a function of q, k and the offset between the positions of tokens i and j.
Prefix tokens (class, distillation, register) have no grid position and are left as they are.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from einops import rearrange, repeat

from ..base.checks import check_nonnegative_int, check_positive_float, check_positive_int, to_pair


class RopeTable(NamedTuple):
    """The rotation of one input's tokens: ``prefix_tokens`` untouched, then n' patch tokens in row-major order
    whose pair angles give ``cos`` and ``sin``, each (n', d) (every angle twice, once per channel of its pair)."""

    cos: torch.Tensor
    sin: torch.Tensor
    prefix_tokens: int


class RotaryEmbedding:
    """The RoPE table of a patch grid (timm's ``RotaryEmbeddingCat(head_dim, in_pixels=False, ref_feat_shape=...)``).

    Args:
        head_dim: d, the size of one head; a multiple of 4 (d/4 pairs for each of the two axes).
        ref_grid: (ref_h, ref_w), the patch grid of pre-training, to which coordinates are scaled.
        temperature: the base of the frequencies omega_m (10000, as in RoFormer and EVA-02).

    ``rope(grid, prefix_tokens)`` gives the :class:`RopeTable` of an input whose patch grid is ``grid`` (gh, gw),
    its patch tokens following ``prefix_tokens`` others, computed on ``device`` in ``dtype`` (float32, as timm):
    nothing is stored (it is no nn.Module: no parameter, no buffer), so the state dict is empty and a model built on
    the meta device needs nothing filled in.
    """

    def __init__(self, head_dim: int, ref_grid: int | tuple[int, int], temperature: float = 10000.0) -> None:
        self.head_dim = check_positive_int("head_dim", head_dim)
        if head_dim % 4:
            raise ValueError(f"head_dim {head_dim} is not a multiple of 4: 2-D RoPE rotates d/4 channel pairs per axis")
        self.ref_grid = to_pair("ref_grid", ref_grid)
        self.temperature = check_positive_float("temperature", temperature)

    def __call__(
        self,
        grid: int | tuple[int, int],
        prefix_tokens: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> RopeTable:
        (gh, gw), (ref_h, ref_w) = to_pair("grid", grid), self.ref_grid
        bands = self.head_dim // 4
        omega = 1.0 / self.temperature ** (torch.arange(bands, device=device, dtype=dtype) / bands)
        y = torch.arange(gh, device=device, dtype=dtype) / gh * ref_h
        x = torch.arange(gw, device=device, dtype=dtype) / gw * ref_w
        angles = torch.cat(  # (gh, gw, d/2): the rows' d/4 angles, then the columns'
            (repeat(torch.outer(y, omega), "i m -> i j m", j=gw), repeat(torch.outer(x, omega), "j m -> i j m", i=gh)),
            dim=-1,
        )
        angles = repeat(angles, "i j m -> (i j) (m pair)", pair=2)
        return RopeTable(angles.cos(), angles.sin(), check_nonnegative_int("prefix_tokens", prefix_tokens))

    def __repr__(self) -> str:
        return f"RotaryEmbedding(head_dim={self.head_dim}, ref_grid={self.ref_grid}, temperature={self.temperature:g})"


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): each channel pair turned by 90 degrees (timm's ``rot``)."""
    a, b = rearrange(x, "... (m pair) -> pair ... m", pair=2)
    return rearrange([-b, a], "pair ... m -> ... (m pair)")


def apply_rope(x: torch.Tensor, rope: RopeTable) -> torch.Tensor:
    """``x`` (b, h, n, d) with its patch tokens rotated by ``rope`` and its prefix tokens as they are; the
    rotation runs in the table's dtype (float32 for a float16 x) and the result has x's dtype, as in timm."""
    p, rows = rope.prefix_tokens, rope.cos.shape[0]
    if x.shape[-2] != p + rows or x.shape[-1] != rope.cos.shape[-1]:
        raise ValueError(
            f"a RoPE table of {p} prefix tokens, {rows} patch tokens and head size {rope.cos.shape[-1]} does not fit "
            f"q, k of {x.shape[-2]} tokens and head size {x.shape[-1]}"
        )
    patches = x[..., p:, :]
    rotated = patches * rope.cos + rotate_pairs(patches) * rope.sin
    return torch.cat((x[..., :p, :], rotated.to(x.dtype)), dim=-2)
