"""Every other computation path of the model against an independent implementation: torch's encoder layer,
a torch-built encoder, conv vs einops-linear patchify (and torch's own unfold), pooling, GELU, ResidualAdd."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from _equiv import F32_TOL, F64_TOL, assert_close, forward_backward
from hypothesis import given
from hypothesis import strategies as st

from vit_einops import (
    ATTN_IMPLS,
    ClassificationHead,
    FeedForwardBlock,
    PatchEmbedding,
    ResidualAdd,
    TransformerEncoderBlock,
    ViT,
    ViTConfig,
    conv_to_linear_weight,
    linear_to_conv_weight,
    set_attn_impl,
)
from vit_einops.network.head import TokenPool
from vit_einops.reference import torch_encoder_layer_from, torch_reference_vit


def randomize_norms(module: torch.nn.Module, seed: int) -> None:
    """LayerNorms start at (1, 0); give them random affine weights so a swapped or missing norm would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g, dtype=m.weight.dtype))
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=g, dtype=m.bias.dtype))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@given(
    b=st.integers(1, 3),
    n=st.integers(1, 10),
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 6),
    mlp_mult=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_block_matches_torch_transformer_encoder_layer(impl, b, n, heads, head_dim, mlp_mult, seed):
    torch.manual_seed(seed)
    dim = heads * head_dim
    block = set_attn_impl(
        TransformerEncoderBlock(ViTConfig(dim=dim, heads=heads, mlp_dim=mlp_mult * dim)), impl
    ).double()
    randomize_norms(block, seed)
    ref = torch_encoder_layer_from(block).train()  # train(): torch's eval fast path is covered by the model test
    x = torch.randn(b, n, dim, dtype=torch.float64)
    up = torch.randn(b, n, dim, dtype=torch.float64)
    ours = forward_backward(block, x, [block.attn.mha.qkv.weight, block.mlp.ff.fc1.weight], up)
    theirs = forward_backward(ref, x, [ref.self_attn.in_proj_weight, ref.linear1.weight], up)
    assert_close(ours[0], theirs[0], F64_TOL, "block output")
    for name, g, rg in zip(["x", "qkv.weight", "fc1.weight"], ours[1], theirs[1]):
        assert_close(g, rg, F64_TOL, f"grad {name}")


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_whole_model_matches_torch_built_encoder_in_eval(impl, pool):
    """ViT-Ti width at 32 px in float32 eval mode, where torch takes its fused encoder-layer fast path."""
    torch.manual_seed(0)
    model = ViT(
        image_size=32, patch_size=8, dim=192, depth=3, heads=3, mlp_dim=768, num_classes=10, pool=pool, attn_impl=impl
    )
    randomize_norms(model, 1)
    model.eval()
    ref = torch_reference_vit(model).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        assert_close(model(x), ref(x), F32_TOL, "logits")


@given(
    b=st.integers(1, 3),
    c=st.integers(1, 4),
    ph=st.integers(1, 5),
    pw=st.integers(1, 5),
    gh=st.integers(1, 4),
    gw=st.integers(1, 4),
    dim=st.integers(1, 16),
    seed=st.integers(0, 2**16),
)
def test_conv_and_einops_linear_patchify_are_the_same_map(b, c, ph, pw, gh, gw, dim, seed):
    torch.manual_seed(seed)
    size, patch = (gh * ph, gw * pw), (ph, pw)
    conv = PatchEmbedding(size, patch, c, dim).double()
    linear = PatchEmbedding(size, patch, c, dim, patchify="linear").double()
    state = dict(conv.state_dict())
    state["proj.weight"] = conv_to_linear_weight(state["proj.weight"])
    linear.load_state_dict(state)
    x = torch.randn(b, c, *size, dtype=torch.float64)
    assert_close(linear(x), conv(x), F64_TOL, "linear vs conv patchify")
    # The inverse reshape restores the kernel exactly.
    assert torch.equal(linear_to_conv_weight(linear.proj.weight, c, patch), conv.proj.weight)
    # Independent of einops: torch's unfold extracts the same patches (its order is (c p1 p2), ours (p1 p2 c)).
    patches = F.unfold(x, kernel_size=patch, stride=patch).transpose(1, 2)  # (b, n', c*ph*pw)
    w = conv.proj.weight.reshape(dim, -1)
    tokens = patches @ w.T + conv.proj.bias
    expected = torch.cat([conv.cls_token.weight.expand(b, 1, dim), tokens], 1) + conv.pos_embed.weight
    assert_close(conv(x), expected, F64_TOL, "conv patchify vs unfold")


