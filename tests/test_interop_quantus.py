"""The faithfulness curves (vit_einops.inspect.faithfulness) against Quantus's ``PixelFlipping`` and
``RegionPerturbation``, on the same tiny random-weight model, images and maps (relevance and Integrated Gradients,
every patch's value distinct), under the settings where the two conventions meet (docs/faithfulness.md tabulates
where they differ):

- Quantus's map is ours upsampled to pixels (each patch's value in its p x p pixels); it broadcasts the map over
  the channels. Its default ``normalise=True`` (divide by the batch's max |value|) keeps the order; ``abs=False``
  (its default too) ranks by the signed value, as ours does.
- The removed unit: ``PixelFlipping(features_in_step=C p p)``, whose map ties within a patch, so each step takes one
  patch in every channel; ``RegionPerturbation(patch_size=p, regions_evaluation=P)``. Quantus checks
  ``features_in_step`` against H W alone while it counts the C H W features, so the grid's patch count must be a
  multiple of C: 12 x 16 pixels in 4 x 4 patches here (a 3 x 4 grid).
- The colour: our ``baseline="zero"`` is ``perturb_baseline=0.0``, and Quantus's ``"black"`` (each image's minimum
  over its pixels and channels) only on images whose minimum is 0; our ``"mean"`` (each channel's mean over the
  images) is no string of Quantus's (its ``"mean"`` is each image's mean over every channel of the partly perturbed
  image), but a ``perturb_func`` that sets each channel's mean.
- y: ``softmax=True`` is our softmax probability of the class (the prediction on the whole image, passed as
  ``y_batch``). Quantus has no top-1 score; the model wrapped to output the one-hot of its argmax, with
  ``softmax=False``, makes its scores our top-1 hits.
- The points: Quantus's curves start after the first step (no 0% point). ``PixelFlipping``'s point i is our
  deletion's point i + 1; ``RegionPerturbation``'s is the drop f(x) - y, so our deletion is f(x) minus it, and our
  positive (``order="morf"``) and negative (``"lerf"``) perturbation at k / 10 are 1 minus its one-hot drop after
  floor(k P / 10) regions (1 at 0%).
- The AUC: Quantus's ``np.trapz(curve, dx=1)`` over its P points (``np.trapz`` is gone from NumPy 2.4: patched
  within one test); ours the trapezoid over P + 1 points at x = k / P, so ours = (Quantus's + (y0 + y1) / 2) / P.

Quantus computes in float32 (it feeds the model ``torch.Tensor(x)``) and takes the softmax there; ours is the
float64 softmax of the same float32 logits: within 1e-6. Top-1 hits are equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _interop import interop_library, perturbed, report_diffs
from _tiny import TINY_RGB16, tiny_vit
from einops import repeat
from torch import nn

from vit_einops.inspect import explain, faithfulness

quantus = interop_library("quantus")

# Quantus warns that a model without a softmax layer might need one, on every call with either softmax setting.
pytestmark = pytest.mark.filterwarnings("ignore:The combination of the value of the passed softmax argument")

SIZE, PATCH = (12, 16), 4  # a 3 x 4 grid: its 12 patches a multiple of the 3 channels (module docstring)
METHODS = ("relevance", "integrated-gradients")
TOL = 1e-6

@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one torch thread (conftest's one_thread) runs them fastest on a shared machine."""


@pytest.fixture(scope="module")
def setup():
    """(model, images (6, 3, 12, 16) float32, predicted classes (6,), {method: maps (6, 3, 4)}, our results by
    (method, baseline)). Noise of 0.2 on the weights makes the prediction of most images change at some point of the
    positive curve."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # before the tests' one_thread: a module fixture runs first
    try:
        torch.manual_seed(0)
        model = perturbed(tiny_vit(TINY_RGB16, image_size=SIZE, patch_size=PATCH), std=0.2)
        images = torch.randn(6, 3, *SIZE)
        with torch.no_grad():
            predicted = model(images).argmax(-1)
        maps = {name: explain(model, images, name, predicted, preprocessed=True) for name in METHODS}
    finally:
        torch.set_num_threads(threads)
    for name, m in maps.items():  # ties are ordered differently (ours by seed, Quantus's by argsort)
        assert all(len(row.unique()) == row.numel() for row in m.flatten(1)), f"{name}: patches of equal value"
    return model, images, predicted, maps, {}


def _ours(setup, method: str, baseline: str):
    """Our faithfulness result of ``method`` on the setup's images, computed once per baseline."""
    model, images, _, _, results = setup
    if (method, baseline) not in results:
        results[method, baseline] = faithfulness(model, images, method, preprocessed=True, baseline=baseline)
    return results[method, baseline]


