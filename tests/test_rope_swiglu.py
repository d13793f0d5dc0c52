"""EVA-02's layers against independent implementations: 2-D RoPE (vit_einops.network.rope) and its use in
MultiHeadAttention on every impl, the q and v biases with k's fixed at zero, and the SwiGLU MLP.

Tolerances: float64 comparisons are F64_TOL except RoPE's, 1e-6: the frequencies are a float32 buffer (as timm's), so
an angle of position t carries float32's rounding of omega, t * 6e-8, against the float64 reference's exact omega.
Between the attention impls in float32: 1e-5 (rtol and atol) on values and gradients, as the brief for EVA-02 sets.
"""

from __future__ import annotations

import functools

import math

import pytest
import torch
import torch.nn.functional as F
from _equiv import F64_TOL, assert_close, forward_backward
from hypothesis import given
from hypothesis import strategies as st

from vit_einops import ATTN_IMPLS, MultiHeadAttention, ViTConfig
from vit_einops.network.blocks import SwiGLU, TransformerEncoder
from vit_einops.inspect import AttentionRecorder
from vit_einops.reference import torch_mha_from
from vit_einops.network.rope import RotaryEmbedding, apply_rope

ROPE_TOL = dict(rtol=0, atol=1e-6)
IMPL_TOL = dict(rtol=1e-5, atol=1e-5)


