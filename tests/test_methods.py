"""The explanation registry (vit_einops.inspect.methods): each method through ``explain`` against the same quantity
computed independently here from torch's own modules (nn.MultiheadAttention's averaged weights for the attention
maps), on a model with a class token, one with registers and one without a class token; and its refusals."""

import pytest
import torch
from _tiny import TINY_DIGITS, tiny_vit

from vit_einops.inspect import METHODS, attention_relevance, explain

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
    return model, torch.randn(3, 1, 8, 8, dtype=torch.float64)


def test_attention_is_the_last_layers_head_mean_on_the_grid(case):
    model, images = case
    expected = _grid(_weights(model, images)[-1].mean(dim=1), model, images)
    torch.testing.assert_close(explain(model, images, "attention", preprocessed=True), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fusion", ["mean", "max"])
def test_rollout_multiplies_the_fused_layers_with_the_residual(case, fusion):
    model, images = case
    maps = _weights(model, images)
    fused = maps.mean(dim=2) if fusion == "mean" else maps.amax(dim=2)
    rollout = torch.eye(maps.shape[-1], dtype=maps.dtype).expand_as(fused[0])
    for layer in fused:
        mixed = 0.5 * torch.eye(layer.shape[-1], dtype=layer.dtype) + 0.5 * layer
        rollout = (mixed / mixed.sum(-1, keepdim=True)) @ rollout
    got = explain(model, images, "rollout", preprocessed=True, head_fusion=fusion)
    torch.testing.assert_close(got, _grid(rollout, model, images), rtol=1e-10, atol=1e-12)


def test_relevance_reads_the_relevance_functions_matrix(case):
    model, images = case
    expected = _grid(attention_relevance(model, images, 3, preprocessed=True), model, images)
    torch.testing.assert_close(explain(model, images, "relevance", 3, preprocessed=True), expected)


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


def test_refusals_name_the_value_and_what_is_expected():
    model, images = tiny_vit(TINY), torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match="unknown method 'gradcam'; expected one of 'attention', 'rollout', 'relevance', 'random'"):
        explain(model, images, "gradcam", preprocessed=True)
    with pytest.raises(TypeError, match="method 'rollout' takes no parameter seed \\(its parameters: residual, head"):
        explain(model, images, "rollout", preprocessed=True, seed=1)
    with pytest.raises(ValueError, match="head_fusion"):
        explain(model, images, "rollout", preprocessed=True, head_fusion="median")
    with pytest.raises(ValueError, match="one target per image.*shape \\(2, 2\\)"):
        explain(model, images, "relevance", torch.zeros(2, 2, dtype=torch.long), preprocessed=True)
