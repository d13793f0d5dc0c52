"""Feature extraction as the ViT course does it: pre-head representation, intermediate tokens, frozen backbone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _hooks import block_outputs, classifier_input

from vit_einops import ViT
from vit_einops import load_vit, save_vit
from vit_einops.interop import freeze_backbone, intermediate_layers, pre_logits, replace_head

TINY = dict(image_size=32, patch_size=8, dim=48, depth=3, heads=4, mlp_dim=96, num_classes=5)


@pytest.mark.parametrize("kwargs", [{}, {"pool": "mean"}, {"representation_size": 7}, {"num_classes": 0}])
@torch.no_grad()
def test_pre_logits_is_what_the_classifier_reads(kwargs):
    model = ViT(**{**TINY, **kwargs}).eval()
    x = torch.randn(2, 3, 32, 32)
    features = pre_logits(model, x)
    assert torch.equal(features, classifier_input(model, x))
    if model.config.num_classes == 0:
        assert torch.equal(features, model(x))


@torch.no_grad()
def test_pre_logits_is_eq_4():
    """y = LN(z_L^0), computed here from the last block's tokens with F.layer_norm."""
    model = ViT(**TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    z_last = block_outputs(model, x)[-1]
    norm = model.head.norm
    torch.testing.assert_close(pre_logits(model, x), F.layer_norm(z_last, (48,), norm.weight, norm.bias, 1e-6)[:, 0])


@torch.no_grad()
def test_intermediate_layers_match_hooks():
    model = ViT(**TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    hooked = block_outputs(model, x)
    got = intermediate_layers(model, x, [2, 0, -2])
    assert len(got) == 3 and all(t.shape == (2, 17, 48) for t in got)
    for tokens, i in zip(got, [2, 0, 1], strict=True):
        assert torch.equal(tokens, hooked[i])
    normed = intermediate_layers(model, x, [-1], norm=True)[0]
    assert torch.equal(normed, model.head.norm(hooked[2]))


def test_blocks_after_the_deepest_layer_are_not_run():
    model = ViT(**TINY).eval()
    calls = []
    model.blocks[2].register_forward_hook(lambda *a: calls.append(1))
    intermediate_layers(model, torch.randn(1, 3, 32, 32), [0, 1])
    assert calls == []


@pytest.mark.parametrize(
    "layers, error, match",
    [
        ([3], ValueError, r"layer index 3 out of range for a ViT of depth 3 \(valid: -3..2\)"),
        ([-4], ValueError, "layer index -4 out of range"),
        ([True], TypeError, "layer index must be an int, got True"),
        ([], TypeError, "non-empty sequence"),
        (1, TypeError, "non-empty sequence"),
    ],
)
def test_intermediate_layers_bad_indices(layers, error, match):
    with pytest.raises(error, match=match):
        intermediate_layers(ViT(**TINY), torch.randn(1, 3, 32, 32), layers)


def test_features_check_the_input():
    with pytest.raises(ValueError, match=r"expected height, width \(32, 32\)"):
        pre_logits(ViT(**TINY), torch.randn(1, 3, 16, 16))
    with pytest.raises(TypeError, match="expected a vit_einops.ViT"):
        pre_logits(torch.nn.Linear(2, 2), torch.randn(1, 2))


def test_replace_head_as_the_paper_fine_tunes(tmp_path):
    model = ViT(**TINY, representation_size=7).eval()
    x = torch.randn(2, 3, 32, 32)
    before = pre_logits(model, x)
    assert replace_head(model, 3) is model
    assert not hasattr(model.head, "pre_logits")
    assert model.head.fc.weight.shape == (3, 48)
    assert (model.config.num_classes, model.config.representation_size) == (3, None)
    assert torch.equal(model(x), torch.zeros(2, 3))  # zero-initialised D x K layer
    assert not torch.equal(pre_logits(model, x), before)  # the tanh layer went with the old head
    loaded = load_vit(save_vit(model, tmp_path / "m.safetensors"))  # config and weights still agree
    assert loaded.config == model.config
    replace_head(model, 0)
    assert torch.equal(model(x), pre_logits(model, x))


def test_frozen_backbone_trains_only_the_new_head():
    model = replace_head(ViT(**TINY), 3)
    assert freeze_backbone(model) == ["head.fc.weight", "head.fc.bias"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    optimizer.step()
    after = model.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed == ["head.fc.bias", "head.fc.weight"]
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("head.fc."))


def test_replace_head_validates_num_classes():
    with pytest.raises(ValueError, match="num_classes must be >= 0"):
        replace_head(ViT(**TINY), -1)