def reference_rope(x: torch.Tensor, grid, ref_grid, prefix: int, temperature: float = 10000.0) -> torch.Tensor:
    """RoPE written with complex numbers in float64, token by token: channel pair m of patch (i, j) is the complex
    number x[2m] + i x[2m+1], multiplied by e^{i theta}; theta = y omega_m for the first d/4 pairs, x omega_{m - d/4}
    for the rest, y = i / gh * ref_h, x = j / gw * ref_w, omega_m = temperature^(-m / (d/4))."""
    (gh, gw), (rh, rw) = grid, ref_grid
    d = x.shape[-1]
    quarter = d // 4
    omega = [temperature ** (-m / quarter) for m in range(quarter)]
    out = x.clone().to(torch.float64)
    pairs = torch.view_as_complex(out[..., prefix:, :].reshape(*x.shape[:-2], gh * gw, d // 2, 2).contiguous())
    for i in range(gh):
        for j in range(gw):
            angles = [i / gh * rh * w for w in omega] + [j / gw * rw * w for w in omega]
            turn = torch.polar(torch.ones(d // 2, dtype=torch.float64), torch.tensor(angles, dtype=torch.float64))
            pairs[..., i * gw + j, :] *= turn
    out[..., prefix:, :] = torch.view_as_real(pairs).flatten(-2)
    return out


@st.composite
def rope_cases(draw):
    return dict(
        head_dim=4 * draw(st.integers(1, 6)),
        grid=(draw(st.integers(1, 6)), draw(st.integers(1, 6))),
        ref_grid=(draw(st.integers(1, 6)), draw(st.integers(1, 6))),
        prefix=draw(st.integers(0, 3)),
        temperature=draw(st.sampled_from([10000.0, 100.0])),
    )


@given(rope_cases())
def test_rope_equals_complex_rotation_of_each_pair(case):
    """Every grid, reference grid, head size and prefix: the same as rotating each channel pair as a complex number
    (1e-6, float64)."""
    rope = RotaryEmbedding(case["head_dim"], case["ref_grid"], case["temperature"])
    table = rope(case["grid"], case["prefix"], dtype=torch.float64)
    n = case["prefix"] + math.prod(case["grid"])
    x = torch.randn(2, 3, n, case["head_dim"], dtype=torch.float64)
    expected = reference_rope(x, case["grid"], case["ref_grid"], case["prefix"], case["temperature"])
    assert_close(apply_rope(x, table), expected, ROPE_TOL, "RoPE")


def test_eva02_table_at_16x16_and_other_grids():
    """EVA-02's head size 64 at its reference grid 16 x 16 and at 24 x 24 and 16 x 20 (1e-6, float64), and the table
    is computed, not saved: nothing in the state dict."""
    rope = functools.partial(RotaryEmbedding(64, 16), dtype=torch.float64)
    assert not isinstance(RotaryEmbedding(64, 16), torch.nn.Module) and rope((2, 2), 0).cos.dtype == torch.float64
    for grid in ((16, 16), (24, 24), (16, 20)):
        x = torch.randn(1, 2, 1 + math.prod(grid), 64, dtype=torch.float64)
        assert_close(apply_rope(x, rope(grid, 1)), reference_rope(x, grid, (16, 16), 1), ROPE_TOL, f"grid {grid}")


def test_rotation_keeps_each_pair_length_and_leaves_prefix_tokens_untouched():
    table = RotaryEmbedding(16, (3, 4))((3, 4), prefix_tokens=2)
    x = torch.randn(2, 3, 14, 16)
    y = apply_rope(x, table)
    assert torch.equal(y[..., :2, :], x[..., :2, :])  # class and register tokens: bit for bit
    pair_length = lambda t: t.unflatten(-1, (8, 2)).norm(dim=-1)  # noqa: E731
    assert_close(pair_length(y), pair_length(x), dict(rtol=1e-6, atol=1e-6), "pair lengths")
    assert not torch.allclose(y[..., 3:, :], x[..., 3:, :], atol=1e-2)  # patches past the first do turn


def test_scores_depend_only_on_relative_position():
    """One q and one k vector at every position of a row of patches (1-D): after RoPE, q_i . k_j depends only on
    j - i; and on a 2-D grid only on the offset (dy, dx)."""
    d = 16
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    rope = functools.partial(RotaryEmbedding(d, (1, 9)), dtype=torch.float64)
    table = rope((1, 9), 0)
    scores = apply_rope(q.expand(9, d), table) @ apply_rope(k.expand(9, d), table).T
    for offset in range(-8, 9):
        diagonal = torch.diagonal(scores, offset)
        assert_close(diagonal, diagonal[:1].expand_as(diagonal), F64_TOL, f"offset {offset}")
    assert scores[0].unique().numel() == 9  # and it does depend on it
    rope = functools.partial(RotaryEmbedding(d, (3, 4)), dtype=torch.float64)
    table = rope((3, 4), 0)
    grid_scores = (apply_rope(q.expand(12, d), table) @ apply_rope(k.expand(12, d), table).T).reshape(3, 4, 3, 4)
    assert_close(grid_scores[1:, 1:, 1:, 1:], grid_scores[:-1, :-1, :-1, :-1], F64_TOL, "2-D shift")


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda: RotaryEmbedding(6, 16), ValueError, "head_dim 6 is not a multiple of 4"),
        (lambda: RotaryEmbedding(64, (16, 0)), ValueError, r"ref_grid\[1\] must be a positive int, got 0"),
        (lambda: RotaryEmbedding(64, 16, temperature=0), ValueError, "temperature must be a positive finite float"),
        (lambda: RotaryEmbedding(64, 16)((4, 4), -1), ValueError, "prefix_tokens must be >= 0, got -1"),
        (lambda: RotaryEmbedding(64, 16)((4, 4, 4), 1), ValueError, r"grid must be an int or an \(h, w\) pair"),
        (
            lambda: apply_rope(torch.zeros(1, 1, 17, 64), RotaryEmbedding(64, 16)((4, 5), 1)),
            ValueError,
            "a RoPE table of 1 prefix tokens, 20 patch tokens and head size 64 does not fit q, k of 17 tokens",
        ),
        (
            lambda: MultiHeadAttention(64, 2)(torch.zeros(1, 17, 64), rope=RotaryEmbedding(64, 16)((4, 4), 1)),
            ValueError,
            "head size 64 does not fit q, k of 17 tokens and head size 32",
        ),
    ],
)
def test_rope_errors_name_the_value(build, error, message):
    with pytest.raises(error, match=message):
        build()


def rope_attention(mha: MultiHeadAttention, x: torch.Tensor, grid, ref_grid, prefix: int) -> torch.Tensor:
    """EVA's attention in plain torch: F.linear with the bias [q_bias; 0; v_bias] (or qkv's), reshape, qk-norm,
    complex RoPE on the patch tokens of q and k only, softmax(q k^T / sqrt(d)) v, proj."""
    b, n, dim = x.shape
    d = dim // mha.heads
    bias = torch.cat((mha.q_bias, torch.zeros_like(mha.q_bias), mha.v_bias)) if hasattr(mha, "q_bias") else mha.qkv.bias
    q, k, v = F.linear(x, mha.qkv.weight, bias).reshape(b, n, 3, mha.heads, d).permute(2, 0, 3, 1, 4)
    if hasattr(mha, "q_norm"):
        q = F.layer_norm(q, (d,), mha.q_norm.weight, mha.q_norm.bias, mha.q_norm.eps)
        k = F.layer_norm(k, (d,), mha.k_norm.weight, mha.k_norm.bias, mha.k_norm.eps)
    q, k = reference_rope(q, grid, ref_grid, prefix), reference_rope(k, grid, ref_grid, prefix)
    heads = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v
    return F.linear(heads.transpose(1, 2).reshape(b, n, dim), mha.proj.weight, mha.proj.bias)


def perturbed_attention(dim: int, heads: int, **options) -> MultiHeadAttention:
    """A float64 layer with noise on every parameter (the zero-initialised q and v biases included)."""
    mha = MultiHeadAttention(dim, heads, **options).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(torch.randn_like(p), alpha=0.5)
    return mha


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_with_rope_equals_plain_torch(impl, qk_norm):
    """RoPE turns q and k (after qk-norm), not v, and only the patch tokens: every impl equals the plain-torch EVA
    attention, at the reference grid and at a non-square other one (1e-6, float64)."""
    mha = perturbed_attention(32, 2, qkv_bias="qv", qk_norm=qk_norm, impl=impl)
    rope = functools.partial(RotaryEmbedding(16, (3, 3)), dtype=torch.float64)
    for grid in ((3, 3), (2, 5)):
        x = torch.randn(2, 1 + math.prod(grid), 32, dtype=torch.float64)
        assert_close(mha(x, rope=rope(grid, 1)), rope_attention(mha, x, grid, (3, 3), 1), ROPE_TOL, f"{impl} {grid}")


def test_impls_agree_with_rope_in_values_and_gradients_float32():
    """einsum, chunked (in blocks of a few queries) and sdpa: the same outputs and gradients with RoPE, in float32."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4, qkv_bias="qv")
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    mha.attend.chunk_elements = 4 * 37 * 5  # blocks of 5 queries: the chunked path really chunks
    table = RotaryEmbedding(16, (4, 4))((4, 9), 1)
    x, upstream = torch.randn(2, 37, 64), torch.randn(2, 37, 64)
    params = list(mha.parameters())
    results = {}
    for impl in ATTN_IMPLS:
        mha.impl = impl
        results[impl] = forward_backward(lambda t: mha(t, rope=table), x, params, upstream)
    out0, grads0 = results["einsum"]
    for impl, (out, grads) in results.items():
        assert_close(out, out0, IMPL_TOL, f"{impl} output")
        for g, g0 in zip(grads, grads0, strict=True):
            assert_close(g, g0, IMPL_TOL, f"{impl} gradient")


def test_qv_bias_keeps_k_bias_zero_through_training():
    """qkv_bias="qv": q_bias and v_bias are parameters and get gradients; k has no bias at all (no parameter, no
    buffer, nothing saved), so training cannot give it one. With RoPE a k bias would matter (rotated by position it
    no longer cancels in the softmax), so its absence is a real constraint."""
    mha = MultiHeadAttention(32, 2, qkv_bias="qv")
    assert mha.qkv.bias is None
    keys = ["q_bias", "v_bias", "qkv.weight", "proj.weight", "proj.bias"]  # timm's EvaAttention's, in its order
    assert [name for name, _ in mha.named_parameters()] == list(mha.state_dict()) == keys
    assert list(mha.named_buffers()) == []
    table = RotaryEmbedding(16, 4)((4, 4), 1)
    optimiser = torch.optim.SGD(mha.parameters(), lr=0.5)
    before = {name: p.detach().clone() for name, p in mha.named_parameters()}
    mha(torch.randn(2, 17, 32), rope=table).square().sum().backward()
    assert mha.q_bias.grad.abs().max() > 0 and mha.v_bias.grad.abs().max() > 0
    optimiser.step()
    assert not torch.equal(mha.q_bias, before["q_bias"]) and not torch.equal(mha.v_bias, before["v_bias"])


def test_qv_bias_equals_torch_multihead_attention_with_a_zero_k_bias():
    """Without RoPE, nn.MultiheadAttention with in_proj_bias [q_bias; 0; v_bias] (the reference builder models "qv")
    is the same map, in values and gradients (F64_TOL)."""
    mha = perturbed_attention(24, 3, qkv_bias="qv")
    ref = torch_mha_from(mha)
    assert torch.equal(ref.in_proj_bias[24:48], torch.zeros(24, dtype=torch.float64))
    x, upstream = torch.randn(2, 6, 24, dtype=torch.float64), torch.randn(2, 6, 24, dtype=torch.float64)
    out, (gx, *_) = forward_backward(mha, x, list(mha.parameters()), upstream)
    ref_out, (ref_gx, *_) = forward_backward(
        lambda t: ref(t, t, t, need_weights=False)[0], x, list(ref.parameters()), upstream
    )
    assert_close(out, ref_out, F64_TOL, "output")
    assert_close(gx, ref_gx, F64_TOL, "input gradient")


def test_encoder_passes_rope_to_every_block_and_recorders_see_rotated_q_k():
    """TransformerEncoder(x, rope=...) equals the blocks written out with the plain-torch RoPE attention, and
    AttentionRecorder's maps on every impl are softmax(q k^T / sqrt(d)) of the rotated q and k (1e-6, float64)."""
    config = ViTConfig(image_size=12, patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48, layer_scale=0.5)
    encoder = TransformerEncoder(config).double().eval()
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(torch.randn_like(p), alpha=0.3)
    rope = functools.partial(RotaryEmbedding(16, (3, 3)), dtype=torch.float64)
    grid = (2, 4)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    expected, maps = x, []
    for block in encoder:
        attn, mlp = block.attn, block.mlp
        h = F.layer_norm(expected, (32,), attn.norm.weight, attn.norm.bias, attn.norm.eps)
        mha = attn.mha
        q, k = F.linear(h, mha.qkv.weight, mha.qkv.bias).reshape(2, 9, 3, 2, 16).permute(2, 0, 3, 1, 4)[:2]
        q, k = reference_rope(q, grid, (3, 3), 1), reference_rope(k, grid, (3, 3), 1)
        maps.append(torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1))
        expected = expected + attn.ls.gamma * rope_attention(mha, h, grid, (3, 3), 1)
        expected = expected + mlp.ls(mlp.ff(mlp.norm(expected)))
    table = rope(grid, 1)
    for impl in ATTN_IMPLS:
        encoder[0].attn.mha.impl = encoder[1].attn.mha.impl = impl
        with AttentionRecorder(encoder) as recorder:
            out = encoder(x, rope=table)
        assert_close(out, expected, ROPE_TOL, f"{impl} encoder output")
        assert_close(recorder.maps, torch.stack(maps), ROPE_TOL, f"{impl} recorded attention")
    assert not torch.allclose(encoder(x), expected, atol=1e-3)  # without the table, another result


