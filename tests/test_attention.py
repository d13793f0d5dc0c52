"""MultiHeadAttention against torch.nn.MultiheadAttention and between its own impls (Eq. 5-8)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from _equiv import F32_TOL, F64_TOL, assert_close, forward_backward
from hypothesis import given
from hypothesis import strategies as st

from vit_einops import ATTN_IMPLS, MultiHeadAttention, ViT, ViTConfig, set_attn_impl
from vit_einops.reference import torch_mha_from

MASK_SHAPES = {
    None: None,
    "n n": lambda b, h, n: (n, n),
    "b 1 n n": lambda b, h, n: (b, 1, n, n),
    "1 h n n": lambda b, h, n: (1, h, n, n),
    "b h n n": lambda b, h, n: (b, h, n, n),
}


def random_mask(shape, n, generator) -> torch.Tensor:
    """A random boolean mask in which every query may at least attend to itself (no empty row)."""
    mask = torch.rand(shape, generator=generator) < 0.5
    return mask | torch.eye(n, dtype=torch.bool)


@st.composite
def attention_cases(draw):
    return dict(
        b=draw(st.integers(1, 3)),
        n=draw(st.integers(1, 12)),
        heads=draw(st.integers(1, 4)),
        head_dim=draw(st.integers(1, 8)),
        mask=draw(st.sampled_from(list(MASK_SHAPES))),
        seed=draw(st.integers(0, 2**16)),
    )


def build_case(case, dtype):
    g = torch.Generator().manual_seed(case["seed"])
    b, n, h = case["b"], case["n"], case["heads"]
    dim = h * case["head_dim"]
    torch.manual_seed(case["seed"])
    mha = MultiHeadAttention(ViTConfig(dim=dim, heads=h)).to(dtype)
    # Non-zero biases, so a wrongly laid-out bias would show.
    with torch.no_grad():
        for p in (mha.qkv.bias, mha.proj.bias):
            p.normal_(generator=g)
    x = torch.randn(b, n, dim, generator=g, dtype=dtype)
    upstream = torch.randn(b, n, dim, generator=g, dtype=dtype)
    mask = None if case["mask"] is None else random_mask(MASK_SHAPES[case["mask"]](b, h, n), n, g)
    return mha, x, upstream, mask


def torch_reference(mha, x, upstream, mask):
    ref = torch_mha_from(mha)
    b, n, _ = x.shape
    # nn.MultiheadAttention's bool mask means the opposite (True = may NOT attend) and wants (n, n) or (b*h, n, n).
    torch_mask = None if mask is None else ~mask.expand(b, mha.heads, n, n).reshape(b * mha.heads, n, n)
    params = [ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias]
    return forward_backward(lambda t: ref(t, t, t, attn_mask=torch_mask, need_weights=False)[0], x, params, upstream)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@given(case=attention_cases())
def test_matches_torch_multihead_attention_float64(impl, case):
    mha, x, upstream, mask = build_case(case, torch.float64)
    mha.impl = impl
    params = [mha.qkv.weight, mha.qkv.bias, mha.proj.weight, mha.proj.bias]
    out, grads = forward_backward(lambda t: mha(t, mask=mask), x, params, upstream)
    ref_out, ref_grads = torch_reference(mha, x, upstream, mask)
    assert_close(out, ref_out, F64_TOL, "output")
    for name, g, rg in zip(["x", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias"], grads, ref_grads):
        assert_close(g, rg, F64_TOL, f"grad {name}")


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("masked", [False, True])
def test_matches_torch_multihead_attention_float32_vit_b_shape(impl, masked):
    """One ViT-B-sized layer (D 768, 12 heads, 197 tokens) in float32, where the kernels differ most."""
    case = dict(b=2, n=197, heads=12, head_dim=64, mask="b h n n" if masked else None, seed=1)
    mha, x, upstream, mask = build_case(case, torch.float32)
    mha.impl = impl
    params = [mha.qkv.weight, mha.proj.weight]
    out, grads = forward_backward(lambda t: mha(t, mask=mask), x, params, upstream)
    ref_out, ref_grads = torch_reference(mha, x, upstream, mask)
    assert_close(out, ref_out, F32_TOL, "output")
    assert_close(grads[0], ref_grads[0], F32_TOL, "grad x")
    assert_close(grads[1], ref_grads[1], F32_TOL, "grad qkv.weight")


@given(case=attention_cases())
def test_impls_agree_with_each_other(case):
    mha, x, upstream, mask = build_case(case, torch.float64)
    params = list(mha.parameters())
    results = {}
    for impl in ATTN_IMPLS:
        mha.impl = impl
        results[impl] = forward_backward(lambda t: mha(t, mask=mask), x, params, upstream)
    out0, grads0 = results["einsum"]
    for impl, (out, grads) in results.items():
        assert_close(out, out0, F64_TOL, f"{impl} output vs einsum")
        for g, g0 in zip(grads, grads0):
            assert_close(g, g0, F64_TOL, f"{impl} gradient vs einsum")


def test_equation_6_scale_is_inside_the_softmax_and_uses_head_size():
    """A = softmax(q k^T / sqrt(D_h)): rows sum to 1, and the scale is D_h's, written here with plain matmuls."""
    torch.manual_seed(0)
    dim, heads, n = 64, 4, 9
    mha = MultiHeadAttention(ViTConfig(dim=dim, heads=heads)).double()
    x = torch.randn(2, n, dim, dtype=torch.float64)
    seen = []
    mha.attend.softmax.register_forward_hook(lambda m, i, o: seen.append(o))
    mha(x)
    (attn,) = seen
    q, k, _ = mha.qkv(x).reshape(2, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dim // heads), dim=-1)
    torch.testing.assert_close(attn, expected, **F64_TOL)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, heads, n, dtype=torch.float64), **F64_TOL)
    # The tutorial's form, softmax(q k^T) / sqrt(D), is a different matrix whose rows do not sum to 1.
    tutorial = torch.softmax(q @ k.transpose(-1, -2), dim=-1) / math.sqrt(dim)
    assert not torch.allclose(tutorial, attn, atol=1e-3)
    assert not torch.allclose(tutorial.sum(-1), torch.ones(2, heads, n, dtype=torch.float64), atol=1e-3)


