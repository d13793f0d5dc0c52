"""The parts of the later ViT families (DeiT's distillation token, CLIP's pre-norm and quick-GELU, SigLIP's
attention pooling without a class token, qk-norm, bias-free projections, any input size) against torch's own
modules or the same model written out by hand: values and gradients. timm's and HF's own models are compared in
the interop tests."""

from __future__ import annotations

import dataclasses


import pytest
import torch
import torch.nn.functional as F
from _tiny import TINY_RGB16, tiny_vit
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_einops import ViT, ViTConfig, load_vit, parameter_count, save_vit
from vit_einops.interop.resample import resample_vit
from vit_einops.network.patch_embed import resample_pos_embed
from vit_einops.network.sizes import check_model_forward

D = TINY_RGB16["dim"]


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Noise on every parameter, so that zero-initialised biases and heads cannot hide a misplaced tensor."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    return model.eval()


def test_attention_pool_equals_torch_multihead_attention_values_and_gradients():
    """SigLIP's head: one learned query through nn.MultiheadAttention (HF's SiglipMultiheadAttentionPoolingHead is
    built on it), then a pre-norm MLP added to the result."""
    model = perturb(tiny_vit(TINY_RGB16, class_token=False, pool="map"))
    pool = model.head.pool
    mha = torch.nn.MultiheadAttention(D, TINY_RGB16["heads"], batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([pool.q.weight, pool.kv.weight]))
        mha.in_proj_bias.copy_(torch.cat([pool.q.bias, pool.kv.bias]))
        mha.out_proj.weight.copy_(pool.proj.weight)
        mha.out_proj.bias.copy_(pool.proj.bias)
    tokens = torch.randn(3, 16, D, requires_grad=True)

    def by_torch(x):
        out = mha(pool.latent.expand(x.shape[0], -1, -1), x, x, need_weights=False)[0]
        ff = pool.mlp
        hidden = F.layer_norm(out, (D,), pool.norm.weight, pool.norm.bias, pool.norm.eps)
        return (out + ff.fc2(F.gelu(ff.fc1(hidden))))[:, 0]

    ours, theirs = pool(tokens), by_torch(tokens)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    (g_ours,) = torch.autograd.grad(ours.square().sum(), tokens)
    (g_theirs,) = torch.autograd.grad(theirs.square().sum(), tokens)
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-6, rtol=1e-5)
    assert model.forward_features(torch.randn(1, 3, 16, 16)).shape == (1, 16, D)  # no class token among them
    assert "AttentionPool" in str(model) and "cls_token" not in model.patch_embed._modules


def test_distilled_logits_average_the_two_classifiers_and_pre_logits_the_two_tokens():
    model = perturb(tiny_vit(TINY_RGB16, distill_token=True))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(x)
        cls_logits = tokens[:, 0] @ model.head.fc.weight.T + model.head.fc.bias
        dist_logits = tokens[:, 1] @ model.head.fc_dist.weight.T + model.head.fc_dist.bias
        torch.testing.assert_close(model(x), (cls_logits + dist_logits) / 2)
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), (tokens[:, 0] + tokens[:, 1]) / 2)
    assert model.patch_embed.layout().prefix == ("cls", "dist") and tokens.shape == (2, 18, D)
    # The distillation token sits between the class token and the patches, with its own E_pos row.
    pe = model.patch_embed
    embedded = pe(x)
    torch.testing.assert_close(embedded[:, 1], (pe.dist_token.weight[0, 0] + pe.pos_embed.weight[0, 1]).expand(2, D))
    model.reset_classifier(3)
    assert model.head.fc.out_features == model.head.fc_dist.out_features == 3
    assert not model.head.fc_dist.weight.any() and model(x).shape == (2, 3)
    assert model.get_classifier() == (model.head.fc, model.head.fc_dist)  # timm's pair for a distilled model
    assert model.freeze_backbone() == ["head.fc.weight", "head.fc.bias", "head.fc_dist.weight", "head.fc_dist.bias"]


