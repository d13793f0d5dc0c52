"""LayerScale, register tokens and positions for the patches only (DINOv2 with registers, DeiT III): each option
against the same model written out by hand, and the paper's ViT unchanged when they are left at their defaults.
timm's own models are compared in tests/test_interop_libs.py."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from hypothesis import given
from hypothesis import strategies as st

from vit_einops import ViT, ViTConfig, parameter_count
from vit_einops.interop import timm_config, to_hf, to_timm, to_torchvision, torchvision_kwargs
from vit_einops.interop.resample import resample_vit

R = 3  # registers in these tests: not 1 or 4, so that an index off by one or a hard-coded 4 shows


def test_defaults_build_the_papers_vit_with_todays_keys():
    config = ViTConfig(**TINY_RGB16)
    assert (config.layer_scale, config.register_tokens, config.pos_embed_prefix) == (None, 0, True)
    assert config.beyond_paper() == [] and config.num_prefix_tokens == 1 and config.num_tokens == 17
    model = tiny_vit(TINY_RGB16)
    keys = set(model.state_dict())
    assert not {k for k in keys if "reg_token" in k or ".ls." in k}
    assert model.state_dict()["patch_embed.pos_embed.weight"].shape == (1, 17, 32)
    assert model.num_prefix_tokens == 1
    # The same keys and count as a model built without naming the new fields at all.
    assert sum(p.numel() for p in model.parameters()) == parameter_count(config)


@pytest.mark.parametrize("pos_embed_prefix", [True, False])
def test_register_tokens_sit_between_the_class_token_and_the_patches(pos_embed_prefix):
    model = tiny_vit(TINY_RGB16, register_tokens=R, pos_embed_prefix=pos_embed_prefix)
    pe = model.patch_embed
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        patches = torch.nn.functional.conv2d(x, pe.proj.weight, pe.proj.bias, stride=4).flatten(2).transpose(1, 2)
        cls, reg, pos = pe.cls_token.weight.expand(2, 1, 32), pe.reg_token.weight.expand(2, R, 32), pe.pos_embed.weight
        if pos_embed_prefix:  # E_pos has a row for every token
            expected = torch.cat([cls, reg, patches], dim=1) + pos
        else:  # E_pos has the patches' rows only (timm's no_embed_class)
            expected = torch.cat([cls, reg, patches + pos], dim=1)
        torch.testing.assert_close(pe(x), expected)
    assert pos.shape == (1, 16 + (1 + R) * pos_embed_prefix, 32)
    assert model.forward_features(x).shape == (2, 1 + R + 16, 32) and model(x).shape == (2, 5)
    assert model.num_prefix_tokens == 1 + R
    assert f"RegisterTokens(count={R})" in str(model)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_pooling_skips_the_register_tokens(pool):
    model = tiny_vit(TINY_RGB16, register_tokens=R, pool=pool, fc_norm=True)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(x)  # fc_norm: un-normed tokens, the norm follows pooling
        pooled = tokens[:, 0] if pool == "cls" else tokens[:, 1 + R :].mean(dim=1)
        expected = model.head.fc(model.head.norm(pooled))
        torch.testing.assert_close(model(x), expected)


def test_layer_scale_equals_the_branch_outputs_scaled_by_gamma():
    """A LayerScale model equals the plain model whose branch outputs (attention proj, fc2) are scaled by gamma."""
    scaled = tiny_vit(TINY_RGB16, layer_scale=0.5)
    plain = tiny_vit(TINY_RGB16)
    with torch.no_grad():
        for block in scaled.blocks:
            for branch in (block.attn.ls, block.mlp.ls):
                branch.gamma.copy_(torch.rand(32) * 2 - 1)  # each channel its own scale, some negative
        state = {k: v for k, v in scaled.state_dict().items() if ".ls." not in k}
        for i, block in enumerate(scaled.blocks):
            for prefix, gamma in ((f"blocks.{i}.attn.mha.proj", block.attn.ls.gamma),
                                  (f"blocks.{i}.mlp.ff.fc2", block.mlp.ls.gamma)):  # fmt: skip
                state[f"{prefix}.weight"] = state[f"{prefix}.weight"] * gamma[:, None]
                state[f"{prefix}.bias"] = state[f"{prefix}.bias"] * gamma
        plain.load_state_dict(state)
        x = torch.randn(2, 3, 16, 16)
        torch.testing.assert_close(scaled(x), plain(x))
    assert scaled.blocks[0].attn.ls.gamma.shape == (32,)
    assert "LayerScale(dim=32, init=0.5)" in str(scaled)
    fresh = tiny_vit(TINY_RGB16, layer_scale=1e-5)
    assert torch.equal(fresh.blocks[1].mlp.ls.gamma, torch.full((32,), 1e-5))


@given(
    layer_scale=st.none() | st.floats(1e-6, 1.0),
    register_tokens=st.integers(0, 5),
    pos_embed_prefix=st.booleans(),
    pool=st.sampled_from(["cls", "mean"]),
)
def test_parameter_count_and_config_round_trip(layer_scale, register_tokens, pos_embed_prefix, pool):
    config = ViTConfig(**TINY_RGB16, layer_scale=layer_scale, register_tokens=register_tokens,
                       pos_embed_prefix=pos_embed_prefix, pool=pool)  # fmt: skip
    with torch.device("meta"):
        model = ViT.from_config(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    assert model.config == config == ViTConfig.from_dict(config.to_dict())
    with torch.device("meta"):
        again = ViT.from_config(model.config)
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("layer_scale", 0.0, ValueError, "layer_scale must be a positive finite float, got 0.0"),
        ("layer_scale", float("nan"), ValueError, "layer_scale"),
        ("register_tokens", -1, ValueError, "register_tokens"),
        ("register_tokens", 2.0, TypeError, "register_tokens"),
        ("pos_embed_prefix", "no", TypeError, "pos_embed_prefix must be a bool, got 'no' of type str"),
    ],
)
def test_bad_values_are_refused_at_construction(field, value, error, message):
    with pytest.raises(error, match=message):
        ViTConfig(**TINY_RGB16, **{field: value})


def test_resample_keeps_the_prefix_rows_and_resizes_the_grid():
    """resample_vit copies the prefix rows (when E_pos has them) and interpolates the patch rows alone; the values
    against timm's resampling are in tests/test_interop_libs.py."""
    for prefix in (True, False):
        model = tiny_vit(TINY_RGB16, register_tokens=R, pos_embed_prefix=prefix)
        bigger = resample_vit(model, 32)
        pos, new = model.patch_embed.pos_embed.weight, bigger.patch_embed.pos_embed.weight
        assert new.shape == (1, 64 + (1 + R) * prefix, 32)
        assert torch.equal(new[:, : (1 + R) * prefix], pos[:, : (1 + R) * prefix])
        assert bigger(torch.randn(1, 3, 32, 32)).shape == (1, 5)


