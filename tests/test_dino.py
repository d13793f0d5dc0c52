"""DINO's view (Caron et al. 2021, Fig. 3): the 60% mask against a plain loop over each head's sorted weights and
against a line-by-line port of their visualize_attention.py; the class-token maps against the einsum path's
softmax output; hostile arguments with their exact messages."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from hypothesis import assume, given
from hypothesis import strategies as st

from vit_einops import TokenLayout
from vit_einops.inspect import DINO_KEEP, dino_mask, dino_view, record_attention

R = 3  # registers: not 1 or 4, so that an off-by-one or a hard-coded 4 shows


def loop_mass(weights: list[int]) -> list[Fraction]:
    """Each patch's share of the mass of every weight up to its own (its ties included), in exact arithmetic."""
    total = sum(weights)
    return [Fraction(sum(w for w in weights if w <= mine), total) for mine in weights]


def loop_mask(weights: list[int], keep: float) -> list[bool]:
    """The mask by hand: keep a patch when the mass of every weight up to its own (its ties included) exceeds
    1 - keep."""
    return [mass > 1 - Fraction(str(keep)) for mass in loop_mass(weights)]


def dino_reference(attentions: torch.Tensor, threshold: float) -> torch.Tensor:
    """Caron et al.'s visualize_attention.py (attentions (nh, N'), already the class row over the patches)."""
    val, idx = torch.sort(attentions)
    val /= torch.sum(val, dim=1, keepdim=True)
    cumval = torch.cumsum(val, dim=1)
    th_attn = cumval > (1 - threshold)
    idx2 = torch.argsort(idx)
    return torch.stack([th_attn[head][idx2[head]] for head in range(attentions.shape[0])])


@given(
    st.lists(st.lists(st.integers(0, 4), min_size=5, max_size=5).filter(any), min_size=1, max_size=4),
    st.sampled_from([0.1, 0.3, 0.6, 0.9, 1.0]),
)
def test_mask_equals_a_loop_over_each_heads_weights_ties_kept_together(rows, keep):
    # Small integer weights: many ties, and zero weights, which keep=1 still drops. A mass of exactly 1 - keep is
    # decided by float rounding (as in DINO's own code: [2, 2, 2, 3, 1] at keep 0.3 sums its four lightest to 0.7
    # or to 0.7 + 1 ulp depending on the order), so the loop, exact, is compared where no patch sits on that line.
    assume(all(mass != 1 - Fraction(str(keep)) for row in rows for mass in loop_mass(row)))
    weights = torch.tensor(rows, dtype=torch.float64)
    expected = torch.tensor([loop_mask(row, keep) for row in rows])
    assert torch.equal(dino_mask(weights, keep), expected)


def test_mask_equals_dinos_own_code_without_ties():
    torch.manual_seed(0)
    attentions = torch.rand(6, 49, dtype=torch.float64).softmax(-1)  # six heads over a 7x7 grid, no ties
    for keep in (0.25, DINO_KEEP, 0.95):
        assert torch.equal(dino_mask(attentions, keep), dino_reference(attentions.clone(), keep))


def test_mask_keeps_the_heaviest_patches_holding_at_least_keep_of_the_mass():
    torch.manual_seed(1)
    weights = torch.rand(2, 3, 16)
    mask = dino_mask(weights)
    assert mask.shape == (2, 3, 16) and mask.dtype == torch.bool
    share = weights / weights.sum(-1, keepdim=True)
    kept = (share * mask).sum(-1)
    assert (kept >= DINO_KEEP - 1e-6).all()
    # Each kept weight is above each dropped one, and dropping the lightest kept patch goes below keep.
    lightest_kept = share.masked_fill(~mask, torch.inf).min(-1).values
    assert (share.masked_fill(mask, -torch.inf).max(-1).values < lightest_kept).all()
    assert (kept - lightest_kept < DINO_KEEP).all()


def test_keep_one_keeps_every_patch_with_weight_and_equal_weights_are_all_kept():
    assert dino_mask(torch.tensor([0.0, 0.5, 0.0, 0.5]), 1.0).tolist() == [False, True, False, True]
    # No weight on any patch (all of it on prefix tokens, the rest underflowed): no mass, nothing kept.
    nothing = torch.tensor([[0.0, 0.0, 0.0], [0.2, 0.0, 0.0]])
    assert dino_mask(nothing, 1.0).tolist() == [[False, False, False], [True, False, False]]
    assert dino_mask(torch.full((9,), 1 / 9)).all()  # one tie group: split it and the mask would depend on order