@given(case=attention_cases())
def test_attention_rows_sum_to_one_and_respect_the_mask(case):
    mha, x, _, mask = build_case(case, torch.float64)
    seen = []
    mha.attend.softmax.register_forward_hook(lambda m, i, o: seen.append(o))
    mha(x, mask=mask)
    (attn,) = seen
    b, n, h = case["b"], case["n"], case["heads"]
    torch.testing.assert_close(attn.sum(-1), torch.ones(b, h, n, dtype=torch.float64), **F64_TOL)
    if mask is not None:
        assert (attn.masked_select(~mask.expand(b, h, n, n)) == 0).all()


def test_attention_dropout_acts_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(ViTConfig(dim=32, heads=4, attn_dropout=0.5))
    x = torch.randn(2, 10, 32)
    plain = MultiHeadAttention(ViTConfig(dim=32, heads=4))
    plain.load_state_dict(mha.state_dict())
    for impl in ATTN_IMPLS:
        mha.impl = plain.impl = impl
        mha.eval()
        torch.testing.assert_close(mha(x), plain(x))
        mha.train()
        assert not torch.allclose(mha(x), plain(x), atol=1e-3), impl


def test_output_dropout_after_proj():
    torch.manual_seed(0)
    mha = MultiHeadAttention(ViTConfig(dim=32, heads=4, dropout=0.5)).train()
    out = mha(torch.randn(4, 10, 32))
    # Dropout after proj zeroes whole output entries; nothing else in the layer produces exact zeros.
    assert 0.3 < (out == 0).float().mean().item() < 0.7


def test_impl_is_a_plain_attribute_and_the_model_helper_sets_every_layer():
    model = ViT(image_size=16, patch_size=4, dim=32, depth=3, heads=4, mlp_dim=64, num_classes=5)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 3 and all(m.impl == "einsum" for m in layers)
    layers[1].impl = "sdpa"
    assert [m.impl for m in layers] == ["einsum", "sdpa", "einsum"]
    for impl in ATTN_IMPLS:
        assert model.set_attn_impl(impl) is model
        assert all(m.impl == impl for m in layers) and model.attn_impl == impl
    set_attn_impl(model, "einsum")
    assert all(m.impl == "einsum" for m in layers)


def test_sdpa_path_calls_torch_sdpa(monkeypatch):
    """The "sdpa" impl really goes through torch's fused function (not silently through einsum)."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    mha = MultiHeadAttention(ViTConfig(dim=16, heads=2))
    mha.impl = "sdpa"
    mha(torch.randn(3, 5, 16))
    assert calls == [torch.Size([3, 2, 5, 8])]


# --- a forward hook on attend.softmax -----------------------------------------------------------------------


def hooked_model(impl: str):
    """A 2-layer ViT with a forward hook on each layer's attend.softmax that records what it sees."""
    model = ViT(image_size=8, patch_size=4, dim=16, depth=2, heads=2, mlp_dim=32, num_classes=3, attn_impl=impl)
    seen = []
    for block in model.blocks:
        block.attn.fn.mha.attend.softmax.register_forward_hook(lambda m, args, out: seen.append(out))
    return model, seen


def test_softmax_hook_sees_a_on_the_einsum_path_without_warning(recwarn):
    from vit_einops.inspect import record_attention

    model, seen = hooked_model("einsum")
    x = torch.randn(3, 3, 8, 8)
    _, maps = record_attention(model, x)
    assert len(seen) == 2 and all(a.shape == (3, 2, 5, 5) for a in seen)
    torch.testing.assert_close(torch.stack(seen), maps, rtol=0, atol=0)
    assert not [w for w in recwarn if "attend.softmax" in str(w.message)]


@pytest.mark.parametrize("impl", ["sdpa", "chunked"])
def test_softmax_hook_on_a_path_that_skips_it_warns_once_per_layer(impl):
    model, seen = hooked_model(impl)
    x = torch.randn(3, 3, 8, 8)
    with pytest.warns(UserWarning) as record:
        model(x)
    messages = [str(w.message) for w in record if "attend.softmax" in str(w.message)]
    assert len(messages) == 2  # one per hooked layer
    assert f"attention impl {impl!r} never calls that module, so the hook does not fire" in messages[0]
    assert "vit_einops.inspect.AttentionRecorder" in messages[0] and "model.set_attn_impl('einsum')" in messages[0]
    assert seen == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x)  # already said: no second warning


@pytest.mark.parametrize("impl", ["sdpa", "chunked"])
def test_no_warning_without_a_softmax_hook(impl):
    model = ViT(image_size=8, patch_size=4, dim=16, depth=2, heads=2, mlp_dim=32, num_classes=3, attn_impl=impl)
    model.blocks[0].attn.fn.mha.attend.register_forward_hook(lambda *a: None)  # AttentionRecorder's kind of hook
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(1, 3, 8, 8))
