"""Every bad input raises ValueError/TypeError naming the value and what was expected, where it enters."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY_RGB16

from vit_einops import (
    FeedForwardBlock,
    MultiHeadAttention,
    PatchEmbedding,
    ViT,
    ViTConfig,
    create_vit,
    set_attn_impl,
)

TINY = dict(TINY_RGB16, depth=1)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (dict(dim=30, heads=4), ValueError, "dim 30 is not divisible by heads 4"),
        (dict(image_size=18), ValueError, "image height 18 is not divisible by patch height 4"),
        (dict(image_size=(16, 18)), ValueError, "image width 18 is not divisible by patch width 4"),
        (dict(patch_size=(4, 5)), ValueError, "image width 16 is not divisible by patch width 5"),
        (dict(image_size=(16, 16, 3)), ValueError, r"image_size must be an int or an \(h, w\) pair"),
        (dict(dim=0), ValueError, "dim must be a positive int, got 0"),
        (dict(depth=-1), ValueError, "depth must be a positive int, got -1"),
        (dict(heads=0), ValueError, "heads must be a positive int, got 0"),
        (dict(mlp_dim=0), ValueError, "mlp_dim must be a positive int, got 0"),
        (dict(in_channels=0), ValueError, "in_channels must be a positive int, got 0"),
        (dict(patch_size=0), ValueError, "patch_size must be a positive int, got 0"),
        (dict(image_size=0), ValueError, "image_size must be a positive int, got 0"),
        (dict(num_classes=-1), ValueError, "num_classes must be >= 0"),
        (dict(representation_size=0), ValueError, "representation_size must be a positive int, got 0"),
        (dict(dim=32.0), TypeError, "dim must be an int, got 32.0"),
        (dict(depth=True), TypeError, "depth must be an int, got True"),
        (dict(dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        (dict(dropout=-0.1), ValueError, r"dropout must be in \[0, 1\), got -0.1"),
        (dict(attn_dropout=1.5), ValueError, r"attn_dropout must be in \[0, 1\), got 1.5"),
        (dict(dropout="0.1"), TypeError, "dropout must be a float in"),
        (dict(pool="max"), ValueError, "unknown pool 'max'; expected one of 'cls', 'mean'"),
        (dict(attn_impl="flash"), ValueError, "attn_impl 'flash'"),
        (dict(patchify="unfold"), ValueError, "unknown patchify 'unfold'"),
        (dict(fc_norm=1), TypeError, "fc_norm must be a bool, got 1"),
        (dict(layer_norm_eps=0), ValueError, "layer_norm_eps must be a positive finite float, got 0.0"),
    ],
)
def test_bad_configuration(overrides, error, message):
    with pytest.raises(error, match=message):
        ViT(**{**TINY, **overrides})


def test_unknown_keyword_is_rejected():
    with pytest.raises(TypeError, match="unexpected keyword argument 'widht'"):
        ViT(**TINY, widht=3)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'vit_x_16'; expected one of vit_ti_16, "):
        create_vit("vit_x_16")


@pytest.mark.parametrize(
    "x, error, message",
    [
        (torch.randn(2, 1, 16, 16), ValueError, r"expected 3 channels, got 1 \(input shape \(2, 1, 16, 16\)\)"),
        (torch.randn(2, 3, 16, 20), ValueError, r"expected height, width \(16, 16\), got \(16, 20\)"),
        (torch.randn(2, 3, 32, 16), ValueError, r"expected height, width \(16, 16\), got \(32, 16\)"),
        (torch.randn(3, 16, 16), ValueError, r"expected a 4-D tensor \(b, 3, 16, 16\), got 3-D"),
        (torch.randn(1, 2, 3, 16, 16), ValueError, "got 5-D"),
        (
            torch.zeros(2, 3, 16, 16, dtype=torch.uint8),
            TypeError,
            "expected a floating-point image tensor, got dtype torch.uint8",
        ),
        ([[0.0]], TypeError, "expected a torch.Tensor of shape \\(b, 3, 16, 16\\), got list"),
    ],
)
def test_bad_model_input(x, error, message):
    with pytest.raises(error, match=message):
        ViT(**TINY)(x)


def test_bad_attention_impl_and_input():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="attn_impl 'Einsum'"):
        mha.impl = "Einsum"
    assert mha.impl == "einsum"
    with pytest.raises(ValueError, match="attn_impl 'fast'"):
        set_attn_impl(ViT(**TINY), "fast")
    with pytest.raises(ValueError, match=r"expected x of shape \(b, n, 8\), got \(2, 5, 6\)"):
        mha(torch.randn(2, 5, 6))


IMPLS = "'einsum', 'chunked', 'sdpa'"


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda: MultiHeadAttention(30, 4), ValueError, "dim 30 is not divisible by heads 4"),
        (lambda: MultiHeadAttention(0, 1), ValueError, "dim must be a positive int, got 0"),
        (lambda: MultiHeadAttention(8, -2), ValueError, "heads must be a positive int, got -2"),
        (lambda: MultiHeadAttention(True, 1), TypeError, "dim must be an int, got True of type bool"),
        (lambda: MultiHeadAttention(8, 2.0), TypeError, "heads must be an int, got 2.0 of type float"),
        (lambda: MultiHeadAttention(2**63, 1), ValueError, r"dim must be at most 2\*\*63 - 1"),
        (lambda: MultiHeadAttention(8, 2, attn_dropout=1.0), ValueError, r"attn_dropout must be in \[0, 1\), got 1.0"),
        (lambda: MultiHeadAttention(8, 2, proj_dropout=-0.1), ValueError, r"proj_dropout must be in \[0, 1\), got -0"),
        (lambda: MultiHeadAttention(8, 2, proj_dropout="0.1"), TypeError, "proj_dropout must be a float in"),
        (lambda: MultiHeadAttention(8, 2, impl="flash"), ValueError, f"unknown impl 'flash'; expected one of {IMPLS}"),
        (lambda: MultiHeadAttention(8, 2, qk_norm=1), TypeError, "qk_norm must be a bool, got 1 of type int"),
        (lambda: MultiHeadAttention(8, 2, qkv_bias="yes"), ValueError, "qkv_bias must be True, False or 'qv' .*'yes'"),
        (lambda: MultiHeadAttention(8, 2, qkv_bias=1), TypeError, "qkv_bias must be True, False or 'qv' .*got 1$"),
        (lambda: MultiHeadAttention(8, 2, layer_norm_eps=0.0), ValueError, "layer_norm_eps must be a positive"),
        (lambda: MultiHeadAttention(8, 2, layer_norm_eps=1e-50), ValueError, "layer_norm_eps 1e-50 is outside float32"),
        (lambda: MultiHeadAttention(ViTConfig()), TypeError, "missing 1 required positional argument: 'heads'"),
        (lambda: FeedForwardBlock(0, 16), ValueError, "dim must be a positive int, got 0"),
        (lambda: FeedForwardBlock(8, False), TypeError, "mlp_dim must be an int, got False of type bool"),
        (lambda: FeedForwardBlock(8, 16, act="relu"), ValueError, "unknown act 'relu'; expected one of 'gelu', "),
        (lambda: FeedForwardBlock(8, 16, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        (lambda: PatchEmbedding(18, 4, 3, 8), ValueError, "image height 18 is not divisible by patch height 4"),
        (lambda: PatchEmbedding((16, 18), 4, 3, 8), ValueError, "image width 18 is not divisible by patch width 4"),
        (lambda: PatchEmbedding(16, (4, 4, 4), 3, 8), ValueError, r"patch_size must be an int or an \(h, w\) pair"),
        (lambda: PatchEmbedding(16, 4, 0, 8), ValueError, "in_channels must be a positive int, got 0"),
        (lambda: PatchEmbedding(16, 4, 3, 8.0), TypeError, "dim must be an int, got 8.0"),
        (lambda: PatchEmbedding(16, 4, 3, 8, patchify="unfold"), ValueError, "unknown patchify 'unfold'"),
        (lambda: PatchEmbedding(16, 4, 3, 8, bias=0), TypeError, "bias must be a bool, got 0"),
        (lambda: PatchEmbedding(16, 4, 3, 8, register_tokens=-1), ValueError, "register_tokens must be >= 0, got -1"),
        (
            lambda: PatchEmbedding(16, 4, 3, 8, class_token=False, distill_token=True),
            ValueError,
            "distill_token needs the class token",
        ),
        (lambda: PatchEmbedding(16, 4, 3, 8, dropout=-1.0), ValueError, r"dropout must be in \[0, 1\), got -1.0"),
        (lambda: PatchEmbedding(16, 4, 3, 8, dynamic_size="torch"), ValueError, "unknown dynamic_size 'torch'"),
        (lambda: PatchEmbedding(16, 4, 3, 8, layer_norm_eps=-1), ValueError, "layer_norm_eps must be a positive"),
    ],
)
def test_bad_layer_arguments(build, error, message):
    """A layer built alone checks its own arguments, each error naming the argument and the value given."""
    with pytest.raises(error, match=message):
        build()


@pytest.mark.parametrize("layer", [MultiHeadAttention, FeedForwardBlock, PatchEmbedding])
def test_from_config_takes_a_config(layer):
    with pytest.raises(TypeError, match=rf"{layer.__name__}.from_config takes a ViTConfig.*got int"):
        layer.from_config(8)


@pytest.mark.parametrize(
    "mask, error, message",
    [
        (torch.ones(5, 5), TypeError, "mask must be a bool tensor .*, got torch.float32"),
        (torch.ones(5, 5, dtype=torch.int64), TypeError, "got torch.int64"),
        ([[True]], TypeError, "got list"),
        (
            torch.ones(4, 4, dtype=torch.bool),
            ValueError,
            r"mask of shape \(4, 4\) does not broadcast to \(b, h, n, n\) = \(2, 2, 5, 5\)",
        ),
        (torch.ones(3, 1, 5, 5, dtype=torch.bool), ValueError, r"mask of shape \(3, 1, 5, 5\) does not broadcast"),
        (torch.ones(1, 2, 1, 5, 5, dtype=torch.bool), ValueError, "does not broadcast"),
        (torch.ones(5, 5, dtype=torch.bool).triu(1), ValueError, "leaves at least one query row with no key"),
    ],
)
def test_bad_mask(mask, error, message):
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(error, match=message):
        mha(torch.randn(2, 5, 8), mask=mask)
