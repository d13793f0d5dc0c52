"""The model as timm and torchvision users drive it: timm's methods, head swaps, a config that always describes
the model, and the course's feature-extractor workflow."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from _hooks import block_outputs, classifier_input
from _tiny import TINY_RGB16, tiny_vit
from einops import rearrange
from torch import nn

from vit_einops import ViT, ViTConfig, create_vit
from vit_einops import load_vit, save_vit

TINY = dict(TINY_RGB16, depth=3)  # three blocks: intermediate layers have a first, a middle and a last
X = torch.randn(2, 3, 16, 16)


def tiny(**kw) -> ViT:
    return tiny_vit(TINY, **kw)


# --- the signature ----------------------------------------------------------------------------------------


def test_signature_is_every_config_field_then_attn_impl_keyword_only_with_the_same_defaults():
    params = inspect.signature(ViT).parameters
    config_fields = dataclasses.fields(ViTConfig)
    assert list(params) == [f.name for f in config_fields] + ["attn_impl"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert {name: p.default for name, p in params.items()} == {
        **{f.name: f.default for f in config_fields},
        "attn_impl": "einsum",
    }
    with pytest.raises(TypeError, match="positional"):
        ViT(224)


def test_help_shows_the_arguments():
    assert "image_size: 'int | tuple[int, int]' = 224" in str(inspect.signature(ViT))


# --- timm's methods ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw", [{}, {"pool": "mean"}, {"representation_size": 7}, {"num_classes": 0}, {"pool": "mean", "fc_norm": True}]
)
@torch.no_grad()
def test_forward_features_and_forward_head_compose_to_forward(kw):
    model = tiny(**kw)
    tokens = model.forward_features(X)
    assert tokens.shape == (2, 17, 32)
    z_last = block_outputs(model, X)[-1]
    norm = model.head.norm
    if model.config.fc_norm:  # timm: the norm follows the pooling, so the tokens come out un-normed
        assert torch.equal(tokens, z_last)
    else:  # timm's forward_features returns LN(z_L), every token (Eq. 4 for the class token's row)
        torch.testing.assert_close(tokens, F.layer_norm(z_last, (32,), norm.weight, norm.bias, 1e-6))
    assert torch.equal(model.forward_head(tokens), model(X))
    features = model.forward_head(tokens, pre_logits=True)
    assert features.shape == (2, model.head_hidden_size)
    if model.num_classes:
        assert torch.equal(features, classifier_input(model, X))
    else:
        assert torch.equal(features, model(X))


def test_properties_and_classifier():
    model = tiny(representation_size=7)
    assert (model.num_classes, model.num_features, model.head_hidden_size) == (5, 32, 7)
    assert model.get_classifier() is model.head.fc
    assert (model.head.in_features, model.head.out_features) == (7, 5)
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), nn.Identity) and model.num_classes == 0


def test_no_weight_decay_names_the_token_and_positions():
    model = tiny()
    names = dict(model.named_parameters())
    skipped = model.no_weight_decay()
    assert skipped == {"patch_embed.cls_token.weight", "patch_embed.pos_embed.weight"}
    assert skipped <= set(names)


@pytest.mark.parametrize("num_classes", [3, 0])
def test_reset_classifier_zero_initialised_and_saved_model_loads(tmp_path, num_classes):
    model = tiny(representation_size=7)
    tanh_features = model.forward_head(model.forward_features(X), pre_logits=True)
    model.reset_classifier(num_classes, class_names=[f"c{i}" for i in range(num_classes)] or None)
    out = model(X)
    if num_classes:
        assert torch.equal(out, torch.zeros(2, 3))  # the paper's zero-initialised D x K layer
        assert model.class_names == ["c0", "c1", "c2"]
    else:
        assert torch.equal(out, tanh_features) and model.class_names is None  # timm keeps pre_logits too
    assert model.config.num_classes == num_classes
    loaded = load_vit(save_vit(model, tmp_path / "m.safetensors"))
    assert loaded.config == model.config
    torch.testing.assert_close(loaded.eval()(X), out, rtol=0, atol=0)


def test_reset_classifier_global_pool_takes_timms_names():
    model = tiny()
    model.reset_classifier(3, "avg")
    assert model.config.pool == "mean"
    model.reset_classifier(3, global_pool="token")
    assert model.config.pool == "cls"


def test_reset_classifier_forgets_old_class_names():
    model = tiny()
    model.reset_classifier(2, class_names=("cat", "dog"))
    assert model.class_names == ["cat", "dog"]
    model.reset_classifier(4)
    assert model.class_names is None


def test_reset_classifier_keeps_device_and_dtype():
    model = tiny().double()
    model.reset_classifier(3)
    assert model.head.fc.weight.dtype == torch.float64
    assert model(X.double()).dtype == torch.float64


@torch.no_grad()
def test_forward_intermediates_match_hooks():
    model = tiny()
    hooked = block_outputs(model, X)
    final, inter = model.forward_intermediates(X, [2, 0])
    assert torch.equal(final, model.forward_features(X))
    assert len(inter) == 2  # in block order, as timm returns them
    for got, i in zip(inter, [0, 2], strict=True):
        expected = hooked[i][:, 1:].transpose(1, 2).reshape(2, 32, 4, 4)  # (b, N', D) -> (b, D, gh, gw)
        assert torch.equal(got, expected)
    nlc = model.forward_intermediates(X, 2, output_fmt="NLC", intermediates_only=True)  # last 2 blocks
    assert [t.shape for t in nlc] == [(2, 16, 32)] * 2
    assert torch.equal(nlc[0], hooked[1][:, 1:]) and torch.equal(nlc[1], hooked[2][:, 1:])
    pairs = model.forward_intermediates(X, None, return_prefix_tokens=True, norm=True, intermediates_only=True)
    assert len(pairs) == 3
    for (spatial, prefix), z in zip(pairs, hooked, strict=True):
        normed = model.head.norm(z)
        assert torch.equal(prefix, normed[:, :1])
        assert torch.equal(spatial, rearrange(normed[:, 1:], "b (h w) d -> b d h w", h=4))


def test_get_intermediate_layers_stops_after_the_last_block_asked_for():
    model = tiny()
    calls = []
    model.blocks[2].register_forward_hook(lambda *a: calls.append(1))
    out = model.get_intermediate_layers(X, [0, 1], reshape=True)
    assert calls == [] and [t.shape for t in out] == [(2, 32, 4, 4)] * 2
    assert torch.equal(
        model.get_intermediate_layers(X)[0], model.forward_intermediates(X, [-1], output_fmt="NLC")[1][0]
    )


def test_norm_on_an_fc_norm_model_is_refused():
    with pytest.raises(ValueError, match="fc_norm=True"):
        tiny(pool="mean", fc_norm=True).forward_intermediates(X, norm=True)


# --- head swaps -------------------------------------------------------------------------------------------

HOW = ["reset_classifier", "model.head.fc = nn.Linear(32, num_classes)"]


def test_torchvision_heads_habit_raises_saying_what_to_do():
    model = tiny()
    before = model(X)
    with pytest.raises(TypeError) as err:
        model.heads = nn.Linear(32, 3)
    message = str(err.value)
    assert "ViT has no stage 'heads' (torchvision's ViT calls its classifier `heads`)" in message
    assert all(h in message for h in HOW)
    assert list(model._modules) == ["patch_embed", "blocks", "head"] and torch.equal(model(X), before)


def test_timm_head_habit_becomes_the_pooled_classifier(tmp_path):
    model = tiny()
    pooled = model.forward_head(model.forward_features(X), pre_logits=True)
    fc = nn.Linear(model.head.in_features, 3)
    model.head = fc
    assert model.head.fc is fc and isinstance(model.head, type(tiny().head))
    out = model(X)
    assert out.shape == (2, 3)  # never the per-token (2, 17, 3)
    torch.testing.assert_close(out, pooled @ fc.weight.T + fc.bias)
    assert model.config.num_classes == 3
    assert load_vit(save_vit(model, tmp_path / "m.safetensors")).config == model.config


def test_timm_identity_head_gives_pooled_features():
    model = tiny()
    pooled = model.forward_head(model.forward_features(X), pre_logits=True)
    model.head = nn.Identity()
    assert torch.equal(model(X), pooled) and model.config.num_classes == 0


@pytest.mark.parametrize(
    "target, module, error, words",
    [
        (
            "head",
            nn.Linear(48, 3),
            ValueError,
            "head.fc must read the 32 pooled features, got nn.Linear with in_features=48",
        ),
        ("head", nn.Sequential(nn.Dropout(0.2), nn.Linear(32, 3)), TypeError, "got Sequential"),
        (
            "head.fc",
            nn.Sequential(nn.Dropout(0.2), nn.Linear(32, 3)),
            TypeError,
            "head.fc must be an nn.Linear(32, num_classes) or nn.Identity(), got Sequential",
        ),
        ("head.fc", nn.Linear(16, 3), ValueError, "in_features=16"),
        ("head.fc", nn.Conv1d(32, 3, 1), TypeError, "got Conv1d"),
        ("head.classifier", nn.Linear(32, 3), TypeError, "ClassificationHead has no stage 'classifier'"),
        ("classifier", nn.Linear(32, 3), TypeError, "ViT has no stage 'classifier'"),
    ],
)
def test_head_swaps_that_cannot_work_raise_and_leave_the_model_as_it_was(target, module, error, words):
    model = tiny()
    before = model(X)
    owner = model.head if target.startswith("head.") else model
    with pytest.raises(error) as err:
        setattr(owner, target.split(".")[-1], module)
    assert words in str(err.value) and "reset_classifier" in str(err.value)
    assert torch.equal(model(X), before) and model.config == tiny().config


def test_course_fc_swap_keeps_the_config_true(tmp_path):
    model = tiny()
    model.head.fc = nn.Linear(32, 3)
    assert model.config.num_classes == 3 and model(X).shape == (2, 3)
    loaded = load_vit(save_vit(model, tmp_path / "m.safetensors"))
    torch.testing.assert_close(loaded.eval()(X), model(X), rtol=0, atol=0)


def test_config_cannot_be_assigned_or_edited():
    model = tiny()
    with pytest.raises(AttributeError, match="model.config describes the model and cannot be assigned"):
        model.config = ViTConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.config.num_classes = 3


# --- the attention path: runtime state, not config -------------------------------------------------------


def test_per_layer_impls_are_read_off_the_model_and_are_no_part_of_its_config(tmp_path):
    model = tiny()
    config = model.config
    model.blocks[0].attn.mha.impl = "sdpa"
    model.blocks[2].attn.mha.impl = "chunked"
    assert model.attn_impl == ("sdpa", "einsum", "chunked")
    assert model.config == config and "attn_impl" not in config.to_dict()
    path = save_vit(model, tmp_path / "m.safetensors")
    assert load_vit(path).attn_impl == "einsum"  # a file holds the architecture, not how it last ran
    loaded = load_vit(path, attn_impl=["sdpa", "einsum", "chunked"]).eval()
    assert loaded.attn_impl == ("sdpa", "einsum", "chunked") and loaded.config == model.config
    torch.testing.assert_close(loaded(X), model(X), rtol=1e-5, atol=1e-6)
    assert model.set_attn_impl("sdpa") is model and model.attn_impl == "sdpa"  # uniform again: one str


def test_per_layer_impls_as_an_argument():
    model = tiny(attn_impl=["einsum", "sdpa", "sdpa"])
    assert [b.attn.mha.impl for b in model.blocks] == ["einsum", "sdpa", "sdpa"]
    assert tiny(attn_impl=("sdpa",) * 3).attn_impl == "sdpa"
    rebuilt = ViT.from_config(model.config, attn_impl=["chunked", "sdpa", "einsum"])
    assert rebuilt.attn_impl == ("chunked", "sdpa", "einsum")
    assert create_vit("vit_ti_16", image_size=32, depth=2, attn_impl="chunked").attn_impl == "chunked"


def test_a_model_no_config_describes_says_what_differs():
    model = tiny()
    model.blocks[1].mlp.ff.drop1.p = 0.3
    with pytest.raises(
        ValueError,
        match=r"dropout differs between its modules \(0.0 at patch_embed.dropout, 0.3 at blocks.1.mlp.ff.drop1\)",
    ):
        _ = model.config
    model = tiny()
    model.append(nn.Softmax(dim=-1))  # nn.Sequential's own API: allowed, but no ViTConfig describes it
    with pytest.raises(ValueError, match=r"stages are \['patch_embed', 'blocks', 'head', '3'\]"):
        _ = model.config


def test_truncated_blocks_are_described():
    model = tiny()
    model.blocks = model.blocks[:2]  # timm's prune_intermediate_layers does this
    assert model.config.depth == 2 and ViT.from_config(model.config).state_dict().keys() == model.state_dict().keys()


# --- the course's feature-extractor workflow -------------------------------------------------------------


def test_feature_extractor_workflow_trains_only_the_new_head():
    """Table 1 preset -> 3 classes -> frozen backbone -> train the head through a DataLoader -> predict."""
    torch.manual_seed(0)
    model = create_vit("vit_ti_16", image_size=32, depth=2)  # ViT-Ti/16 sizes; 2 blocks keep the test fast
    model.reset_classifier(3, class_names=["pizza", "steak", "sushi"])
    assert model.freeze_backbone() == ["head.fc.weight", "head.fc.bias"]
    images, labels = torch.randn(12, 3, 32, 32), torch.arange(12) % 3
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=4, shuffle=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    model.train()
    losses = []
    for _ in range(15):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    changed = sorted(k for k, v in model.state_dict().items() if not torch.equal(before[k], v))
    assert changed == ["head.fc.bias", "head.fc.weight"]
    assert losses[0] == pytest.approx(torch.log(torch.tensor(3.0)).item(), abs=1e-6)  # zero-initialised head
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0]
    model.eval()
    predicted = [model.class_names[i] for i in model(images[:3]).argmax(-1)]
    assert model(images[:3]).shape == (3, 3) and set(predicted) <= {"pizza", "steak", "sushi"}


def test_the_classifier_swaps_with_the_core_install_alone():
    """No safetensors (the interop extra): the model's own methods still fine-tune it."""
    code = (
        "import sys\n"
        "sys.modules['safetensors'] = None  # as if not installed: importing it raises ImportError\n"
        "import torch\n"
        "from vit_einops import create_vit\n"
        "m = create_vit('vit_ti_16', image_size=32, depth=1)\n"
        "m.reset_classifier(3, class_names=['a', 'b', 'c'])\n"
        "print(m.freeze_backbone(), tuple(m(torch.rand(2, 3, 32, 32)).shape))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.splitlines() == ["['head.fc.weight', 'head.fc.bias'] (2, 3)"]