@pytest.mark.parametrize("options", [dict(register_tokens=R), dict(pos_embed_prefix=False)])
def test_formats_that_know_only_the_papers_tokens_refuse(options, tmp_path):
    model = tiny_vit(TINY_RGB16, **options)
    with pytest.raises(ValueError, match="torchvision's VisionTransformer cannot express this config"):
        torchvision_kwargs(model.config)
    with pytest.raises(ValueError, match="Hugging Face's ViT cannot express this model"):
        to_hf(model)
    with pytest.raises(ValueError, match="the paper's blocks and tokens only"):
        to_torchvision(model)


def test_layer_scale_models_are_refused_by_torchvision_and_hf():
    model = tiny_vit(TINY_RGB16, layer_scale=1e-5)
    # LayerScale makes it a DINOv2, which has no classifier
    with pytest.raises(ValueError, match=r"Hugging Face's Dinov2Model cannot express this model: it has num_classes 5"):
        to_hf(model)
    with pytest.raises(ValueError, match="layer_scale 1e-05"):
        torchvision_kwargs(model.config)


# What no tensor holds, told: a file with registers or LayerScale that fits no timm arch is refused without it.
TOLD = dict(heads=4, act="gelu", layer_norm_eps=1e-6)


def test_timm_keys_tell_registers_layer_scale_and_the_position_layout():
    """timm_config on a state dict of our own export: each option is read back from the keys and shapes alone."""
    for registers, prefix in ((0, True), (R, True), (R, False), (0, False)):
        model = tiny_vit(TINY_RGB16, register_tokens=registers, pos_embed_prefix=prefix, layer_scale=1e-5)
        read = timm_config(to_timm(model), **TOLD)
        assert read == model.config


def test_timm_position_rows_that_fit_both_layouts_ask_for_the_image_size():
    """4 registers: 9 rows are a 3 x 3 grid alone, or 2 x 2 after the 5 prefix rows; only image_size can tell."""
    model = tiny_vit(TINY_RGB16, image_size=12, register_tokens=4, pos_embed_prefix=False)
    state = to_timm(model)
    with pytest.raises(ValueError, match="the timm pos_embed has 9 rows: a square grid both with"):
        timm_config(state, **TOLD)
    assert timm_config(state, **TOLD, image_size=12) == model.config
    assert timm_config(state, **TOLD, pos_embed_prefix=False) == model.config


def test_a_plain_timm_vit_keeps_the_papers_layout_unless_told():
    """No registers, no LayerScale: pos_embed covers the class token, as in the paper, unless the caller says
    pos_embed_prefix=False (a plain ViT trained with timm's no_embed_class)."""
    model = tiny_vit(TINY_RGB16, pos_embed_prefix=False)  # 16 rows: read as the paper's layout they are 15 patches
    with pytest.raises(ValueError, match="15 patch rows, not a square grid; pass image_size"):
        timm_config(to_timm(model), heads=4)
    assert timm_config(to_timm(model), heads=4, pos_embed_prefix=False) == model.config
    with pytest.raises(TypeError, match="pos_embed_prefix must be a bool or None, got str"):
        timm_config(to_timm(model), heads=4, pos_embed_prefix="no")