def test_pre_norm_no_patch_bias_and_bias_free_head_as_written_out():
    """CLIP's image tower: LayerNorm on z_0 before the first block, a patch projection and a projection head
    without biases."""
    model = perturb(tiny_vit(TINY_RGB16, pre_norm=True, patch_bias=False, head_bias=False, act="quick_gelu"))
    pe = model.patch_embed
    assert pe.proj.bias is None and model.head.fc.bias is None
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        patches = F.conv2d(x, pe.proj.weight, stride=4).flatten(2).transpose(1, 2)
        z0 = torch.cat([pe.cls_token.weight.expand(2, 1, D), patches], dim=1) + pe.pos_embed.weight
        expected = F.layer_norm(z0, (D,), pe.norm_pre.weight, pe.norm_pre.bias, pe.norm_pre.eps)
        torch.testing.assert_close(pe(x), expected)
        tokens = model.forward_features(x)
        torch.testing.assert_close(model(x), tokens[:, 0] @ model.head.fc.weight.T)
    assert model.config.head_bias is False
    assert ViT.from_config(model.config).state_dict().keys() == model.state_dict().keys()


@pytest.mark.parametrize(
    ("act", "reference"),
    [
        ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / 2**0.5))),
        ("gelu_tanh", lambda x: 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))),
        ("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x)),
    ],
)
def test_each_activation_is_its_formula(act, reference):
    model = tiny_vit(TINY_RGB16, act=act)
    x = torch.linspace(-6, 6, 101, requires_grad=True)
    ours = model.blocks[0].mlp.ff.act(x)
    theirs = reference(x)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    (g_ours,) = torch.autograd.grad(ours.sum(), x)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), x)
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-5, rtol=1e-5)


