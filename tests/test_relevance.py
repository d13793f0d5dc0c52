"""Gradient-weighted relevance, attention entropy, class-token share and token norms, each against an independent
computation: closed forms, torch.distributions, Chefer et al.'s own recipe (a gradient hook on the einsum path's
softmax output), central finite differences, and a 2-layer case worked out by hand."""

import math

import pytest
import torch
from _equiv import chefer_reference
from _tiny import TINY_DIGITS, tiny_vit

from vit_einops import TokenLayout
from vit_einops.network.kernels import ATTN_IMPLS
from vit_einops.inspect import (
    attention_entropy,
    attention_gradients,
    attention_relevance,
    prefix_token_share,
    head_statistics,
    mean_attention_distance,
    record_attention,
    relevance_from_gradients,
    token_norms,
)

# Three blocks: rollout and relevance compose over layers, and a middle layer is neither first nor last.
TINY = dict(TINY_DIGITS, num_classes=5, depth=3)


# --- entropy ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 17, 197])
def test_entropy_of_uniform_rows_is_log_n(n):
    rows = torch.full((3, 4, n), 1.0 / n, dtype=torch.float64)
    torch.testing.assert_close(attention_entropy(rows), torch.full((3, 4), math.log(n), dtype=torch.float64))


def test_entropy_of_one_hot_rows_is_zero():
    rows = torch.eye(7, dtype=torch.float64)[torch.tensor([0, 3, 6])]
    assert torch.equal(attention_entropy(rows), torch.zeros(3, dtype=torch.float64))


def test_entropy_of_masked_rows_counts_only_the_allowed_keys_and_is_never_nan():
    # A masked key has weight exactly 0 (softmax of -inf): 0 log 0 must count as 0, not nan.
    scores = torch.randn(2, 3, 9, 9)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()  # query i may attend to keys 0..i
    rows = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    h = attention_entropy(rows)
    assert torch.isfinite(h).all()
    assert torch.equal(h[..., 0], torch.zeros(2, 3))  # query 0 sees one key
    uniform_masked = (mask.double() / mask.sum(-1, keepdim=True)).expand(2, 9, 9)
    torch.testing.assert_close(attention_entropy(uniform_masked), torch.arange(1, 10).double().log().expand(2, 9))


def test_entropy_of_recorded_maps_equals_torch_distributions():
    _, maps, _ = record_attention(tiny_vit(TINY), torch.rand(2, 1, 8, 8))
    expected = torch.distributions.Categorical(probs=maps).entropy()
    torch.testing.assert_close(attention_entropy(maps), expected, rtol=1e-5, atol=1e-6)
    assert ((0 <= expected) & (expected <= math.log(maps.shape[-1]) + 1e-5)).all()


@pytest.mark.parametrize(
    "rows, error, match",
    [
        ([[0.5, 0.5]], TypeError, "torch.Tensor"),
        (torch.tensor([[0.5, float("nan")]]), ValueError, "non-finite"),
        (torch.tensor([[1.5, -0.5]]), ValueError, ">= 0"),
        (torch.tensor([[0.2, 0.2]]), ValueError, "sum to 1"),
        (torch.tensor([[1, 0]]), ValueError, "floating-point"),
    ],
)
def test_entropy_rejects_what_is_not_a_distribution(rows, error, match):
    with pytest.raises(error, match=match):
        attention_entropy(rows)


# --- class-token share, token norms, per-head statistics ---------------------------------------------------------


def test_prefix_token_share_of_the_class_token_closed_forms():
    n, layout = 5, TokenLayout(("cls",), (2, 2))
    uniform = torch.full((1, 1, 1, n, n), 1.0 / n)
    torch.testing.assert_close(prefix_token_share(uniform, layout), torch.full((1, 1, 1, 1), 1.0 / n))
    sink = torch.zeros(1, 1, 1, n, n)
    sink[..., 0] = 1.0  # every query reads only the class token
    assert torch.equal(prefix_token_share(sink, layout), torch.ones(1, 1, 1, 1))
    mixed = torch.eye(n)[None, None, None].clone()  # each token reads itself ...
    mixed[..., 1:3, :] = torch.tensor([0.25, 0.75, 0.0, 0.0, 0.0])  # ... except patches 1 and 2
    # patch queries 1..4 put 0.25, 0.25, 0, 0 on the class token; the class token's own row is left out.
    torch.testing.assert_close(prefix_token_share(mixed, layout), torch.full((1, 1, 1, 1), 0.125))


def test_prefix_token_share_rejects_rows_that_are_not_square_maps():
    with pytest.raises(ValueError, match=r"\(layers, b, h, n, n\)"):
        prefix_token_share(torch.full((2, 3, 4), 0.25), TokenLayout(("cls",), (1, 3)))


