"""Integrated Gradients (vit_einops.inspect.integrated_gradients): against a second quadrature of the same path
integral written here (Simpson's rule over every point of the path in one batch and one backward, sharing no code
with ours), completeness on a tiny model of every family, for class and backbone targets, on every attention path,
the patch sums, and the refusals. float64 throughout, so the quadratures' own errors are what the tolerances hold.
captum's IntegratedGradients on the same model: tests/test_interop_methods.py."""

from __future__ import annotations

import re

import pytest
import torch
from _tiny import FAMILIES, TINY_DIGITS, TINY_RGB16, tiny_vit

from vit_einops import Preprocessing
from vit_einops.inspect import METHODS, EmbeddingTarget, PatchTarget, explain, integrated_gradients
from vit_einops.inspect.integrated_gradients import MAX_STEPS, quadrature_points

TINY = dict(TINY_DIGITS, num_classes=5)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one torch thread runs them fastest on a shared machine."""


def _model(base=TINY, classes=True, **options):
    torch.manual_seed(0)
    model = tiny_vit(base, **options).double()
    with torch.no_grad():  # noise on every parameter: the zero-initialised head and biases would hide a slip
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    return model


def _simpson(model, x, start, classes, points=801):
    """The path integral by Simpson's rule: every point of the path in one batch, one backward of the summed
    class logits (images do not interact), weights 1 4 2 4 ... 4 1 over 3 (points - 1)."""
    alphas = torch.linspace(0, 1, points, dtype=x.dtype)
    weights = torch.ones(points, dtype=x.dtype)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    weights /= 3 * (points - 1)
    path = (start[None] + alphas[:, None, None, None, None] * (x - start)[None]).requires_grad_(True)
    flat = path.flatten(0, 1)  # (points b) c h w
    logits = model(flat).view(points, len(x), -1)
    picked = logits.gather(2, classes[None, :, None].expand(points, -1, 1)).sum()
    (grads,) = torch.autograd.grad(picked, path)
    return (x - start) * torch.einsum("k,kbchw->bchw", weights, grads)


def test_equals_simpsons_rule_of_the_same_path_for_each_baseline():
    model = _model()
    model.preprocessing = Preprocessing(resize=(8, 8), mean=(0.4,), std=(0.2,))
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    classes = model(x).argmax(-1)
    for baseline, start in (("zero", torch.zeros_like(x)), ("black", torch.full_like(x, -0.4 / 0.2))):
        ours = integrated_gradients(model, x, baseline=baseline, steps=64, preprocessed=True)
        expected = _simpson(model, x, start, classes)
        torch.testing.assert_close(ours.attributions, expected, rtol=0, atol=1e-9)


def test_each_quadrature_converges_to_the_same_integral():
    """The Riemann sums against 64 Gauss-Legendre points, and the identity that ties three of them: the trapezoid
    rule on n + 1 points is the mean of the left and right sums on n."""
    model, x = _model(), torch.randn(2, 1, 8, 8, dtype=torch.float64)

    def ig(steps, quadrature="gausslegendre"):
        return integrated_gradients(model, x, 1, baseline="zero", steps=steps, quadrature=quadrature,
                                    preprocessed=True).attributions

    fine = ig(64)
    for quadrature, steps in (("riemann_middle", 64), ("riemann_trapezoid", 65)):
        torch.testing.assert_close(ig(steps, quadrature), fine, rtol=0, atol=2e-4, msg=quadrature)
    left, right = ig(8, "riemann_left"), ig(8, "riemann_right")
    torch.testing.assert_close(ig(9, "riemann_trapezoid"), (left + right) / 2, rtol=0, atol=1e-12)
    assert (left - fine).abs().max() > 4 * (ig(8, "riemann_middle") - fine).abs().max()  # first order, not second


def test_quadrature_points_lie_in_the_unit_interval_and_their_weights_sum_to_one():
    for quadrature in ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"):
        alphas, weights = quadrature_points(7, quadrature)
        assert len(alphas) == len(weights) == 7
        assert all(0 <= a <= 1 for a in alphas) and abs(sum(weights) - 1) < 1e-12, quadrature
    assert quadrature_points(3, "riemann_left")[0] == pytest.approx([0, 1 / 3, 2 / 3])
    assert quadrature_points(3, "riemann_right")[0] == pytest.approx([1 / 3, 2 / 3, 1])
    assert quadrature_points(3, "riemann_trapezoid") == (pytest.approx([0, 0.5, 1]), pytest.approx([0.25, 0.5, 0.25]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_completeness_on_every_family_for_a_class_and_a_backbone_target(family):
    """sum(IG) = F(x) - F(x'): the returned delta is that difference, and it is small at 64 Gauss-Legendre points.
    The same model without its classifier is explained for an embedding and for a patch target."""
    options = FAMILIES[family]
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    classifier = _model(TINY_RGB16, **options)
    ig = integrated_gradients(classifier, x, steps=64, baseline="zero", preprocessed=True)
    logits, base = classifier(x), classifier(torch.zeros_like(x))
    classes = logits.argmax(-1)
    gap = (logits - base).gather(1, classes[:, None])[:, 0]
    torch.testing.assert_close(ig.delta, ig.attributions.sum((1, 2, 3)) - gap, rtol=0, atol=1e-12)
    assert ig.delta.abs().max() < 1e-6 * gap.abs().max()
    backbone = _model(TINY_RGB16, num_classes=0, **options)
    for target in (EmbeddingTarget(torch.randn(TINY_RGB16["dim"], dtype=torch.float64)), PatchTarget(1, 2)):
        ig = integrated_gradients(backbone, x, target, steps=64, baseline="zero", preprocessed=True)
        assert ig.delta.abs().max() < 1e-6, (family, target)


def test_the_class_is_chosen_once_on_the_image_not_along_the_path():
    model, x = _model(), torch.randn(3, 1, 8, 8, dtype=torch.float64)
    predicted = model(x).argmax(-1)
    assert (model(torch.zeros_like(x)).argmax(-1) != predicted).any()  # the baseline predicts otherwise
    by_default = integrated_gradients(model, x, steps=8, baseline="zero", preprocessed=True).attributions
    given = integrated_gradients(model, x, predicted, steps=8, baseline="zero", preprocessed=True).attributions
    torch.testing.assert_close(by_default, given, rtol=0, atol=0)


def test_the_method_sums_each_patch_and_agrees_on_every_attention_path():
    model, x = _model(), torch.randn(2, 1, 8, 8, dtype=torch.float64)
    pixels = integrated_gradients(model, x, 2, steps=16, preprocessed=True).attributions
    maps = {}
    for impl in ("einsum", "chunked", "sdpa"):
        model.set_attn_impl(impl)
        maps[impl] = explain(model, x, "integrated-gradients", 2, preprocessed=True, steps=16)
    model.set_attn_impl("einsum")
    expected = pixels.view(2, 1, 4, 2, 4, 2).sum(dim=(1, 3, 5))  # (b, c, gh, p1, gw, p2): each 2x2 patch's sum
    for impl, grid in maps.items():
        torch.testing.assert_close(grid, expected, rtol=0, atol=1e-12, msg=impl)
    assert METHODS["integrated-gradients"].gradient


def test_refusals_name_the_value_and_what_is_expected():
    model, x = _model(), torch.randn(1, 1, 8, 8, dtype=torch.float64)
    cases = [
        (dict(steps=0), f"steps must be an int in [1, {MAX_STEPS}], got 0"),
        (dict(steps=MAX_STEPS + 1), f"steps must be an int in [1, {MAX_STEPS}], got {MAX_STEPS + 1}"),
        (dict(steps=1, quadrature="riemann_trapezoid"), f"steps must be an int in [2, {MAX_STEPS}], got 1"),
        (dict(quadrature="simpson"), "unknown quadrature 'simpson'"),
        (dict(baseline="white"), "unknown baseline 'white'"),
    ]
    for params, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            explain(model, x, "integrated-gradients", 0, preprocessed=True, **params)
    with pytest.raises(TypeError, match="steps must be an int, got 2.5 of type float"):
        integrated_gradients(model, x, 0, steps=2.5, preprocessed=True)
    with pytest.raises(ValueError, match="integrated gradients explains one class per image"):
        integrated_gradients(model, x, [[0, 1]], steps=2, preprocessed=True)
