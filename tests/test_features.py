"""Feature extraction as the ViT course does it, with the model's own methods: pre-head representation,
intermediate tokens, frozen backbone under a new head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _hooks import block_outputs, classifier_input
from _tiny import TINY_RGB, tiny_vit

from vit_einops import ViT, load_vit, save_vit

# Three blocks: one between the first and the last for an index from the end to reach (-2 is block 1), and one
# after the deepest block a request names (which must not run).
THREE_BLOCKS = dict(TINY_RGB, depth=3)


def pre_logits(model: ViT, x: torch.Tensor) -> torch.Tensor:
    return model.forward_head(model.forward_features(x), pre_logits=True)


@pytest.mark.parametrize("kwargs", [{}, {"pool": "mean"}, {"representation_size": 7}, {"num_classes": 0}])
@torch.no_grad()
def test_pre_logits_is_what_the_classifier_reads(kwargs):
    model = tiny_vit(THREE_BLOCKS, **kwargs)
    x = torch.randn(2, 3, 32, 32)
    features = pre_logits(model, x)
    assert torch.equal(features, classifier_input(model, x))
    if model.config.num_classes == 0:
        assert torch.equal(features, model(x))


@torch.no_grad()
def test_pre_logits_is_eq_4():
    """y = LN(z_L^0), computed here from the last block's tokens with F.layer_norm."""
    model = tiny_vit(THREE_BLOCKS)
    x = torch.randn(2, 3, 32, 32)
    z_last = block_outputs(model, x)[-1]
    norm = model.head.norm
    torch.testing.assert_close(pre_logits(model, x), F.layer_norm(z_last, (48,), norm.weight, norm.bias, 1e-6)[:, 0])


@torch.no_grad()
def test_intermediate_tokens_match_hooks():
    model = tiny_vit(THREE_BLOCKS)
    x = torch.randn(2, 3, 32, 32)
    hooked = block_outputs(model, x)
    pairs = model.forward_intermediates(
        x, [2, 0, -2], return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True
    )
    assert len(pairs) == 3  # block order: 0, 1, 2
    for (patches, prefix), i in zip(pairs, [0, 1, 2], strict=True):
        assert torch.equal(torch.cat([prefix, patches], dim=1), hooked[i])
    normed = model.forward_intermediates(x, [-1], norm=True, output_fmt="NLC", intermediates_only=True)[0]
    assert torch.equal(normed, model.head.norm(hooked[2])[:, 1:])


def test_blocks_after_the_deepest_layer_are_not_run():
    model = tiny_vit(THREE_BLOCKS)
    calls = []
    model.blocks[2].register_forward_hook(lambda *a: calls.append(1))
    model.get_intermediate_layers(torch.randn(1, 3, 32, 32), [0, 1])
    assert calls == []


@pytest.mark.parametrize(
    "indices, error, match",
    [
        ([3], ValueError, "block index 3 out of range"),
        ([-4], ValueError, "block index -4 out of range"),
        ([True], TypeError, "block index.*got True"),
        ([], ValueError, "indices is empty"),
    ],
)
def test_intermediate_bad_indices(indices, error, match):
    with pytest.raises(error, match=match):
        tiny_vit(THREE_BLOCKS).forward_intermediates(torch.randn(1, 3, 32, 32), indices)


def test_features_check_the_input():
    with pytest.raises(ValueError, match=r"expected height, width \(32, 32\)"):
        pre_logits(tiny_vit(THREE_BLOCKS), torch.randn(1, 3, 16, 16))


def test_a_new_head_as_the_paper_fine_tunes(tmp_path):
    """Section 3.2: remove the pre-trained head (the tanh pre_logits layer too), attach a zero-initialised D x K."""
    model = tiny_vit(THREE_BLOCKS, representation_size=7)
    x = torch.randn(2, 3, 32, 32)
    before = pre_logits(model, x)
    del model.head.pre_logits
    model.reset_classifier(3)
    assert model.head.fc.weight.shape == (3, 48)
    assert (model.config.num_classes, model.config.representation_size) == (3, None)
    assert torch.equal(model(x), torch.zeros(2, 3))  # zero-initialised D x K layer
    assert not torch.equal(pre_logits(model, x), before)  # the tanh layer went with the old head
    loaded = load_vit(save_vit(model, tmp_path / "m.safetensors"))  # config and weights still agree
    assert loaded.config == model.config
    model.reset_classifier(0)
    assert torch.equal(model(x), pre_logits(model, x))


def test_frozen_backbone_trains_only_the_new_head():
    model = tiny_vit(THREE_BLOCKS).train()
    model.reset_classifier(3)
    assert model.freeze_backbone() == ["head.fc.weight", "head.fc.bias"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    optimizer.step()
    after = model.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed == ["head.fc.bias", "head.fc.weight"]
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("head.fc."))