def test_token_norms_are_the_lengths_of_each_block_output():
    model = tiny_vit(TINY)
    x = torch.rand(2, 1, 8, 8)
    out, norms, layout = token_norms(model, x)
    assert torch.equal(out, model(x))  # the hooks leave the output alone, and are gone afterwards
    z = model.patch_embed(x)
    expected = []
    for block in model.blocks:
        z = block(z)
        expected.append(torch.linalg.vector_norm(z, dim=-1))
    torch.testing.assert_close(norms, torch.stack(expected), rtol=0, atol=0)
    assert norms.shape == (3, 2, 17) and layout == model.patch_embed.layout()


def test_head_statistics_per_image_match_the_shared_functions():
    model = tiny_vit(TINY)
    _, maps, layout = record_attention(model, torch.rand(3, 1, 8, 8))
    stats = head_statistics(maps, layout, 2)
    names = ("distance", "patch_mass", "entropy")
    assert {k: v.shape for k, v in stats.items()} == {**{k: (3, 3, 2) for k in names}, "prefix_share": (3, 3, 2, 1)}
    torch.testing.assert_close(stats["distance"][:, 1], mean_attention_distance(maps[:, 1:2], layout, 2))
    # The pooled distance is the per-image ones weighted by the attention mass each image sends between patches.
    mass = stats["patch_mass"]
    pooled = (stats["distance"] * mass).sum(1) / mass.sum(1)
    torch.testing.assert_close(pooled, mean_attention_distance(maps, layout, 2))
    torch.testing.assert_close(mass, 1 - stats["prefix_share"][..., 0])
    torch.testing.assert_close(stats["entropy"], attention_entropy(maps).mean(-1))


# --- relevance ---------------------------------------------------------------------------------------------------


