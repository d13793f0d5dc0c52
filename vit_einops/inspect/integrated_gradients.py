"""Integrated Gradients (Sundararajan, Taly and Yan 2017) in the model's input space, as captum computes it.

For an input x, a baseline x' and a score F (a class logit, or a backbone target's score), each pixel's
attribution is the path integral of F's gradient along the straight line from x' to x:

    IG_i(x) = (x_i - x'_i) * integral_0^1 dF(x' + a (x - x')) / dx_i  da

approximated by a quadrature over ``steps`` points a_k with weights w_k (``quadrature``, captum's ``method``:
Gauss-Legendre by default, or a left, right, middle or trapezoid Riemann sum):

    IG_i(x) ~ (x_i - x'_i) * sum_k w_k dF(x' + a_k (x - x')) / dx_i

Completeness: the attributions sum to F(x) - F(x'), up to the quadrature's error, which
:func:`integrated_gradients` returns as the convergence delta (captum's ``return_convergence_delta``).

The class explained is decided once, on x (the predicted class by default), not anew at each point of the path.
The explanation method ``integrated-gradients`` of :data:`~vit_einops.inspect.METHODS` sums each patch's
attributions over its pixels and channels: the grid's values then add up to the same F(x) - F(x').

Axes: b images, c channels, (gh p1) (gw p2) the pixels of the patch grid.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from einops import reduce
from torch import nn

from ..base.checks import check_choice, check_int
from ..base.threads import follow_free_cores
from ..inputs import model_inputs
from ..network.sizes import check_model_forward
from .targets import BACKBONE_TARGETS, class_targets, one_class_each, resolve_target, target_scores

# What the path starts from, in the model's input space (after its normalisation): "black" is the black image
# (pixels 0, normalised by the model's preprocessing; 0 for a model that records none, whose input is taken as it
# is), Sundararajan et al.'s choice for images; "zero" is the all-zero input, captum's default (the mean colour
# under mean/std normalisation).
PATH_BASELINES = ("black", "zero")
# The quadratures, by captum's names for its ``method`` (captum.attr._utils.approximation_methods).
QUADRATURES = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid")
MAX_STEPS = 4096  # each step is a forward and backward pass of the batch: far past any useful accuracy


class Attributions(NamedTuple):
    """:func:`integrated_gradients`'s result: ``attributions`` (b, c, H, W) in the model's input space, and
    ``delta`` (b,), sum(attributions) - (F(x) - F(x')), the quadrature's completeness error."""

    attributions: torch.Tensor
    delta: torch.Tensor


def quadrature_points(steps: int, quadrature: str = "gausslegendre") -> tuple[list[float], list[float]]:
    """(the points a_k in [0, 1], their weights w_k) of ``quadrature`` with ``steps`` points. They are captum's,
    but for the trapezoid rule's weights: captum gives its end points 1 / (2 steps) and the others 1 / steps, which
    sum to (steps - 1) / steps; here they are 1 / (2 (steps - 1)) and 1 / (steps - 1), which sum to 1."""
    check_choice("quadrature", quadrature, QUADRATURES)
    steps = check_int("steps", steps, 2 if quadrature == "riemann_trapezoid" else 1, MAX_STEPS)
    if quadrature == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)  # on [-1, 1]: moved to [0, 1]
        return list(0.5 * (nodes + 1)), list(0.5 * weights)
    if quadrature == "riemann_trapezoid":
        inner = [1 / (steps - 1)] * (steps - 2)
        return list(np.linspace(0, 1, steps)), [0.5 / (steps - 1), *inner, 0.5 / (steps - 1)]
    start = {"riemann_left": 0.0, "riemann_right": 1.0 / steps, "riemann_middle": 0.5 / steps}[quadrature]
    return list(np.linspace(start, start + (steps - 1) / steps, steps)), [1.0 / steps] * steps


def baseline_input(model: nn.Module, images: torch.Tensor, baseline: str) -> torch.Tensor:
    """x' for the model's batch ``images`` (b, c, H, W): see :data:`PATH_BASELINES`."""
    check_choice("baseline", baseline, PATH_BASELINES)
    if baseline == "zero" or getattr(model, "preprocessing", None) is None:
        return torch.zeros_like(images)
    black = model.transforms().normalise(torch.zeros(images.shape[1], 1, 1))  # (c, 1, 1)
    return black.to(images).expand_as(images).clone()


def integrated_gradients(
    model: nn.Module, images: Any, target: Any = None, *, baseline: str = "black", steps: int = 50,
    quadrature: str = "gausslegendre", preprocessed: bool | None = None,
) -> Attributions:
    """Integrated Gradients of ``target``'s score (see the module docstring) in the model's input space.

    Args:
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them (``preprocessed``: how a float tensor is taken).
        target: None (each image's predicted class), a class index, one per image (b,), or a backbone target.
        baseline: x', "black" or "zero" (:data:`PATH_BASELINES`).
        steps, quadrature: the quadrature (captum's ``n_steps`` and ``method``; 50 Gauss-Legendre points by
            default; see :func:`quadrature_points`).

    Each step runs the batch forward and backward once. The model's train/eval mode is the caller's; parameters'
    ``.grad`` are left untouched. Shapes: images (b, c, H, W) -> attributions (b, c, H, W), delta (b,).
    """
    alphas, weights = quadrature_points(steps, quadrature)
    x = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, x, grad=True)
    start = baseline_input(model, x, baseline)
    target = resolve_target(model, target, len(x))

    def scores(inputs: torch.Tensor, classes: torch.Tensor | None) -> torch.Tensor:
        if classes is None:
            return target_scores(model, inputs, target)[1]
        return model(inputs).gather(1, classes[:, None])[:, 0]

    with torch.no_grad():
        classes = None
        if not isinstance(target, BACKBONE_TARGETS):
            classes = one_class_each(class_targets(target, model(x)), "integrated gradients")
        gap = scores(x, classes) - scores(start, classes)
    path = torch.zeros_like(x)
    with torch.enable_grad():  # the input requires grad, so a graph exists even where every weight is frozen
        for alpha, weight in zip(alphas, weights):
            follow_free_cores()  # a command's thread policy, between the path's passes (nothing without one)
            point = (start + alpha * (x - start)).requires_grad_(True)
            (grad,) = torch.autograd.grad(scores(point, classes).sum(), point)  # images do not interact
            path += weight * grad
    attributions = (x - start) * path
    return Attributions(attributions, attributions.sum(dim=(1, 2, 3)) - gap)


def patch_sums(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """(b, c, H, W) per-pixel values -> (b, gh, gw), each patch's sum over its pixels and channels."""
    gh, gw = model.patch_embed.layout(pixels.shape[-2:]).grid
    return reduce(pixels, "b c (gh p1) (gw p2) -> b gh gw", "sum", gh=gh, gw=gw)
