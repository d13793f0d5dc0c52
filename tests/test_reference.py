"""The reference builders model each option with torch's own modules or refuse it by name: what they model equals
the model (values and gradients, float64 to F64_TOL), what they refuse is a ValueError naming the option and its
value, and every ViTConfig field is one or the other."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from _equiv import F64_TOL, assert_close, forward_backward
from _tiny import TINY_RGB16

from vit_einops import TransformerEncoderBlock, ViT, ViTConfig, create_vit
from vit_einops.network.config import DEFAULTS
from vit_einops.presets import TIMM_ARCHS
from vit_einops.reference import MODELS, REFUSES, torch_encoder_layer_from, torch_mha_from, torch_reference_vit

BUILDERS = ("torch_mha_from", "torch_encoder_layer_from", "torch_reference_vit")
BLOCK = dict(dim=12, heads=3, mlp_dim=20)


def perturbed_block(seed: int = 0, **options) -> TransformerEncoderBlock:
    """A float64 block with noise on every parameter: LayerNorms off (1, 0), LayerScale's gamma off its init,
    biases off 0, so a missing or misplaced tensor shows."""
    torch.manual_seed(seed)
    block = TransformerEncoderBlock(ViTConfig(**BLOCK, **options)).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return block


def builder_input(builder: str, model: ViT):
    """What ``builder`` takes, from ``model``: its first attention layer, its first block, or itself."""
    return {
        "torch_mha_from": model.blocks[0].attn.mha,
        "torch_encoder_layer_from": model.blocks[0],
        "torch_reference_vit": model,
    }[builder]


def test_every_config_field_is_modelled_or_refused():
    """A new ViTConfig field fails here until someone decides what the reference does with it."""
    names = [f.name for f in fields(ViTConfig)]
    whole = "torch_reference_vit"
    assert [n for n in names if (n in MODELS[whole]) == (n in REFUSES[whole])] == []
    for builder in BUILDERS:
        assert set(MODELS[builder]) | set(REFUSES[builder]) <= set(names), builder
        assert not set(MODELS[builder]) & set(REFUSES[builder]), builder


@pytest.mark.parametrize(
    "builder, options, message",
    [
        ("torch_mha_from", dict(qk_norm=True),
         "torch_mha_from cannot model qk_norm=True: nn.MultiheadAttention has no LayerNorm on each head's q and k"),
        ("torch_mha_from", dict(dropout=0.1),
         "torch_mha_from cannot model dropout=0.1: nn.MultiheadAttention has no dropout after its output projection"),
        ("torch_encoder_layer_from", dict(qk_norm=True),
         "torch_encoder_layer_from cannot model qk_norm=True: nn.MultiheadAttention has no LayerNorm on each head's "
         "q and k"),
        ("torch_reference_vit", dict(qk_norm=True),
         "torch_reference_vit cannot model qk_norm=True: nn.MultiheadAttention has no LayerNorm on each head's q "
         "and k"),
    ],
)  # fmt: skip
def test_refused_options_name_the_option_and_its_value(builder, options, message):
    model = ViT(**TINY_RGB16, **options)
    build = {"torch_mha_from": torch_mha_from, "torch_encoder_layer_from": torch_encoder_layer_from}.get(
        builder, torch_reference_vit
    )
    with pytest.raises(ValueError) as err:
        build(builder_input(builder, model))
    assert str(err.value) == message


def test_an_option_no_reference_decided_for_is_refused_by_name(monkeypatch):
    """The allow-list: a field neither modelled nor refused (here LayerScale, taken out of the table) is refused at
    any value but its default, as a new ViTConfig field would be."""
    monkeypatch.delitem(MODELS["torch_reference_vit"], "layer_scale")
    torch_reference_vit(ViT(**TINY_RGB16))  # at its default, the field is no option
    with pytest.raises(ValueError) as err:
        torch_reference_vit(ViT(**TINY_RGB16, layer_scale=0.5))
    assert str(err.value) == (
        "torch_reference_vit cannot model layer_scale=0.5: no reference models it yet (vit_einops.reference.MODELS)"
    )


def test_a_submodule_the_reference_does_not_know_is_refused_by_its_path():
    """A new option that adds a module (RoPE, say) to a layer is refused by the layer builders until modelled."""
    block = TransformerEncoderBlock(ViTConfig(**BLOCK))
    block.attn.mha.add_module("rope", torch.nn.Identity())
    with pytest.raises(ValueError) as err:
        torch_mha_from(block.attn.mha)
    assert str(err.value) == (
        "torch_mha_from cannot model MultiHeadAttention's rope (Identity): it is no option the reference knows "
        "(vit_einops.reference.MODELS)"
    )
    with pytest.raises(ValueError) as err:
        torch_encoder_layer_from(block)
    assert str(err.value).startswith(
        "torch_encoder_layer_from cannot model TransformerEncoderBlock's attn.mha.rope (Identity): "
    )


def test_an_activation_torch_has_not_is_refused():
    block = TransformerEncoderBlock(ViTConfig(**BLOCK))
    block.mlp.ff.act = torch.nn.ReLU()
    with pytest.raises(ValueError) as err:
        torch_encoder_layer_from(block)
    assert str(err.value) == (
        "torch_encoder_layer_from cannot model act='ReLU()': it has no torch activation in TORCH_ACTIVATIONS "
        "(gelu, gelu_tanh, quick_gelu)"
    )


GRAD_NAMES = (
    "x", "qkv.weight", "qkv.bias", "fc1.weight", "norm1.weight", "proj.weight", "fc2.weight", "gamma1", "gamma2"
)


def block_and_reference(block, ref, x, up):
    """Output and gradients (in GRAD_NAMES order) of ``block`` and of its reference ``ref``, the reference's mapped
    to ours: a LayerScale gamma folded into W' = gamma W, b' = gamma b has dL/dW = gamma dL/dW' (row by row) and
    dL/dgamma_i = sum_j dL/dW'_ij W_ij + dL/db'_i b_i."""
    attn, mlp = block.attn, block.mlp
    mha, ff = attn.mha, mlp.ff
    scaled = hasattr(attn, "ls")
    ours = [mha.qkv.weight, mha.qkv.bias, ff.fc1.weight, attn.norm.weight, mha.proj.weight, ff.fc2.weight]
    ours += [attn.ls.gamma, mlp.ls.gamma] if scaled else []
    sa, out_proj = ref.self_attn, ref.self_attn.out_proj
    theirs = [sa.in_proj_weight, sa.in_proj_bias, ref.linear1.weight, ref.norm1.weight, out_proj.weight]
    theirs += [ref.linear2.weight, out_proj.bias, ref.linear2.bias]
    out, grads = forward_backward(block, x, ours, up)
    ref_out, (*ref_grads, g_out_w, g_lin2_w, g_out_b, g_lin2_b) = forward_backward(ref, x, theirs, up)
    if not scaled:
        return (out, list(grads)), (ref_out, [*ref_grads, g_out_w, g_lin2_w])
    folded = [(attn, mha.proj, g_out_w, g_out_b), (mlp, ff.fc2, g_lin2_w, g_lin2_b)]
    weights = [branch.ls.gamma[:, None] * g_w for branch, _, g_w, _ in folded]
    gammas = [(g_w * linear.weight).sum(1) + g_b * linear.bias for _, linear, g_w, g_b in folded]
    return (out, list(grads)), (ref_out, [*ref_grads, *weights, *gammas])


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(act="gelu_tanh"),
        dict(act="quick_gelu"),
        dict(layer_scale=1e-5),
        dict(layer_norm_eps=0.5),
        dict(layer_scale=0.1, act="quick_gelu", layer_norm_eps=1e-5),
    ],
    ids=str,
)
def test_modelled_options_equal_the_block_in_values_and_gradients(options):
    """Each option the encoder-layer reference models, against the block in training mode (dropout 0): the output
    and the gradients of the input, of weights before and after a LayerScale, and of gamma itself."""
    block = perturbed_block(**options).train()
    ref = torch_encoder_layer_from(block).train()
    g = torch.Generator().manual_seed(1)
    x, up = (torch.randn(2, 7, BLOCK["dim"], generator=g, dtype=torch.float64) for _ in range(2))
    (out, grads), (ref_out, ref_grads) = block_and_reference(block, ref, x, up)
    assert_close(out, ref_out, F64_TOL, "output")
    assert len(grads) == len(ref_grads) == (9 if "layer_scale" in options else 7)
    for name, ours, theirs in zip(GRAD_NAMES, grads, ref_grads):
        assert_close(ours, theirs, F64_TOL, f"grad {name}")


def test_attention_dropout_draws_the_same_masks_as_torch():
    """Attention dropout sits on the attention weights in both: with the same seed torch's mask over A (b, h, n, n)
    is the einsum path's, so values and gradients agree in training mode, for the attention layer and the block.
    (The chunked path draws its mask a block of queries at a time, SDPA in its own kernel: other masks.)"""
    block = perturbed_block(attn_dropout=0.4).train()
    mha = block.attn.mha
    g = torch.Generator().manual_seed(2)
    x, up = (torch.randn(2, 7, BLOCK["dim"], generator=g, dtype=torch.float64) for _ in range(2))
    ref_mha, ref_block = torch_mha_from(mha), torch_encoder_layer_from(block).train()
    pairs = [
        (mha, [mha.qkv.weight], lambda t: ref_mha(t, t, t, need_weights=False)[0], [ref_mha.in_proj_weight]),
        (block, [mha.qkv.weight], ref_block, [ref_block.self_attn.in_proj_weight]),
    ]
    for ours, params, theirs, ref_params in pairs:
        torch.manual_seed(3)
        out, grads = forward_backward(ours, x, params, up)
        torch.manual_seed(3)
        ref_out, ref_grads = forward_backward(theirs, x, ref_params, up)
        assert_close(out, ref_out, F64_TOL, "output")
        for name, a, b in zip(["x", "qkv.weight"], grads, ref_grads):
            assert_close(a, b, F64_TOL, f"grad {name}")
    # A different seed draws a different mask: the agreement above is the same dropout, not no dropout.
    torch.manual_seed(4)
    assert (mha(x) - ref_mha(x, x, x, need_weights=False)[0]).abs().max() > 1e-3


def test_dropout_is_torch_layers_dropout_in_each_place():
    """torch's layer draws its masks over the attention output in another memory order than ours, so the masks
    differ: the reference carries each rate where the block has it, and equals it in eval (values and gradients)."""
    block = perturbed_block(dropout=0.2, attn_dropout=0.4)
    ref = torch_encoder_layer_from(block)
    assert (ref.dropout1.p, ref.dropout.p, ref.dropout2.p, ref.self_attn.dropout) == (0.2, 0.2, 0.2, 0.4)
    block.eval(), ref.eval()
    x, up = (torch.randn(2, 7, BLOCK["dim"], dtype=torch.float64) for _ in range(2))
    (out, grads), (ref_out, ref_grads) = block_and_reference(block, ref, x, up)
    assert_close(out, ref_out, F64_TOL, "output")
    assert len(grads) == len(ref_grads) == 7
    for name, ours, theirs in zip(GRAD_NAMES, grads, ref_grads):
        assert_close(ours, theirs, F64_TOL, f"grad {name}")


@pytest.mark.parametrize("name", list(TIMM_ARCHS))
def test_every_timm_family_equals_its_torch_reference_or_is_refused(name):
    """Each family's options (LayerScale, registers, CLIP's pre-norm and quick GELU, SigLIP's attention pool...) at a
    tiny width: torch's encoder layers with the model's patch embedding and head give the same logits. A family with
    an option torch's layers cannot hold (EVA-02's SwiGLU and RoPE) is refused naming the first of them."""
    patch = TIMM_ARCHS[name]["patch_size"]
    torch.manual_seed(0)
    model = create_vit(name, image_size=2 * patch, dim=12, depth=2, heads=3, mlp_dim=20).double()
    refused = [f for f in REFUSES["torch_reference_vit"] if getattr(model.config, f) != DEFAULTS[f]]
    if refused:
        with pytest.raises(ValueError, match=rf"^torch_reference_vit cannot model {refused[0]}="):
            torch_reference_vit(model)
        return
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model.eval()
    ref = torch_reference_vit(model).eval()
    x = torch.randn(2, 3, 2 * patch, 2 * patch, dtype=torch.float64)
    assert_close(model(x), ref(x), F64_TOL, "logits")


def test_a_bias_free_qkv_is_modelled_as_a_zero_in_proj_bias():
    """MultiHeadAttention(qkv_bias=False) built alone: torch's fused projection always has a bias, and a zero one is
    the same map; the output projection's bias is still copied."""
    from vit_einops import MultiHeadAttention

    mha = MultiHeadAttention(16, 2, qkv_bias=False).double()
    with torch.no_grad():
        mha.proj.bias.normal_()
    ref = torch_mha_from(mha)
    assert ref.in_proj_bias.abs().max() == 0
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert_close(mha(x), ref(x, x, x, need_weights=False)[0], F64_TOL, "output")