def test_relevance_is_the_same_on_every_attention_impl():
    torch.manual_seed(3)
    model = tiny_vit(TINY).double()
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    targets = torch.tensor([[0, 4], [1, 2], [3, 3]])
    got = {}
    for impl in ATTN_IMPLS:
        model.set_attn_impl(impl)
        got[impl] = (attention_relevance(model, x), attention_relevance(model, x, targets))
    for impl in ATTN_IMPLS:
        for a, b in zip(got[impl], got["einsum"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert got["einsum"][0].shape == (3, 17, 17) and got["einsum"][1].shape == (3, 2, 17, 17)
    # Predicted class by default: the relevance for target=None is that for the argmax class, on the same kernel
    # (each kernel runs its own forward and backward, equal to the others' within rounding only).
    predicted = model(x).argmax(-1)
    torch.testing.assert_close(got[model.attn_impl][0], attention_relevance(model, x, predicted), rtol=0, atol=0)


@pytest.mark.parametrize("registers", [0, 3])
@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_relevance_matches_chefers_recipe_on_the_einsum_softmax(impl, registers):
    torch.manual_seed(4)
    model = tiny_vit(TINY, register_tokens=registers).double()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    target = torch.tensor([2, 0])
    expected = chefer_reference(model, x, lambda m, x: m(x)[torch.arange(len(x)), target])
    model.set_attn_impl(impl)
    torch.testing.assert_close(attention_relevance(model, x, target), expected, rtol=0, atol=1e-10)
    assert all(p.grad is None for p in model.parameters())  # attention_relevance leaves .grad alone


def test_attention_gradients_match_central_finite_differences():
    """dy_t/dA_l[i, j] for a few entries: nudge that entry of A (a hook on the einsum softmax) by +-eps, rerun,
    and difference the logit. Later layers react to the nudge in both computations."""
    torch.manual_seed(5)
    model = tiny_vit(TINY, depth=2).double().set_attn_impl("sdpa")
    x = torch.rand(1, 1, 8, 8, dtype=torch.float64)
    logits, _, grads, targets = attention_gradients(model, x, 3)
    assert targets.tolist() == [[3]]
    torch.testing.assert_close(logits, model(x), rtol=0, atol=1e-12)
    model.set_attn_impl("einsum")
    eps = 1e-6
    for layer, head, i, j in [(0, 0, 0, 5), (0, 1, 7, 0), (1, 0, 0, 16), (1, 1, 3, 3)]:

        def logit(delta, layer=layer, head=head, i=i, j=j):
            def nudge(_module, _args, attn):
                attn = attn.clone()
                attn[0, head, i, j] += delta
                return attn

            h = model.blocks[layer].attn.mha.attend.softmax.register_forward_hook(nudge)
            try:
                with torch.no_grad():
                    return model(x)[0, 3].item()
            finally:
                h.remove()

        numeric = (logit(eps) - logit(-eps)) / (2 * eps)
        assert grads[0, layer, 0, head, i, j].item() == pytest.approx(numeric, rel=1e-6, abs=1e-9)
    assert grads.abs().sum() > 0


def test_relevance_rule_on_a_two_layer_case_worked_by_hand():
    # n = 2 tokens, 2 heads, 1 image. Element-wise products G * A, then the positive part, then the head mean:
    A1 = torch.tensor([[[0.5, 0.5], [0.25, 0.75]], [[1.0, 0.0], [0.5, 0.5]]])
    G1 = torch.tensor([[[2.0, -2.0], [4.0, 0.0]], [[1.0, 3.0], [-2.0, 2.0]]])
    # head 0: [[1, -1], [1, 0]] -> [[1, 0], [1, 0]];  head 1: [[1, 0], [-1, 1]] -> [[1, 0], [0, 1]]
    # Abar1 = mean = [[1, 0], [0.5, 0.5]];  R1 = I + Abar1 I = [[2, 0], [0.5, 1.5]]
    A2 = torch.tensor([[[0.5, 0.5], [0.5, 0.5]], [[0.0, 1.0], [1.0, 0.0]]])
    G2 = torch.tensor([[[0.0, 2.0], [2.0, 0.0]], [[0.0, 1.0], [1.0, -4.0]]])
    # head 0: [[0, 1], [1, 0]];  head 1: [[0, 1], [1, 0]];  Abar2 = [[0, 1], [1, 0]]
    # R2 = R1 + Abar2 R1 = [[2, 0], [0.5, 1.5]] + [[0.5, 1.5], [2, 0]] = [[2.5, 1.5], [2.5, 1.5]]
    maps = torch.stack([A1, A2])[:, None]  # (l, b, h, n, n)
    grads = torch.stack([G1, G2])[:, None]
    expected = torch.tensor([[[2.5, 1.5], [2.5, 1.5]]])
    assert torch.equal(relevance_from_gradients(maps, grads), expected)
    # Negated gradients (a leading k axis of two targets): layer 1 keeps [[0, 1], [0, 0]] and [[0, 0], [1, 0]],
    # Abar1 = [[0, 0.5], [0.5, 0]], R1 = [[1, 0.5], [0.5, 1]]; layer 2 has no positive product, so R2 = R1.
    both = relevance_from_gradients(maps, torch.stack([grads, -grads]))
    assert torch.equal(both, torch.stack([expected, torch.tensor([[[1.0, 0.5], [0.5, 1.0]]])]))


def test_uniform_attention_over_identical_patches_gives_uniform_relevance():
    """q = k = 0 makes every row of A uniform. Relevance weighs A by its gradient, which depends on each key's
    value, so uniform relevance also needs the patch tokens to be alike: a constant image, no position embedding."""
    torch.manual_seed(6)
    model = tiny_vit(TINY).double()
    with torch.no_grad():
        for block in model.blocks:
            qkv = block.attn.mha.qkv
            qkv.weight[: 2 * 16].zero_()
            qkv.bias[: 2 * 16].zero_()
        model.patch_embed.pos_embed.weight.zero_()
    x = torch.full((2, 1, 8, 8), 0.3, dtype=torch.float64)
    _, maps, _ = record_attention(model, x)
    torch.testing.assert_close(maps, torch.full_like(maps, 1 / 17), rtol=0, atol=1e-15)
    for target in range(5):
        patches = attention_relevance(model, x, target)[:, 0, 1:]
        torch.testing.assert_close(patches, patches[:, :1].expand_as(patches), rtol=0, atol=1e-12)
    assert attention_relevance(model, x, torch.tensor([[0, 1, 2, 3, 4]] * 2))[:, :, 0, 1:].abs().sum() > 0


def test_relevance_works_with_frozen_parameters():
    model = tiny_vit(TINY).double()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    expected = attention_relevance(model, x)
    model.requires_grad_(False)
    torch.testing.assert_close(attention_relevance(model, x), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "target, error, match",
    [
        (5, ValueError, r"0\.\.4"),
        (-1, ValueError, r"0\.\.4"),
        (torch.tensor([0.5, 1.0]), TypeError, "integer"),
        (True, TypeError, "target"),
        (torch.tensor([0, 1, 2]), ValueError, "b = 2"),
    ],
)
def test_bad_targets_are_named(target, error, match):
    with pytest.raises(error, match=match):
        attention_relevance(tiny_vit(TINY), torch.rand(2, 1, 8, 8), target)


def test_relevance_from_gradients_checks_shapes():
    with pytest.raises(ValueError, match="grads"):
        relevance_from_gradients(torch.rand(2, 1, 1, 3, 3), torch.rand(2, 1, 1, 3, 4))


def test_attention_dropout_in_training_is_refused_and_no_probe_stays_attached():
    """dy/dA is read as (dy/dO) v^T, which holds while O = A v: active attention dropout is refused by name; in eval
    (or in training with p = 0) the same model is explained, and a failing call (a bad target, found after the
    forward) leaves no probe."""
    model = tiny_vit(TINY, attn_dropout=0.25).double().train()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"attention dropout is active in layer 0 \(p=0\.25 in training mode\).*"
                                         r"call model\.eval\(\) first"):  # fmt: skip
        attention_relevance(model, x)
    in_eval = attention_relevance(model.eval(), x)
    for block in model.blocks:
        block.attn.mha.attend.dropout.p = 0.0
    torch.testing.assert_close(attention_relevance(model.train(), x), in_eval, rtol=0, atol=0)  # O = A v again
    with pytest.raises(ValueError, match=r"0\.\.4"):
        attention_relevance(model, x, 5)
    assert not any(site.hooks for site in model.probe_sites().values())
