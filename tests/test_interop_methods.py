"""The explanation methods (vit_einops.inspect.METHODS) against the reference implementations, run on tiny
random-weight timm models of every prefix-token family (class token; class token and registers; class and
distillation tokens; no class token, mean pooling), loaded into our ViT, on a non-square grid, our side on the
einsum, chunked and sdpa paths:

- Grad-CAM against pytorch-grad-cam's ``GradCAM`` (the ``grad-cam`` package) on the timm model, hooked at
  ``blocks[-1].norm1`` as its ViT tutorial does, with the tutorial's reshape transform generalised to drop
  timm's ``num_prefix_tokens`` (the tutorial drops one token and folds the rest onto 14 x 14) and fold onto the
  input's grid. pytorch-grad-cam returns its map min-max scaled (``scale_cam_image``: (cam - min) /
  (1e-7 + max), once per target layer and again for their mean) and resized to the input with cv2; the models
  here have 1-pixel patches, so that resize is the identity, and our raw map, scaled the same way, is compared
  with its public output within 1e-5 (its float32).
- Attention rollout and gradient rollout against jacobgil/vit-explain's ``rollout`` and ``grad_rollout``, written
  below in their own style, hooking timm's ``attn_drop`` (timm's non-fused path, which forms A), corrected where
  the code contradicts the method: rows renormalised with ``keepdim=True`` (vit-explain divides entry (i, j) by
  row j's sum), the gradients put back in layer order (its backward hooks collect them last layer first:
  vit-explain issue #6), and, in ``grad_rollout``, the class token's own entry spared from discarding (the line
  is commented out there; its comment and ``rollout`` spare it). Where vit-explain reads ``result[0, 0, 1:]`` on a
  square grid, the reference reads the class token's row past every prefix token on the input's grid, and the
  mean of the patch rows for a model without a class token. Compared after vit-explain's own normalisation
  (``mask / max(mask)``), float64, within 1e-10.
- Relevance against Transformer-Explainability's rule with its ``start_layer`` (R = I; R += mean_h((dA * A)^+) R
  from layer start_layer on), the same hooks, float64, within 1e-10.
- Integrated Gradients against captum's ``IntegratedGradients`` on the timm model, each of its quadratures, before
  our sum over each patch's pixels and channels, float64 but for captum's quadrature weights (and its Riemann
  points), which it makes float32: within 1e-6 (a few float32 ulps of the attributions). captum's trapezoid weights
  sum to (n - 1) / n where ours sum to 1, so its trapezoid attributions are ours times (n - 1) / n.
"""

from __future__ import annotations

import pytest
import torch
from _interop import interop_library, perturbed, report_diffs

from vit_einops.interop import load_timm
from vit_einops.inspect import explain, integrated_gradients

timm = interop_library("timm")
interop_library("pytorch_grad_cam")
interop_library("captum")
from captum.attr import IntegratedGradients  # noqa: E402
from pytorch_grad_cam import GradCAM  # noqa: E402
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget  # noqa: E402
from timm.models.deit import VisionTransformerDistilled  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

IMPLS = ("einsum", "chunked", "sdpa")
GRID = (3, 5)  # non-square: the tutorial's reshape would fold it onto a square
TINY = dict(img_size=GRID, patch_size=1, in_chans=3, embed_dim=16, depth=3, num_heads=2, mlp_ratio=2.0,
            num_classes=5)  # fmt: skip
