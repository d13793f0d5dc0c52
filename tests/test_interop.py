"""Conversions to and from the torchvision and timm key layouts, with torch alone (no torchvision, no timm).

What runs here always: round trips through our own exporters (exact, bit for bit), config inference, the key
checks, and a forward pass written from torch primitives over torchvision's key names that must give our logits.
Against the libraries themselves: tests/test_interop_libs.py (run by .ci/run-interop in the heavy venv).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _equiv import F64_TOL, assert_close
from _interop import TINY, assert_same_state, perturbed
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_einops import ViT
from vit_einops import StateDictMismatchError
from vit_einops.interop import (
    HEADS_BY_DIM,
    from_timm,
    from_torchvision,
    load_timm,
    load_torchvision,
    timm_config,
    timm_kwargs,
    to_timm,
    to_torchvision,
    torchvision_config,
    torchvision_kwargs,
)

# ---- torchvision's forward, written from torch primitives over its key names: an independent implementation ----


def torchvision_forward(sd: dict, x: torch.Tensor, heads: int, patch: int, eps: float = 1e-6) -> torch.Tensor:
    """torchvision.models.VisionTransformer.forward (eval mode) on a torchvision-layout state dict."""
    x = F.conv2d(x, sd["conv_proj.weight"], sd["conv_proj.bias"], stride=patch).flatten(2).transpose(1, 2)
    x = torch.cat([sd["class_token"].expand(x.shape[0], -1, -1), x], dim=1) + sd["encoder.pos_embedding"]
    dim = x.shape[-1]
    depth = len({k.split(".")[2] for k in sd if k.startswith("encoder.layers.")})
    for i in range(depth):
        p = f"encoder.layers.encoder_layer_{i}."
        y = F.layer_norm(x, (dim,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps).transpose(0, 1)
        y, _ = F.multi_head_attention_forward(
            y, y, y, dim, heads,
            sd[p + "self_attention.in_proj_weight"], sd[p + "self_attention.in_proj_bias"],
            None, None, False, 0.0,
            sd[p + "self_attention.out_proj.weight"], sd[p + "self_attention.out_proj.bias"],
            training=False, need_weights=False,
        )  # fmt: skip
        x = x + y.transpose(0, 1)
        y = F.layer_norm(x, (dim,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
        y = F.linear(
            F.gelu(F.linear(y, sd[p + "mlp.0.weight"], sd[p + "mlp.0.bias"])),
            sd[p + "mlp.3.weight"],
            sd[p + "mlp.3.bias"],
        )
        x = x + y
    z = F.layer_norm(x, (dim,), sd["encoder.ln.weight"], sd["encoder.ln.bias"], eps)[:, 0]
    if "heads.pre_logits.weight" in sd:
        z = torch.tanh(F.linear(z, sd["heads.pre_logits.weight"], sd["heads.pre_logits.bias"]))
    return F.linear(z, sd["heads.head.weight"], sd["heads.head.bias"])


@pytest.mark.parametrize("representation_size", [None, 24])
def test_torchvision_layout_computes_our_logits(representation_size):
    """Float64, so the two forwards differ only by summation order (tolerance rationale: tests/_equiv.py)."""
    model = perturbed(ViT(**TINY, representation_size=representation_size)).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert_close(torchvision_forward(to_torchvision(model), x, heads=4, patch=8), model(x), F64_TOL, "logits")


def test_timm_layout_is_torchvision_layout_renamed():
    """timm and torchvision hold the same tensors: converting one to the other through us moves nothing."""
    model = perturbed(ViT(**TINY))
    tv, tm = to_torchvision(model), to_timm(model)
    assert len(tv) == len(tm)
    assert sorted(t.data_ptr() for t in tv.values()) == sorted(t.data_ptr() for t in tm.values())
    assert torch.equal(
        tm["blocks.1.attn.qkv.weight"], tv["encoder.layers.encoder_layer_1.self_attention.in_proj_weight"]
    )
    assert torch.equal(tm["blocks.0.mlp.fc2.bias"], tv["encoder.layers.encoder_layer_0.mlp.3.bias"])
    assert torch.equal(tm["norm.weight"], tv["encoder.ln.weight"])


# ---- round trips through our own exporters: exact ----


def tiny_configs(square: bool):
    """Small random ViTs; ``square`` for torchvision (square images, a classifier, class-token pooling)."""
    return st.builds(
        lambda heads, head_dim, depth, patch, grid, classes, pool, patchify, representation_size: dict(
            image_size=patch * grid[0] if square else (patch * grid[0], patch * grid[1]),
            patch_size=patch,
            dim=heads * head_dim,
            heads=heads,
            depth=depth,
            mlp_dim=2 * heads * head_dim,
            num_classes=classes + square,
            pool="cls" if square else pool,
            patchify=patchify,
            representation_size=representation_size if square else None,
        ),
        heads=st.integers(1, 3),
        head_dim=st.sampled_from([4, 8]),
        depth=st.integers(1, 3),
        patch=st.sampled_from([2, 4]),
        grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
        classes=st.integers(0, 4),
        pool=st.sampled_from(["cls", "mean"]),
        patchify=st.sampled_from(["conv", "linear"]),
        representation_size=st.sampled_from([None, 3]),
    )


@settings(max_examples=15)
@given(tiny_configs(square=False))
def test_timm_round_trip_is_exact(kwargs):
    model = perturbed(ViT(**kwargs))
    theirs = to_timm(model)
    inferred = dict(
        heads=kwargs["heads"],
        image_size=kwargs["image_size"],
        global_pool="token" if kwargs["pool"] == "cls" else "avg",
        patchify=kwargs["patchify"],
    )
    assert timm_config(theirs, **inferred) == model.config
    assert_same_state(from_timm(theirs, model.config), model.state_dict())
    assert_same_state(load_timm(theirs, **inferred).state_dict(), model.state_dict())
    assert_same_state(to_timm(load_timm(theirs, **inferred)), theirs)


@settings(max_examples=15)
@given(tiny_configs(square=True))
def test_torchvision_round_trip_is_exact(kwargs):
    model = perturbed(ViT(**kwargs))
    theirs = to_torchvision(model)
    inferred = dict(heads=kwargs["heads"], patchify=kwargs["patchify"])
    assert torchvision_config(theirs, **inferred) == model.config
    assert_same_state(from_torchvision(theirs, model.config), model.state_dict())
    assert_same_state(load_torchvision(theirs, **inferred).state_dict(), model.state_dict())
    assert_same_state(to_torchvision(load_torchvision(theirs, **inferred)), theirs)


def test_loaded_model_owns_trainable_weights():
    """Built on the meta device and filled by assignment: still Parameters that train, copies of the source."""
    theirs = to_timm(perturbed(ViT(**TINY)))
    model = load_timm(theirs, heads=4)
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in model.parameters())
    with torch.no_grad():
        model.head.fc.weight.zero_()
    assert theirs["head.weight"].abs().sum() > 0  # the source state dict is untouched


def test_torchvision_legacy_mlp_names_load():
    """Older torchvision checkpoints name the MLP linear_1/linear_2; they load as mlp.0/mlp.3 do."""
    model = ViT(**TINY)
    legacy = {
        k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v
        for k, v in to_torchvision(model).items()
    }
    assert "encoder.layers.encoder_layer_1.mlp.linear_2.bias" in legacy
    assert_same_state(load_torchvision(legacy, heads=4).state_dict(), model.state_dict())


def test_torchvision_kwargs_describe_the_config():
    config = torchvision_config(to_torchvision(perturbed(ViT(**TINY, representation_size=7))), heads=4)
    assert torchvision_kwargs(config) == dict(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=48, mlp_dim=96,
        dropout=0.0, attention_dropout=0.0, num_classes=5, representation_size=7,
    )  # fmt: skip


# ---- config inference ----


@pytest.mark.parametrize("dim", sorted(HEADS_BY_DIM))
def test_heads_default_to_table_1_by_width(dim):
    with torch.device("meta"):  # inference reads shapes only
        model = ViT(image_size=16, patch_size=8, dim=dim, depth=1, heads=HEADS_BY_DIM[dim], mlp_dim=8, num_classes=2)
    assert torchvision_config(to_torchvision(model)).heads == HEADS_BY_DIM[dim]
    assert timm_config(to_timm(model)).heads == HEADS_BY_DIM[dim]


def test_heads_of_an_unknown_width_must_be_given():
    theirs = to_timm(ViT(**TINY))
    with pytest.raises(ValueError, match="width 48 is not a Table 1 size.*pass heads="):
        timm_config(theirs)
    assert timm_config(theirs, heads=6).heads == 6  # any divisor of D fits the same tensors


def test_non_square_grid_needs_image_size():
    theirs = to_timm(ViT(**{**TINY, "image_size": (32, 16)}))
    with pytest.raises(ValueError, match="8 patch rows, not a square grid; pass image_size"):
        timm_config(theirs, heads=4)
    with pytest.raises(ValueError, match=r"image_size \(16, 16\).*but the timm position embedding has 8 patch rows"):
        timm_config(theirs, heads=4, image_size=(16, 16))
    assert timm_config(theirs, heads=4, image_size=(32, 16)).image_size == (32, 16)


def test_headless_timm_model_has_no_classifier():
    config = timm_config(to_timm(ViT(**{**TINY, "num_classes": 0})), heads=4)
    assert config.num_classes == 0


def test_inferred_fields_cannot_be_overridden():
    theirs = to_torchvision(ViT(**TINY))
    with pytest.raises(ValueError, match=r"\['dim'\] are read from the state dict"):
        torchvision_config(theirs, heads=4, dim=96)


def test_configs_the_target_cannot_express_are_refused():
    with pytest.raises(ValueError, match="torchvision.*class-token pooling only"):
        to_torchvision(ViT(**TINY, pool="mean"))
    with pytest.raises(ValueError, match="torchvision.*square images"):
        to_torchvision(ViT(**{**TINY, "image_size": (32, 16)}))
    with pytest.raises(ValueError, match="torchvision.*a classifier always"):
        to_torchvision(ViT(**{**TINY, "num_classes": 0}))
    with pytest.raises(ValueError, match=r"^timm's VisionTransformer has no counterpart of representation_size 8$"):
        to_timm(ViT(**TINY, representation_size=8))
    with pytest.raises(ValueError, match="timm's patch projection has a bias exactly when it has no pre-norm; got "
                       "patch_bias True with pre_norm True"):  # fmt: skip
        to_timm(ViT(**TINY, pre_norm=True))
    with pytest.raises(ValueError, match=r"^timm's VisionTransformer has no counterpart of head_bias False$"):
        to_timm(ViT(**TINY, head_bias=False))


def test_timm_fc_norm_is_read_from_the_keys_and_round_trips():
    model = ViT(**TINY, pool="mean", fc_norm=True)
    theirs = to_timm(model)
    assert "fc_norm.weight" in theirs and "norm.weight" not in theirs
    assert timm_kwargs(model.config)["fc_norm"] is True
    config = timm_config(theirs, heads=4, global_pool="avg")
    assert config == model.config
    assert_same_state(from_timm(theirs, config), model.state_dict())


def test_timm_without_class_token_reads_as_such():
    """No cls_token key: a model without a class token (timm's class_token=False), pooled by "avg" unless the keys
    hold attention pooling; its E_pos rows are then the patches alone."""
    model = ViT(**TINY, class_token=False, pool="mean")
    theirs = to_timm(model)
    assert "cls_token" not in theirs and theirs["pos_embed"].shape[1] == 16
    assert timm_config(theirs, heads=4) == model.config


# ---- key checks: every problem listed ----


def test_mismatch_error_lists_missing_unexpected_and_mis_shaped_keys():
    model = ViT(**TINY)
    theirs = to_torchvision(model)
    del theirs["encoder.layers.encoder_layer_1.ln_2.bias"]
    theirs["encoder.layers.encoder_layer_0.self_attention.bias_k"] = torch.zeros(1, 1, 48)
    theirs["heads.head.bias"] = torch.zeros(6)
    with pytest.raises(StateDictMismatchError) as err:
        from_torchvision(theirs, model.config)
    assert err.value.missing == ["encoder.layers.encoder_layer_1.ln_2.bias"]
    assert err.value.unexpected == ["encoder.layers.encoder_layer_0.self_attention.bias_k"]
    assert err.value.mis_shaped == {"heads.head.bias": ((6,), (5,))}
    message = str(err.value)
    assert "missing keys (1)" in message and "unexpected keys (1)" in message
    assert "mis-shaped heads.head.bias: got (6,), expected (5,)" in message


def test_timm_extras_we_do_not_model_are_unexpected_keys():
    theirs = to_timm(ViT(**TINY))
    # qk-norm, DeiT's distillation token, registers and LayerScale are modelled (tests/test_timm_families.py);
    # timm's scale_attn_norm and scale_mlp_norm (a LayerNorm inside each branch) are not.
    theirs["blocks.0.attn.norm.weight"] = torch.ones(48)
    theirs["blocks.0.mlp.norm.weight"] = torch.ones(96)
    with pytest.raises(
        StateDictMismatchError, match=r"unexpected keys \(2\): blocks.0.attn.norm.weight, blocks.0.mlp.norm.weight"
    ):
        load_timm(theirs, heads=4)


def test_timm_layer_scale_in_some_blocks_only_names_the_missing_gammas():
    theirs = to_timm(ViT(**TINY))
    theirs["blocks.0.ls1.gamma"] = torch.ones(48)
    theirs["blocks.0.ls2.gamma"] = torch.ones(48)
    with pytest.raises(StateDictMismatchError, match=r"missing keys \(2\): blocks.1.ls1.gamma, blocks.1.ls2.gamma"):
        load_timm(theirs, heads=4, pos_embed_prefix=True, act="gelu", layer_norm_eps=1e-6)  # no arch has LayerScale


def test_missing_block_in_the_middle_is_named():
    theirs = {k: v for k, v in to_timm(ViT(**{**TINY, "depth": 3})).items() if not k.startswith("blocks.1.")}
    with pytest.raises(ValueError, match=r"the keys name 2 blocks, the largest index 2; 1 block is missing \(1\)$"):
        timm_config(theirs, heads=4)


def test_key_needed_for_inference_missing_is_a_mismatch_error():
    theirs = to_torchvision(ViT(**TINY))
    del theirs["conv_proj.weight"]
    with pytest.raises(StateDictMismatchError, match="missing keys.*conv_proj.weight"):
        torchvision_config(theirs, heads=4)


def test_state_dict_of_non_tensors_is_a_type_error():
    with pytest.raises(TypeError, match="key 'cls_token' holds list"):
        timm_config({"cls_token": [0.0]})
    with pytest.raises(TypeError, match="must be a mapping"):
        from_timm([("cls_token", torch.zeros(1))], ViT(**TINY).config)


def test_exporting_a_state_dict_needs_its_config():
    model = ViT(**TINY)
    with pytest.raises(TypeError, match="needs its ViTConfig"):
        to_timm(model.state_dict())
    assert_same_state(to_timm(model.state_dict(), model.config), to_timm(model))