def test_swiglu_equals_the_formula_written_out():
    """SwiGLU(x) = (SiLU(x W_g) * x W_x) W_2, with W_g the first mlp_dim rows of fc1 and SiLU(t) = t sigmoid(t),
    written with matmuls (F64_TOL); timm's hidden width for EVA-02 tiny is int(192 * 4 * 2/3) = 512."""
    mlp = SwiGLU(12, 20).double()
    with torch.no_grad():
        for p in mlp.parameters():
            p.add_(torch.randn_like(p))
    w_g, w_x = mlp.fc1.weight[:20], mlp.fc1.weight[20:]
    b_g, b_x = mlp.fc1.bias[:20], mlp.fc1.bias[20:]
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    gate = x @ w_g.T + b_g
    expected = (gate * torch.sigmoid(gate) * (x @ w_x.T + b_x)) @ mlp.fc2.weight.T + mlp.fc2.bias
    assert_close(mlp(x), expected, F64_TOL, "SwiGLU")
    shapes = [tuple(p.shape) for p in SwiGLU(192, int(192 * 4 * 2 / 3)).parameters()]
    assert shapes == [(1024, 192), (1024,), (192, 512), (192,)]  # timm's mlp.fc1 and mlp.fc2 of eva02_tiny


def test_swiglu_dropout_acts_only_in_training_and_from_config_reads_the_fields():
    config = ViTConfig(dim=24, heads=3, mlp_dim=40, dropout=0.25)
    mlp = SwiGLU.from_config(config)
    assert repr(mlp) == repr(SwiGLU(24, 40, dropout=0.25))
    assert (mlp.fc1.out_features, mlp.fc2.in_features, mlp.drop1.p, mlp.drop2.p) == (80, 40, 0.25, 0.25)
    x = torch.randn(2, 5, 24)
    assert torch.equal(mlp.eval()(x), mlp(x))
    assert not torch.equal(mlp.train()(x), mlp.eval()(x))
    with pytest.raises(ValueError, match="mlp_dim must be a positive int, got 0"):
        SwiGLU(24, 0)