FAMILIES = {
    "class token": (VisionTransformer, {}),
    "registers": (VisionTransformer, dict(reg_tokens=2, no_embed_class=True)),
    "distillation token": (VisionTransformerDistilled, {}),
    "no class token": (VisionTransformer, dict(class_token=False, global_pool="avg")),
}
DIFFS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    report_diffs(DIFFS)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one torch thread (conftest's one_thread) runs them fastest on a shared machine."""


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """(name, timm model on its non-fused path, ours loaded from it, float64 images (2, 3, 3, 5))."""
    cls, kwargs = FAMILIES[request.param]
    torch.manual_seed(0)
    theirs = perturbed(cls(**TINY, **kwargs), std=0.2).double()
    for block in theirs.blocks:
        block.attn.fused_attn = False  # timm's written-out path: A passes through attn_drop, where vit-explain hooks
    told = dict(heads=TINY["num_heads"], image_size=GRID, act="gelu", layer_norm_eps=1e-6)  # what no tensor holds
    ours = load_timm(theirs.state_dict(), **told).double().eval()
    return request.param, theirs, ours, torch.randn(2, 3, *GRID, dtype=torch.float64)


def _ours(ours, images, method, target, **params):
    """explain() on each attention path -> {impl: (b, gh, gw)}."""
    maps = {}
    for impl in IMPLS:
        ours.set_attn_impl(impl)
        maps[impl] = explain(ours, images, method, target, preprocessed=True, **params)
    ours.set_attn_impl("einsum")
    return maps


def _compare(tag: str, maps: dict, expected: torch.Tensor, tol: float) -> None:
    for impl, actual in maps.items():
        diff = DIFFS[f"{tag} {impl}"] = (actual - expected).abs().max().item()
        assert diff <= tol, f"{tag} on {impl}: max |difference| {diff:.2e} > {tol:g}"


def _scale_cam(cam: torch.Tensor) -> torch.Tensor:
    """pytorch-grad-cam's normalisation of (b, gh, gw): scale_cam_image without its resize, applied twice, as
    BaseCAM applies it (once per target layer, then again to their mean); with the 1e-7 in each denominator the
    second pass is not the identity, by up to 1e-7 / (the raw map's range)."""
    for _ in range(2):
        shifted = cam - cam.amin(dim=(-2, -1), keepdim=True)
        cam = shifted / (1e-7 + shifted.amax(dim=(-2, -1), keepdim=True))
    return cam


# ---- vit-explain's hooks, and the references in its style --------------------------------------------------


def _attentions_and_gradients(model, images, category_index=None):
    """vit-explain's recorder on timm's attn_drop: attentions from a forward hook, and (with a category) the
    gradient of the category's logit with respect to each, taken from a tensor hook (vit-explain's
    ``register_backward_hook`` receives them last layer first: reversed here into layer order)."""
    attentions, gradients = [], []

    def get_attention(module, input, output):
        attentions.append(output.detach())
        if category_index is not None:
            output.register_hook(lambda grad: gradients.append(grad.detach()))

    handles = [block.attn.attn_drop.register_forward_hook(get_attention) for block in model.blocks]
    try:
        with torch.set_grad_enabled(category_index is not None):
            output = model(images)
            if category_index is not None:
                category_mask = torch.zeros(output.size(), dtype=output.dtype)
                category_mask[torch.arange(len(images)), category_index] = 1
                (output * category_mask).sum().backward()
                model.zero_grad()
    finally:
        for handle in handles:
            handle.remove()
    return attentions, gradients[::-1]


def _vit_explain_rollout(attentions, discard_ratio, head_fusion, model, gradients=None):
    """vit-explain's rollout (gradients None) or grad_rollout, one image (batch 1) as there, corrected as the
    module docstring says; the mask on the input's grid, divided by its maximum."""
    result = torch.eye(attentions[0].size(-1), dtype=attentions[0].dtype)
    with torch.no_grad():
        for layer, attention in enumerate(attentions):
            if gradients is not None:
                attention_heads_fused = (attention * gradients[layer]).mean(axis=1)
                attention_heads_fused[attention_heads_fused < 0] = 0
            elif head_fusion == "mean":
                attention_heads_fused = attention.mean(axis=1)
            elif head_fusion == "max":
                attention_heads_fused = attention.max(axis=1)[0]
            else:
                attention_heads_fused = attention.min(axis=1)[0]
            # Drop the lowest attentions, but don't drop the class token
            flat = attention_heads_fused.view(attention_heads_fused.size(0), -1)
            _, indices = flat.topk(int(flat.size(-1) * discard_ratio), -1, False)
            if model.cls_token is not None:
                indices = indices[indices != 0]
            flat[0, indices] = 0
            I = torch.eye(attention_heads_fused.size(-1), dtype=flat.dtype)  # noqa: E741 (vit-explain's name)
            a = (attention_heads_fused + 1.0 * I) / 2
            a = a / a.sum(dim=-1, keepdim=True)  # vit-explain: a.sum(dim=-1), which divides (i, j) by row j's sum
            result = torch.matmul(a, result)
    return _mask(result, model)


def _mask(result, model):
    """vit-explain's ``result[0, 0, 1:]`` reshaped to the grid and divided by its maximum, read past every prefix
    token, or the mean of the patch rows without a class token."""
    start = model.num_prefix_tokens
    rows = result[0, 0] if model.cls_token is not None else result[0, start:].mean(dim=0)
    mask = rows[start:].reshape(GRID)
    return mask / mask.max()


def _each_image(images, reference):
    return torch.stack([reference(images[i : i + 1], i) for i in range(len(images))])


# ---- the tests ---------------------------------------------------------------------------------------------


def test_grad_cam_equals_pytorch_grad_cam(family):
    name, theirs, ours, images = family
    classes = [1, 3]
    prefix = theirs.num_prefix_tokens

    def reshape_transform(tensor, height=GRID[0], width=GRID[1]):  # the tutorial's, past every prefix token
        result = tensor[:, prefix:, :].reshape(tensor.size(0), height, width, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)

    cam = GradCAM(model=theirs, target_layers=[theirs.blocks[-1].norm1], reshape_transform=reshape_transform)
    expected = cam(input_tensor=images, targets=[ClassifierOutputTarget(c) for c in classes])
    assert expected.shape == (2, *GRID)  # 1-pixel patches: its resize to the input is the identity
    maps = _ours(ours, images, "grad-cam", torch.tensor(classes))
    assert all((m > 0).any() for m in maps["einsum"]), f"{name}: an all-zero CAM would compare nothing"
    _compare(f"grad-cam timm {name} (tiny)", {k: _scale_cam(v) for k, v in maps.items()},
             torch.from_numpy(expected).double(), 1e-5)  # fmt: skip


@pytest.mark.parametrize("head_fusion, discard_ratio", [("mean", 0.0), ("mean", 0.9), ("max", 0.0), ("min", 0.5)])
def test_rollout_equals_vit_explains_corrected(family, head_fusion, discard_ratio):
    name, theirs, ours, images = family

    def reference(image, _):
        attentions, _ = _attentions_and_gradients(theirs, image)
        return _vit_explain_rollout(attentions, discard_ratio, head_fusion, theirs)

    expected = _each_image(images, reference)
    maps = _ours(ours, images, "rollout", None, head_fusion=head_fusion, discard_ratio=discard_ratio)
    tag = f"rollout {head_fusion} discard {discard_ratio:g} timm {name} (tiny)"
    _compare(tag, {k: v / v.amax(dim=(-2, -1), keepdim=True) for k, v in maps.items()}, expected, 1e-10)


@pytest.mark.parametrize("discard_ratio", [0.0, 0.9])
def test_gradient_rollout_equals_vit_explains_corrected(family, discard_ratio):
    name, theirs, ours, images = family
    classes = [4, 0]

    def reference(image, i):
        attentions, gradients = _attentions_and_gradients(theirs, image, classes[i])
        return _vit_explain_rollout(attentions, discard_ratio, None, theirs, gradients)

    expected = _each_image(images, reference)
    maps = _ours(ours, images, "gradient-rollout", torch.tensor(classes), discard_ratio=discard_ratio)
    tag = f"gradient rollout discard {discard_ratio:g} timm {name} (tiny)"
    _compare(tag, {k: v / v.amax(dim=(-2, -1), keepdim=True) for k, v in maps.items()}, expected, 1e-10)


@pytest.mark.parametrize("start_layer", [0, 2])  # every layer, the last alone
def test_relevance_equals_transformer_explainability_from_start_layer(family, start_layer):
    name, theirs, ours, images = family
    classes = [2, 2]

    def reference(image, i):
        attentions, gradients = _attentions_and_gradients(theirs, image, classes[i])
        relevance = torch.eye(attentions[0].shape[-1], dtype=image.dtype)[None]
        for cam, grad in list(zip(attentions, gradients, strict=True))[start_layer:]:
            relevance = relevance + (grad * cam).clamp(min=0).mean(dim=1) @ relevance
        start = theirs.num_prefix_tokens
        rows = relevance[0, 0] if theirs.cls_token is not None else relevance[0, start:].mean(dim=0)
        return rows[start:].reshape(GRID)

    expected = _each_image(images, reference)
    maps = _ours(ours, images, "relevance", torch.tensor(classes), start_layer=start_layer)
    _compare(f"relevance start_layer {start_layer} timm {name} (tiny)", maps, expected, 1e-10)


def test_the_corrections_change_the_answer(family):
    """Each correction changes the reference on these models, so the tests above could fail without it:
    vit-explain's division by ``a.sum(dim=-1)`` under max fusion, and its gradients zipped in backward order."""
    _, theirs, _, images = family
    attentions, gradients = _attentions_and_gradients(theirs, images[:1], 1)
    fused = attentions[0].amax(dim=1)[0] + torch.eye(attentions[0].shape[-1], dtype=images.dtype)
    assert not torch.allclose(fused / fused.sum(dim=-1), fused / fused.sum(dim=-1, keepdim=True))
    right = _vit_explain_rollout(attentions, 0.0, None, theirs, gradients)
    wrong = _vit_explain_rollout(attentions, 0.0, None, theirs, gradients[::-1])
    assert (right - wrong).abs().max() > 1e-3


@pytest.mark.parametrize("quadrature, steps", [("gausslegendre", 20), ("riemann_left", 7), ("riemann_right", 7),
                                               ("riemann_middle", 7), ("riemann_trapezoid", 7)])
def test_integrated_gradients_equals_captums(family, quadrature, steps):
    name, theirs, ours, images = family
    classes = [3, 1]
    expected, delta = IntegratedGradients(theirs).attribute(
        images, baselines=torch.zeros_like(images), target=classes, n_steps=steps, method=quadrature,
        return_convergence_delta=True,
    )
    if quadrature == "riemann_trapezoid":
        expected = expected * steps / (steps - 1)  # captum's end weights 1 / (2n) and inner 1 / n, ours over n - 1
    attributions = {}
    for impl in IMPLS:
        ours.set_attn_impl(impl)
        attributions[impl] = integrated_gradients(ours, images, torch.tensor(classes), baseline="zero", steps=steps,
                                                  quadrature=quadrature, preprocessed=True)
    ours.set_attn_impl("einsum")
    _compare(f"integrated gradients {quadrature} {steps} timm {name} (tiny)",
             {impl: ig.attributions for impl, ig in attributions.items()}, expected, 1e-6)
    if quadrature != "riemann_trapezoid":  # captum's delta is against its own weights
        torch.testing.assert_close(attributions["einsum"].delta, delta, rtol=0, atol=1e-6)
    maps = _ours(ours, images, "integrated-gradients", torch.tensor(classes), baseline="zero", steps=steps,
                 quadrature=quadrature)
    _compare(f"integrated gradients map {quadrature} timm {name} (tiny)", maps,
             expected.sum(dim=1), 1e-6)  # 1-pixel patches: each patch's sum is over the channels