def test_qk_norm_attention_equals_layer_norm_then_sdpa():
    model = perturb(tiny_vit(TINY_RGB16, qk_norm=True))
    mha = model.blocks[0].attn.mha
    h = TINY_RGB16["heads"]
    x = torch.randn(2, 17, D, requires_grad=True)

    def by_hand(x):
        q, k, v = (mha.qkv(x).reshape(2, 17, 3, h, D // h).permute(2, 0, 3, 1, 4)).unbind(0)
        q = F.layer_norm(q, (D // h,), mha.q_norm.weight, mha.q_norm.bias, mha.q_norm.eps)
        k = F.layer_norm(k, (D // h,), mha.k_norm.weight, mha.k_norm.bias, mha.k_norm.eps)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 17, D)
        return mha.proj(out)

    for impl in ("einsum", "chunked", "sdpa"):
        mha.impl = impl
        ours, theirs = mha(x), by_hand(x)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
        (g_ours,) = torch.autograd.grad(ours.sum(), x)
        (g_theirs,) = torch.autograd.grad(theirs.sum(), x)
        torch.testing.assert_close(g_ours, g_theirs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["timm", "hf"])
@pytest.mark.parametrize("size", [(24, 24), (8, 20)])
def test_dynamic_size_equals_the_model_resampled_once_to_that_size(mode, size):
    """At another input size E_pos is resampled at forward: the same numbers as resample_vit's model built for
    that size, prefix rows (class, registers) kept."""
    model = perturb(tiny_vit(TINY_RGB16, register_tokens=2, dynamic_size=mode))
    fixed = resample_vit(model, size, mode=mode)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), fixed(x), atol=1e-6, rtol=1e-5)
        features, intermediates = model.forward_intermediates(x, indices=1)
    assert intermediates[0].shape == (2, D, size[0] // 4, size[1] // 4)  # NCHW on the input's grid
    assert features.shape == (2, 3 + size[0] * size[1] // 16, D)


def test_hf_and_timm_resampling_differ_where_timm_antialiases():
    pos = torch.randn(1, 1 + 36, 8)
    timm, hf = (resample_pos_embed(pos, 3, mode=m) for m in ("timm", "hf"))
    ref = F.interpolate(pos[:, 1:].reshape(1, 6, 6, 8).permute(0, 3, 1, 2), size=3, mode="bicubic")
    torch.testing.assert_close(hf[:, 1:], ref.permute(0, 2, 3, 1).reshape(1, 9, 8))
    assert not torch.allclose(timm, hf) and torch.equal(timm[:, 0], pos[:, 0])


@pytest.mark.parametrize(
    ("overrides", "size", "message"),
    [
        ({}, (24, 24), r"expected height, width \(16, 16\), got \(24, 24\).*dynamic_size='timm' or 'hf'"),
        ({"dynamic_size": "timm"}, (18, 16), r"height, width \(18, 16\) are not positive multiples of the patch "),
        ({"dynamic_size": "hf"}, (16, 2), r"crop or resize to e.g. \(16, 4\)"),
    ],
)
def test_other_sizes_are_refused_with_what_to_do(overrides, size, message):
    model = tiny_vit(TINY_RGB16, **overrides)
    with pytest.raises(ValueError, match=message):
        model(torch.randn(1, 3, *size))


def test_dynamic_size_budgets_the_activations_of_a_huge_input(monkeypatch):
    # The entry points' check (check_model_forward) counts the tokens of the input's own grid; the forward itself
    # checks no budget.
    monkeypatch.setenv("VIT_EINOPS_MAX_MEMORY", "1M")
    model = tiny_vit(TINY_RGB16, dynamic_size="timm")
    message = "a forward pass of 1 image at 4097 tokens needs about 517.8 MiB"
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        check_model_forward(model, torch.zeros(1, 3, 256, 256))


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (dict(class_token=False), ValueError, 'pool "cls" reads the class token, but class_token is False'),
        (dict(distill_token=True, pool="mean"), ValueError, 'distill_token needs the class token and pool "cls"'),
        (dict(distill_token=True, fc_norm=True), ValueError, "distill_token has no fc_norm or representation_size"),
        (dict(pool="map", fc_norm=True), ValueError, 'pool "map" \\(attention pooling\\) has no fc_norm'),
        (dict(act="relu"), ValueError, "unknown act 'relu'; expected one of 'gelu', 'gelu_tanh', 'quick_gelu'"),
        (dict(dynamic_size="torchvision"), ValueError, "unknown dynamic_size 'torchvision'; expected one of 'timm'"),
        (dict(class_token=0), TypeError, "class_token must be a bool, got 0 of type int"),
        (dict(qk_norm="yes"), TypeError, "qk_norm must be a bool, got 'yes' of type str"),
        (dict(head_bias=None), TypeError, "head_bias must be a bool, got None"),
    ],
)
def test_config_refuses_what_no_family_builds(overrides, error, message):
    with pytest.raises(error, match=message):
        ViTConfig(**{**TINY_RGB16, **overrides})


def test_a_paper_config_reads_as_before_and_options_appear_only_when_set():
    plain = ViTConfig(**TINY_RGB16).to_dict()
    assert set(plain) == {
        "image_size", "patch_size", "in_channels", "num_classes", "dim", "depth", "heads", "mlp_dim", "dropout",
        "attn_dropout", "pool", "patchify", "representation_size", "fc_norm", "layer_norm_eps",
    }  # fmt: skip
    siglip = ViTConfig(**TINY_RGB16, class_token=False, pool="map", act="gelu_tanh").to_dict()
    assert set(siglip) - set(plain) == {"class_token", "act"} and siglip["pool"] == "map"
    assert ViTConfig.from_dict(siglip) == ViTConfig(**TINY_RGB16, class_token=False, pool="map", act="gelu_tanh")
    assert ViTConfig(**TINY_RGB16, class_token=False, pool="map").beyond_paper() == ["pool 'map'", "class_token False"]


def test_reset_classifier_refuses_a_pooling_the_head_cannot_switch_to():
    siglip = tiny_vit(TINY_RGB16, class_token=False, pool="map")
    with pytest.raises(ValueError, match="pools by attention \\(pool 'map', a learned module\\)"):
        siglip.reset_classifier(3, "avg")
    no_cls = tiny_vit(TINY_RGB16, class_token=False, pool="mean")
    with pytest.raises(ValueError, match="reads the class token, which this model has not"):
        no_cls.reset_classifier(3, "token")
    with pytest.raises(ValueError, match="pools its class and distillation tokens"):
        tiny_vit(TINY_RGB16, distill_token=True).reset_classifier(3, "avg")
    siglip.reset_classifier(3)
    assert siglip.head.fc.out_features == 3 and siglip.config.pool == "map"


def test_every_family_option_survives_a_model_file(tmp_path):
    model = perturb(
        tiny_vit(
            TINY_RGB16,
            class_token=False, pool="map", register_tokens=2, pos_embed_prefix=False, pre_norm=True,
            patch_bias=False, act="gelu_tanh", qk_norm=True, head_bias=False, layer_scale=1e-5, dynamic_size="hf",
        )
    )  # fmt: skip
    save_vit(model, tmp_path / "m.safetensors")
    loaded = load_vit(tmp_path / "m.safetensors").eval()
    assert loaded.config == model.config
    x = torch.randn(1, 3, 20, 12)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.no_weight_decay() == {"patch_embed.reg_token.weight", "patch_embed.pos_embed.weight"}


@settings(max_examples=25, deadline=None)
@given(
    class_token=st.booleans(),
    distill=st.booleans(),
    registers=st.integers(0, 3),
    pool=st.sampled_from(["cls", "mean", "map"]),
    flags=st.fixed_dictionaries({k: st.booleans() for k in ("pre_norm", "patch_bias", "qk_norm", "head_bias")}),
    num_classes=st.sampled_from([0, 3]),
    pos_embed_prefix=st.booleans(),
)
def test_parameter_count_and_token_layout_follow_the_modules(
    class_token, distill, registers, pool, flags, num_classes, pos_embed_prefix
):
    fields = dict(
        TINY_RGB16, class_token=class_token, distill_token=distill, register_tokens=registers, pool=pool,
        num_classes=num_classes, pos_embed_prefix=pos_embed_prefix, **flags,
    )  # fmt: skip
    try:
        config = ViTConfig(**fields)
    except ValueError:
        return  # a combination no family builds: refused above, with its message
    with torch.device("meta"):
        model = ViT.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(config)
    prefix = model.patch_embed.layout().prefix
    assert len(prefix) == model.num_prefix_tokens == class_token + distill + registers
    assert prefix[: class_token + distill] == ("cls", "dist")[: class_token + distill] or not class_token


def test_a_model_loaded_from_hf_exports_to_timm_and_torchvision_as_a_fixed_size_model(tmp_path):
    """dynamic_size says how a forward treats other sizes, not what the weights are: an HF-loaded model (which
    resamples as HF does) exports to timm's form with dynamic_img_size off (timm then refuses other sizes itself
    instead of resampling differently), and the paper-only formats do not count it as beyond the paper."""
    from vit_einops.interop import load_hf, save_hf, timm_kwargs, to_timm

    save_hf(tiny_vit(TINY_RGB16), tmp_path / "hf")
    model = load_hf(tmp_path / "hf")
    assert model.config.dynamic_size == "hf" and model.config.beyond_paper() == []
    assert timm_kwargs(model.config)["dynamic_img_size"] is False
    assert to_timm(model).keys() == to_timm(tiny_vit(TINY_RGB16)).keys()
    assert timm_kwargs(dataclasses.replace(model.config, dynamic_size="timm"))["dynamic_img_size"] is True
