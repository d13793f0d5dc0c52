"""Position-embedding resampling (paper, Section 3.2) without torchvision or timm.

The comparison with the libraries' own functions (torchvision's interpolate_embeddings, timm's
resample_abs_pos_embed) is in tests/test_interop_libs.py; here: the properties any correct resampling has.
"""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY_RGB, tiny_vit
from einops import rearrange, repeat

from vit_einops.interop import RESAMPLE_MODES, resample_pos_embed, resample_vit

MODES = sorted(RESAMPLE_MODES)
# float32 interpolation: each output is a weighted sum of 16 inputs (4 x 4 bicubic taps; more with antialiasing),
# rounding at eps 1.2e-7 per term, so a few 1e-7 relative; 1e-5 is far below any real error (a wrong cell is O(1)).
TOL = dict(rtol=1e-5, atol=1e-6)


def pos_embed(grid: tuple[int, int], dim: int = 6, prefix: int = 1) -> torch.Tensor:
    return torch.randn(1, prefix + grid[0] * grid[1], dim)


@pytest.mark.parametrize("mode", MODES)
def test_same_grid_is_the_identity(mode):
    pe = pos_embed((3, 5))
    assert resample_pos_embed(pe, (3, 5), (3, 5), mode=mode) is pe
    square = pos_embed((4, 4))
    assert resample_pos_embed(square, 4, mode=mode) is square


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("new_grid", [(7, 7), (2, 2), (3, 6)])
def test_class_row_kept_and_shape(mode, new_grid):
    pe = pos_embed((4, 4), prefix=1)
    out = resample_pos_embed(pe, new_grid, mode=mode)
    assert out.shape == (1, 1 + new_grid[0] * new_grid[1], 6)
    assert torch.equal(out[:, :1], pe[:, :1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("new_grid", [(8, 6), (1, 2)])
def test_constant_embedding_stays_constant(mode, new_grid):
    """Interpolation weights sum to one, the antialiasing filter's too: a constant field is reproduced."""
    pe = repeat(torch.randn(6), "d -> 1 n d", n=1 + 4 * 3).clone()
    out = resample_pos_embed(pe, new_grid, (4, 3), mode=mode)
    torch.testing.assert_close(out, repeat(pe[0, 0], "d -> 1 n d", n=out.shape[1]), **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_rows_and_columns_stay_rows_and_columns(mode):
    """Patch rows are (h w) row-major: a field varying only down the image must still vary only down it
    (a swapped h and w on this non-square grid would mix the two)."""
    old, new = (2, 5), (4, 3)
    field = torch.randn(old[0], 1, 6).expand(old[0], old[1], 6)  # one vector per image row
    pe = torch.cat([torch.zeros(1, 1, 6), rearrange(field, "h w d -> 1 (h w) d")], dim=1)
    out = rearrange(resample_pos_embed(pe, new, old, mode=mode)[:, 1:], "1 (h w) d -> h w d", h=new[0], w=new[1])
    torch.testing.assert_close(out, out[:, :1].expand_as(out), **TOL)


def test_torchvision_mode_keeps_the_corner_patches():
    """align_corners=True pins the four corner cells: they keep their embeddings exactly."""
    pe = pos_embed((3, 4))
    out = rearrange(resample_pos_embed(pe, (7, 9), (3, 4), mode="torchvision")[:, 1:], "1 (h w) d -> h w d", h=7)
    grid = rearrange(pe[:, 1:], "1 (h w) d -> h w d", h=3)
    for corner in [(0, 0), (0, -1), (-1, 0), (-1, -1)]:
        torch.testing.assert_close(out[corner], grid[corner], **TOL)


def test_the_two_conventions_differ():
    pe = pos_embed((6, 6))
    a, b = (resample_pos_embed(pe, (3, 3), mode=m) for m in ("torchvision", "timm"))
    assert (a - b).abs().max() > 1e-2


def test_dtype_is_kept():
    pe = pos_embed((4, 4)).double()
    assert resample_pos_embed(pe, 6).dtype == torch.float64
    assert resample_pos_embed(pe.to(torch.bfloat16), 6).dtype == torch.bfloat16


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown resample mode 'bilinear'"):
        resample_pos_embed(pos_embed((2, 2)), 3, mode="bilinear")
    with pytest.raises(ValueError, match=r"pos_embed must be a \(1, N, D\) tensor, got \(5, 6\)"):
        resample_pos_embed(torch.zeros(5, 6), 3)
    with pytest.raises(ValueError, match="6 patch rows, not a square grid; pass old_grid"):
        resample_pos_embed(pos_embed((2, 3)), 3)
    with pytest.raises(ValueError, match=r"old_grid \(3, 3\) has 9 cells, pos_embed 6 patch rows"):
        resample_pos_embed(pos_embed((2, 3)), 3, (3, 3))
    with pytest.raises(ValueError, match="new_grid must be a positive int"):
        resample_pos_embed(pos_embed((2, 2)), 0)


@pytest.mark.parametrize("mode", MODES)
def test_resample_vit(mode):
    model = tiny_vit(TINY_RGB, depth=1)  # one block: resampling touches only the position embedding
    same = resample_vit(model, 32, mode=mode).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(same(x), model(x))
    bigger = resample_vit(model, (48, 64), mode=mode)
    assert bigger.config.image_size == (48, 64) and model.config.image_size == (32, 32)
    expected = resample_pos_embed(model.patch_embed.pos_embed.weight, (6, 8), (4, 4), mode=mode)
    assert torch.equal(bigger.patch_embed.pos_embed.weight, expected)
    assert torch.equal(bigger.blocks[0].attn.mha.qkv.weight, model.blocks[0].attn.mha.qkv.weight)
    assert bigger(torch.randn(1, 3, 48, 64)).shape == (1, 5)
    with pytest.raises(ValueError, match="not divisible by patch"):
        resample_vit(model, 36, mode=mode)
