"""The explanation registry (vit_einops.inspect.methods): each method through ``explain`` against the same quantity
computed independently here from torch's own modules (nn.MultiheadAttention's weights for the attention maps,
tensor hooks and backward for the gradients, tests/_equiv.py), on a model with a class token, one with registers
and one without a class token, on every attention path; and its refusals. float64, so the two sides differ by
rounding alone (tolerances as tests/_equiv.py states them). The same methods against the reference libraries
(pytorch-grad-cam, vit-explain, Transformer-Explainability) on timm models: tests/test_interop_methods.py."""

import pytest
import torch
from _equiv import F64_TOL, attention_and_gradients, chefer_reference
from _tiny import TINY_DIGITS, tiny_vit

from vit_einops.inspect import METHODS, explain, grad_cam

IMPLS = ("einsum", "chunked", "sdpa")

TINY = dict(TINY_DIGITS, num_classes=5)
LAYOUTS = {
    "class token": {},
    "registers": dict(register_tokens=2),
    "no class token": dict(class_token=False, pool="mean"),
}


def _weights(model, images):
    """Every layer's attention maps (l, b, h, n, n) from torch's nn.MultiheadAttention fed the model's own
    normed tokens and qkv weights: an implementation that shares none of ours."""
    maps, tokens = [], model.patch_embed(images)
    for block in model.blocks:
        attn = block.attn.mha
        mha = torch.nn.MultiheadAttention(attn.qkv.in_features, attn.heads, batch_first=True, dtype=tokens.dtype)
        with torch.no_grad():
            mha.in_proj_weight.copy_(attn.qkv.weight)
            mha.in_proj_bias.copy_(attn.qkv.bias)
            normed = block.attn.norm(tokens)
            maps.append(mha(normed, normed, normed, average_attn_weights=False)[1])
            tokens = block(tokens)
    return torch.stack(maps)