class _Top1(nn.Module):
    """The model's prediction as a one-hot vector: Quantus's score of it is our top-1 hit."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()


def _channel_colour(arr: np.ndarray, indices: np.ndarray, colour: np.ndarray, pixels: int, **kwargs) -> np.ndarray:
    """Quantus ``perturb_func``: arr (N, C H W) with the features ``indices`` (N, I) set to their channel's colour."""
    out = arr.copy()
    out[np.arange(len(arr))[:, None], indices] = colour[indices // pixels]
    return out


def _quantus_colour(baseline: str, images: torch.Tensor) -> dict:
    """The Quantus metric's arguments that remove a patch as our ``baseline`` does."""
    if baseline == "zero":
        return dict(perturb_baseline=0.0)
    colour = images.mean(dim=(0, 2, 3)).numpy()  # ours: each channel's mean over the images
    return dict(perturb_func=_channel_colour, perturb_func_kwargs=dict(colour=colour, pixels=SIZE[0] * SIZE[1]))


def _pixels(maps: torch.Tensor) -> np.ndarray:
    """maps (b, gh, gw) -> (b, 1, H, W): each patch's value in its pixels."""
    return repeat(maps, "b gh gw -> b 1 (gh p1) (gw p2)", p1=PATCH, p2=PATCH).numpy()


def _run(metric, model, images, predicted, maps, **kwargs) -> np.ndarray:
    return np.asarray(metric(model=model, x_batch=images.numpy(), y_batch=predicted.numpy(), a_batch=_pixels(maps),
                             channel_first=True, device="cpu", **kwargs))


def _check(tag: str, actual, expected, tol: float = TOL) -> None:
    diff = float(np.abs(np.asarray(actual) - np.asarray(expected)).max())
    report_diffs({f"quantus {tag}": diff})
    assert diff <= tol, f"{tag}: max |difference| {diff:.2e} > {tol:g}"


def _pixel_flipping(images: torch.Tensor, **kwargs):
    return quantus.PixelFlipping(features_in_step=images.shape[1] * PATCH * PATCH, abs=False, disable_warnings=True,
                                 **kwargs)


@pytest.mark.parametrize("baseline", ["zero", "mean"])
@pytest.mark.parametrize("method", METHODS)
def test_deletion_equals_pixel_flipping(setup, method, baseline):
    model, images, predicted, maps, _ = setup
    ours = _ours(setup, method, baseline).curves[method]["deletion"]
    theirs = _run(_pixel_flipping(images, **_quantus_colour(baseline, images)), model, images, predicted,
                  maps[method])
    assert theirs.shape == (len(images), ours.shape[1] - 1)  # no 0% point
    _check(f"PixelFlipping deletion {method} {baseline}", theirs, ours[:, 1:])


def test_black_is_zero_only_where_each_image_reaches_0(setup):
    """Quantus's "black" is each image's minimum: our zero baseline on images clamped at 0, not on the others."""
    model, images, _, _, _ = setup
    metric, method = _pixel_flipping(images, perturb_baseline="black"), METHODS[0]
    for x, meets in ((images.clamp(min=0), True), (images, False)):
        with torch.no_grad():
            predicted = model(x).argmax(-1)
        maps = explain(model, x, method, predicted, preprocessed=True)
        ours = faithfulness(model, x, method, preprocessed=True, baseline="zero").curves[method]["deletion"]
        theirs = _run(metric, model, x, predicted, maps)
        if meets:
            _check("PixelFlipping black = zero on images whose minimum is 0", theirs, ours[:, 1:])
        else:
            assert np.abs(theirs - ours[:, 1:].numpy()).max() > 1e-2


@pytest.mark.parametrize("method", METHODS)
def test_pixel_flipping_auc_converts_to_ours(setup, method, monkeypatch):
    """Quantus's per-image AUC is np.trapz over its float32 curve at dx 1, without the 0% point; ours is
    (its AUC + (y0 + y1) / 2) / P."""
    model, images, predicted, maps, _ = setup
    result = _ours(setup, method, "zero")
    y, ours = result.curves[method]["deletion"].numpy(), result.aucs[method]["deletion"].numpy()
    curve = _run(_pixel_flipping(images, perturb_baseline=0.0), model, images, predicted, maps[method])
    metric = _pixel_flipping(images, perturb_baseline=0.0, return_auc_per_sample=True)
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)  # Quantus's call; gone from NumPy 2.4
    theirs = _run(metric, model, images, predicted, maps[method])
    own = np.trapezoid(curve.astype(np.float32), dx=1, axis=1)  # Quantus's float32 preds
    _check(f"PixelFlipping AUC {method} = trapezoid of its curve", own, theirs)
    _check(f"PixelFlipping AUC {method} converted", (theirs + (y[:, 0] + y[:, 1]) / 2) / result.patches, ours)


@pytest.mark.parametrize("method", METHODS)
def test_deletion_equals_region_perturbation(setup, method):
    model, images, predicted, maps, _ = setup
    ours = _ours(setup, method, "mean").curves[method]["deletion"]
    metric = quantus.RegionPerturbation(patch_size=PATCH, order="morf", regions_evaluation=ours.shape[1] - 1,
                                        abs=False, disable_warnings=True, **_quantus_colour("mean", images))
    drop = _run(metric, model, images, predicted, maps[method])
    ours = ours.numpy()
    _check(f"RegionPerturbation deletion {method}", ours[:, :1] - drop, ours[:, 1:])


@pytest.mark.parametrize("order, curve", [("morf", "positive"), ("lerf", "negative")])
@pytest.mark.parametrize("method", METHODS)
def test_positive_and_negative_equal_region_perturbation(setup, method, order, curve):
    """Chefer et al.'s top-1 curves are Quantus's region curves of the one-hot prediction, at floor(k P / 10)."""
    model, images, predicted, maps, _ = setup
    result = _ours(setup, method, "mean")
    ours, p = result.curves[method][curve].numpy(), result.patches
    metric = quantus.RegionPerturbation(patch_size=PATCH, order=order, regions_evaluation=p, abs=False,
                                        disable_warnings=True, **_quantus_colour("mean", images))
    drop = _run(metric, _Top1(model).eval(), images, predicted, maps[method], softmax=False)
    assert set(np.unique(drop)) <= {0.0, 1.0}
    removed = np.arange(10) * p // 10
    expected = np.concatenate([np.ones((len(images), 1)), 1 - drop[:, removed[1:] - 1]], axis=1)
    assert np.array_equal(ours, expected)
    if curve == "positive":  # the prediction changes mid-curve for some image: the points' alignment is tested
        assert ((ours[:, 1:-1] == 1) & (ours[:, 2:] == 0)).any()