def test_patch_order_is_row_major():
    """Token t+1 is the patch at grid row t // gw, column t % gw (what position embeddings and rollout assume)."""
    embed = PatchEmbedding((6, 8), 2, 1, 1, patchify="linear")
    with torch.no_grad():
        embed.proj.weight.zero_()
        embed.proj.weight[0, 0] = 1.0  # picks the top-left pixel of each patch
        embed.cls_token.weight.zero_()
        embed.pos_embed.weight.zero_()
    image = torch.arange(48.0).reshape(1, 1, 6, 8)
    tokens = embed(image)[0, 1:, 0]
    expected = torch.tensor([image[0, 0, 2 * r, 2 * c].item() for r in range(3) for c in range(4)])
    torch.testing.assert_close(tokens, expected)


def test_pooling_cls_takes_token_zero_and_mean_excludes_it():
    x = torch.randn(3, 7, 5)
    torch.testing.assert_close(TokenPool("cls")(x), x[:, 0])
    torch.testing.assert_close(TokenPool("mean")(x), x[:, 1:].sum(1) / 6)


def test_fc_norm_moves_the_final_layer_norm_after_pooling():
    """fc_norm: LN(mean of tokens) instead of mean of LN(tokens); for "cls" pooling the two orders agree."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    for pool in ("cls", "mean"):
        config = ViTConfig(dim=16, heads=1, num_classes=4, pool=pool)
        before = ClassificationHead(config).double()
        randomize_norms(before, 0)
        after = ClassificationHead(replace(config, fc_norm=True)).double()
        after.load_state_dict(before.state_dict())
        assert list(after._modules) == ["pool", "norm", "fc"]
        pooled = x[:, 0] if pool == "cls" else x[:, 1:].mean(1)
        torch.testing.assert_close(after(x), before.fc(before.norm(pooled)), **F64_TOL)
        if pool == "cls":
            torch.testing.assert_close(after(x), before(x), **F64_TOL)
        else:
            assert not torch.allclose(after(x), before(x), atol=1e-3)


def test_feed_forward_uses_exact_erf_gelu():
    torch.manual_seed(0)
    ff = FeedForwardBlock(8, 16).double()
    x = torch.randn(4, 8, dtype=torch.float64) * 3
    h = x @ ff.fc1.weight.T + ff.fc1.bias
    expected = (0.5 * h * (1 + torch.erf(h / math.sqrt(2)))) @ ff.fc2.weight.T + ff.fc2.bias
    torch.testing.assert_close(ff(x), expected, **F64_TOL)
    tanh_gelu = F.gelu(h, approximate="tanh") @ ff.fc2.weight.T + ff.fc2.bias
    assert not torch.allclose(ff(x), tanh_gelu, atol=1e-6)


def test_feed_forward_and_patch_embedding_from_config_pass_each_field_to_its_argument():
    """The model's MLP and patch embedding are the layers built alone from the config's fields, field by field: the
    same modules, widths, activation, rates, epsilon, tokens and resampling (every option away from its default)."""
    config = ViTConfig(
        image_size=(8, 12), patch_size=(2, 4), in_channels=2, dim=12, heads=3, mlp_dim=20, dropout=0.25,
        act="quick_gelu", patchify="linear", patch_bias=False, distill_token=True, register_tokens=2,
        pos_embed_prefix=False, pre_norm=True, layer_norm_eps=0.125, dynamic_size="hf",
    )  # fmt: skip
    ff = FeedForwardBlock(12, 20, act="quick_gelu", dropout=0.25)
    embed = PatchEmbedding(
        (8, 12), (2, 4), 2, 12, patchify="linear", bias=False, distill_token=True, register_tokens=2,
        pos_embed_prefix=False, dropout=0.25, pre_norm=True, layer_norm_eps=0.125, dynamic_size="hf",
    )  # fmt: skip
    assert repr(FeedForwardBlock.from_config(config)) == repr(ff)
    assert repr(PatchEmbedding.from_config(config)) == repr(embed)
    model = ViT.from_config(config)
    assert repr(model.blocks[0].mlp.ff) == repr(ff) and repr(model.patch_embed) == repr(embed)
    assert (embed.image_size, embed.patch_size, embed.grid_size) == ((8, 12), (2, 4), (4, 3))
    assert embed.pos_embed.weight.shape == (1, 12, 12)  # the patches' rows only (pos_embed_prefix False)
    assert embed(torch.randn(1, 2, 8, 12)).shape == (1, 1 + 1 + 2 + 12, 12)


def test_residual_add_is_out_of_place():
    fn = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    before = x.clone()
    out = ResidualAdd(fn)(x)
    torch.testing.assert_close(out, fn(x) + before)
    assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()


def test_position_embedding_is_added_after_class_token_and_dropout_follows():
    """Eq. 1 order: the class token gets E_pos row 0; dropout (train) acts after the addition."""
    embed = PatchEmbedding(4, 2, 1, 3, dropout=0.5)
    x = torch.randn(2, 1, 4, 4)
    embed.eval()
    out = embed(x)
    torch.testing.assert_close(out[:, 0], (embed.cls_token.weight + embed.pos_embed.weight[:, :1])[0].expand(2, 3))
    embed.train()
    dropped = embed(x)
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], 2 * out[kept])  # inverted dropout scales kept values by 1/(1-p)