@pytest.mark.parametrize(
    "keep, error, message",
    [
        (float("nan"), ValueError, "keep must be a float in (0, 1], got nan"),
        (float("inf"), ValueError, "keep must be a float in (0, 1], got inf"),
        (0, ValueError, "keep must be a float in (0, 1], got 0.0"),
        (-0.5, ValueError, "keep must be a float in (0, 1], got -0.5"),
        (2, ValueError, "keep must be a float in (0, 1], got 2.0"),
        (1.0000001, ValueError, "keep must be a float in (0, 1], got 1.0000001"),
        (True, TypeError, "keep must be a float in (0, 1], got True of type bool"),
        ("0.6", TypeError, "keep must be a float in (0, 1], got '0.6' of type str"),
    ],
)
def test_keep_outside_zero_one_is_refused_by_name(keep, error, message):
    with pytest.raises(error, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        dino_mask(torch.rand(4), keep)
    maps = torch.rand(1, 1, 1, 5, 5).softmax(-1)
    with pytest.raises(error, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        dino_view(maps, TokenLayout(("cls",), (2, 2)), keep=keep)


@pytest.mark.parametrize(
    "weights, error, message",
    [
        ([0.5, 0.5], TypeError, "class_attention must be a torch.Tensor, got list"),
        (torch.tensor([1, 2]), ValueError, r"floating-point weights over at least one patch .*torch.int64 \(2,\)"),
        (torch.zeros(3, 0), ValueError, r"floating-point weights over at least one patch .*torch.float32 \(3, 0\)"),
        (torch.tensor([0.5, float("nan")]), ValueError, r"non-finite values \(nan or inf\)"),
        (torch.tensor([0.5, float("inf")]), ValueError, r"non-finite values \(nan or inf\)"),
        (torch.tensor([0.5, -0.25]), ValueError, "must be >= 0, got a minimum of -0.25"),
    ],
)
def test_weights_that_are_not_attention_are_refused(weights, error, message):
    with pytest.raises(error, match=message):
        dino_mask(weights)


@pytest.mark.parametrize("prefix", [True, False])
def test_dino_view_reads_the_class_row_over_the_patches_skipping_the_registers(prefix):
    """Against A taken off the einsum path's softmax in the last block: row 0 (the class token), the columns after
    the class token and the R registers, on the 4x4 grid."""
    torch.manual_seed(2)
    model = tiny_vit(TINY_RGB16, register_tokens=R, layer_scale=1e-5, pos_embed_prefix=prefix)
    x = torch.rand(2, 3, 16, 16)
    seen = []
    hook = model.blocks[-1].attn.mha.attend.softmax.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        _, maps, layout = record_attention(model, x)
    finally:
        hook.remove()
    view = dino_view(maps, layout)
    expected = seen[0][:, :, 0, 1 + R :].reshape(2, 4, 4, 4)  # (b, h, gh, gw)
    torch.testing.assert_close(view.attention, expected, rtol=0, atol=1e-6)
    assert torch.equal(view.mask, dino_mask(view.attention.flatten(-2)).reshape(2, 4, 4, 4))
    first = dino_view(maps, layout, layer=0, keep=0.3)
    assert torch.equal(first.mask, dino_mask(first.attention.flatten(-2), 0.3).reshape(2, 4, 4, 4))


def test_dino_view_refuses_a_model_without_a_class_token_and_wrong_layouts():
    maps = torch.rand(2, 1, 3, 4, 4).softmax(-1)
    with pytest.raises(
        ValueError,
        match=r"^class_attention_grid reads the class token's row, but this model has none \(prefix tokens \(\)\); "
        r"use the mean over patch queries \(patch_attention_grid\) instead$",
    ):
        dino_view(maps, TokenLayout((), (2, 2)))
    with pytest.raises(ValueError, match=r"4 tokens do not fit the layout of 1 prefix tokens \('cls',\) and a 2x2"):
        dino_view(maps, TokenLayout(("cls",), (2, 2)))
    with pytest.raises(ValueError, match=r"layer 2 out of range for 2 recorded layers \(valid: -2..1\)"):
        dino_view(maps, TokenLayout(("cls",), (1, 3)), layer=2)
    with pytest.raises(ValueError, match=r"expected attention maps \(layers, b, h, n, n\), got \(1, 3, 4, 4\)"):
        dino_view(maps[0], TokenLayout(("cls",), (1, 3)))