def _grid(matrix, model, images):
    """Class row, or mean over patch rows, of (b, n, n) -> (b, gh, gw), written out here."""
    layout = model.patch_embed.layout(images.shape[-2:])
    start, (gh, gw) = layout.num_prefix, layout.grid
    rows = matrix[:, 0] if model.config.class_token else matrix[:, start:].mean(dim=1)
    return rows[:, start:].reshape(len(matrix), gh, gw)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def case(request):
    torch.manual_seed(0)
    model = tiny_vit(TINY, **LAYOUTS[request.param]).double()
    with torch.no_grad():  # the zero-initialised head would give every gradient method nothing to show
        model.head.fc.weight.normal_()
    return model, torch.randn(3, 1, 8, 8, dtype=torch.float64)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one torch thread (conftest's one_thread) runs them fastest on a shared machine."""


def _every_path(model, images, method, target=None, **params):
    """explain() on each attention path: {impl: (b, gh, gw)}, the model left on einsum."""
    maps = {}
    for impl in IMPLS:
        model.set_attn_impl(impl)
        maps[impl] = explain(model, images, method, target, preprocessed=True, **params)
    model.set_attn_impl("einsum")
    return maps


def _discard(fused, ratio, kept):
    """vit-explain's discarding, one map (n, n) at a time: the int(n * n * ratio) lowest entries of the flattened
    map zeroed, the flat index of (kept, kept) removed from them."""
    fused = fused.clone()
    for m in fused.view(-1, *fused.shape[-2:]):
        flat = m.view(-1)
        _, indices = flat.topk(int(flat.size(-1) * ratio), -1, False)
        if kept is not None:
            indices = indices[indices != kept * m.shape[-1] + kept]
        flat[indices] = 0
    return fused


def _roll(fused, ratio, kept):
    """(l, b, n, n) fused maps -> the rollout (b, n, n): discard, (A + I) / 2, rows over their own sums, product."""
    rollout = torch.eye(fused.shape[-1], dtype=fused.dtype).expand_as(fused[0])
    for layer in _discard(fused, ratio, kept):
        mixed = 0.5 * torch.eye(layer.shape[-1], dtype=layer.dtype) + 0.5 * layer
        rollout = (mixed / mixed.sum(-1, keepdim=True)) @ rollout
    return rollout


def test_attention_is_the_last_layers_head_mean_on_the_grid(case):
    model, images = case
    expected = _grid(_weights(model, images)[-1].mean(dim=1), model, images)
    torch.testing.assert_close(explain(model, images, "attention", preprocessed=True), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fusion, ratio", [("mean", 0.0), ("max", 0.5)])
def test_rollout_multiplies_the_fused_layers_with_the_residual(case, fusion, ratio):
    model, images = case
    maps = _weights(model, images)
    fused = maps.mean(dim=2) if fusion == "mean" else maps.amax(dim=2)
    expected = _grid(_roll(fused, ratio, 0 if model.config.class_token else None), model, images)
    for impl, got in _every_path(model, images, "rollout", head_fusion=fusion, discard_ratio=ratio).items():
        torch.testing.assert_close(got, expected, **F64_TOL, msg=impl)


def _logit(classes):
    return lambda m, x: m(x)[torch.arange(len(x)), classes]


def test_gradient_rollout_rolls_out_the_clamped_mean_of_the_weighted_heads(case):
    model, images = case
    classes = torch.tensor([3, 0, 4])
    maps, grads = map(torch.stack, attention_and_gradients(model, images, _logit(classes)))
    fused = (grads * maps).mean(dim=2).clamp(min=0)  # (l, b, n, n)
    expected = _grid(_roll(fused, 0.9, 0 if model.config.class_token else None), model, images)
    for impl, got in _every_path(model, images, "gradient-rollout", classes).items():
        torch.testing.assert_close(got, expected, **F64_TOL, msg=impl)


@pytest.mark.parametrize("start_layer", [0, 1])
def test_relevance_is_chefers_from_the_start_layer(case, start_layer):
    model, images = case
    expected = _grid(chefer_reference(model, images, _logit(torch.tensor(3)), start_layer), model, images)
    for impl, got in _every_path(model, images, "relevance", 3, start_layer=start_layer).items():
        torch.testing.assert_close(got, expected, **F64_TOL, msg=impl)


def _reference_cam(model, images, classes, layer):
    """pytorch-grad-cam's recipe written out: the activation kept by a forward hook, its gradient by a tensor hook
    during backward of the logits, the tokens past the prefix folded onto the grid as (b, D, gh, gw), channel
    weights the gradient's mean over the grid, the ReLU of the weighted sum."""
    kept = {}

    def hook(_module, _args, output):
        kept["activations"] = output.detach()
        output.register_hook(lambda grad: kept.update(grads=grad))

    handle = model.blocks[layer].attn.norm.register_forward_hook(hook)
    model.set_attn_impl("einsum")
    try:
        model(images)[torch.arange(len(images)), classes].sum().backward()
    finally:
        handle.remove()
    model.zero_grad()
    layout = model.patch_embed.layout(images.shape[-2:])
    start, (gh, gw) = layout.num_prefix, layout.grid

    def fold(tensor):
        return tensor[:, start:, :].reshape(len(tensor), gh, gw, tensor.size(2)).permute(0, 3, 1, 2)

    activations, grads = fold(kept["activations"]), fold(kept["grads"])
    weights = grads.mean(dim=(2, 3))
    return (weights[:, :, None, None] * activations).sum(dim=1).clamp(min=0)


@pytest.mark.parametrize("layer", [-1, 0])
def test_grad_cam_weighs_the_layernorm_channels_by_their_mean_gradient(case, layer):
    model, images = case
    classes = torch.tensor([1, 2, 1])
    expected = _reference_cam(model, images, classes, layer)
    assert (expected > 0).any()
    for impl, got in _every_path(model, images, "grad-cam", classes, layer=layer).items():
        torch.testing.assert_close(got, expected, **F64_TOL, msg=impl)
    torch.testing.assert_close(grad_cam(model, images, classes, layer=layer, preprocessed=True), expected, **F64_TOL)


def test_random_is_seeded_on_the_grid_and_differs_by_seed(case):
    model, images = case
    a, b = (explain(model, images, "random", preprocessed=True, seed=s) for s in (1, 2))
    assert a.shape == (3, 4, 4) and torch.equal(a, explain(model, images, "random", preprocessed=True, seed=1))
    assert not torch.equal(a, b) and 0 <= a.min() and a.max() < 1


def test_every_method_keeps_the_models_mode_and_labels_its_changed_parameters():
    model = tiny_vit(TINY).train()
    images = torch.rand(1, 1, 8, 8)
    for name in METHODS:
        assert explain(model, images, name, 0, preprocessed=True).shape == (1, 4, 4)
        assert model.training, name
    assert METHODS["rollout"].label({"head_fusion": "max"}) == "rollout (head_fusion max)"
    assert METHODS["rollout"].label() == "rollout"
    assert METHODS["rollout"].label(every=True) == "rollout (residual 0.5, head_fusion mean, discard_ratio 0)"


def test_refusals_name_the_value_and_what_is_expected():
    model, images = tiny_vit(TINY), torch.rand(2, 1, 8, 8)
    names = ", ".join(map(repr, METHODS))  # every method of the registry, in its order
    with pytest.raises(ValueError, match=f"unknown method 'gradcam'; expected one of {names}"):
        explain(model, images, "gradcam", preprocessed=True)
    with pytest.raises(TypeError, match="method 'rollout' takes no parameter seed \\(its parameters: residual, head"):
        explain(model, images, "rollout", preprocessed=True, seed=1)
    with pytest.raises(ValueError, match="head_fusion"):
        explain(model, images, "rollout", preprocessed=True, head_fusion="median")
    with pytest.raises(ValueError, match="discard_ratio must be in \\[0, 1\\), got 1.0"):
        explain(model, images, "gradient-rollout", 0, preprocessed=True, discard_ratio=1.0)
    with pytest.raises(ValueError, match="start_layer 2 out of range for 2 layers \\(valid: -2..1\\)"):
        explain(model, images, "relevance", 0, preprocessed=True, start_layer=2)
    with pytest.raises(ValueError, match="layer 5 out of range for a ViT of depth 2"):
        explain(model, images, "grad-cam", 0, preprocessed=True, layer=5)
    with pytest.raises(ValueError, match="grad_cam explains one class per image: an int or \\(b,\\), got 2"):
        grad_cam(model, images, [[0, 1], [1, 2]], preprocessed=True)
    with pytest.raises(ValueError, match="one target per image.*shape \\(2, 2\\)"):
        explain(model, images, "relevance", torch.zeros(2, 2, dtype=torch.long), preprocessed=True)
    for name, who in (("relevance", "relevance"), ("gradient-rollout", "gradient rollout")):
        # Two classes per image as nested lists reach the method itself, which explains one: refused, not the first.
        with pytest.raises(ValueError, match=f"^{who} explains one class per image: an int or \\(b,\\), got 2$"):
            explain(model, images, name, [[0, 1], [1, 2]], preprocessed=True)


def test_a_given_map_is_refused_as_explain_refuses_a_map_that_is_not_finite():
    # explain_all takes a study's maps as they are (given=), but through the same check every computed map passes
    from vit_einops.inspect import explain_all

    torch.manual_seed(0)
    model = tiny_vit(TINY_DIGITS).eval()
    images = torch.rand(2, 1, 8, 8)
    given = torch.zeros(2, 4, 4)
    given[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"^the maps of method 'decomposition' hold 1 non-finite values \(nan or inf\) "
                                         r"of 32: in image 1"):  # fmt: skip
        explain_all(model, images, preprocessed=True, given={"decomposition": given})
    maps = explain_all(model, images, preprocessed=True, given={"decomposition": given.nan_to_num()})
    assert torch.equal(maps["decomposition"], given.nan_to_num())
