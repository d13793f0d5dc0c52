"""MultiHeadAttention against torch.nn.MultiheadAttention and between its own impls (Eq. 5-8)."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

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
    mha = MultiHeadAttention(dim, h).to(dtype)
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


# --- the layer built alone --------------------------------------------------------------------------------------


def torch_built_pair(dim: int, heads: int, dtype: torch.dtype, seed: int):
    """``torch.nn.MultiheadAttention(dim, heads, batch_first=True)`` with random non-zero biases, and our
    ``MultiHeadAttention(dim, heads)`` holding its weights: torch's in_proj is our fused qkv, out_proj our proj."""
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(dim, heads, batch_first=True).to(dtype)
    with torch.no_grad():
        for p in (ref.in_proj_bias, ref.out_proj.bias):
            p.normal_()
    ours = MultiHeadAttention(dim, heads).to(dtype)
    ours.load_state_dict(  # strict: the two layers hold the same four tensors, no more
        {
            "qkv.weight": ref.in_proj_weight,
            "qkv.bias": ref.in_proj_bias,
            "proj.weight": ref.out_proj.weight,
            "proj.bias": ref.out_proj.bias,
        }
    )
    params = [ours.qkv.weight, ours.qkv.bias, ours.proj.weight, ours.proj.bias]
    ref_params = [ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias]
    return ours, params, ref, ref_params


def assert_equals_torch(ours, params, ref, ref_params, x, upstream, mask, tol) -> None:
    """Output and the gradients of x and of the four weights, ours against torch's, within ``tol``."""
    b, n, _ = x.shape
    # nn.MultiheadAttention's bool mask means the opposite (True = may NOT attend) and wants (n, n) or (b*h, n, n).
    torch_mask = None if mask is None else ~mask.expand(b, ours.heads, n, n).reshape(b * ours.heads, n, n)
    out, grads = forward_backward(lambda t: ours(t, mask=mask), x, params, upstream)
    ref_out, ref_grads = forward_backward(
        lambda t: ref(t, t, t, attn_mask=torch_mask, need_weights=False)[0], x, ref_params, upstream
    )
    assert_close(out, ref_out, tol, f"{ours.impl} output")
    for name, g, rg in zip(["x", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias"], grads, ref_grads):
        assert_close(g, rg, tol, f"{ours.impl} grad {name}")


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@given(case=attention_cases())
def test_layer_built_alone_equals_torch_multihead_attention_built_alone(impl, case):
    """Both layers built from (dim, heads) alone, ours holding torch's weights: equal values and gradients in float64
    (F64_TOL) on every impl, masked or not."""
    b, n, heads = case["b"], case["n"], case["heads"]
    dim = heads * case["head_dim"]
    ours, params, ref, ref_params = torch_built_pair(dim, heads, torch.float64, case["seed"])
    ours.impl = impl
    g = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(b, n, dim, generator=g, dtype=torch.float64)
    upstream = torch.randn(b, n, dim, generator=g, dtype=torch.float64)
    mask = None if case["mask"] is None else random_mask(MASK_SHAPES[case["mask"]](b, heads, n), n, g)
    assert_equals_torch(ours, params, ref, ref_params, x, upstream, mask, F64_TOL)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_multi_head_attention_64_4_is_built_as_torch_builds_its_own(impl):
    """``MultiHeadAttention(64, 4)``, as ``nn.MultiheadAttention(64, 4)``: the same weights' shapes, and with torch's
    weights the same outputs and gradients in float32 (F32_TOL), the impl chosen at construction."""
    ours, params, ref, ref_params = torch_built_pair(64, 4, torch.float32, seed=0)
    shapes = [(192, 64), (192,), (64, 64), (64,)]
    assert [tuple(p.shape) for p in params] == [tuple(p.shape) for p in ref_params] == shapes
    ours = MultiHeadAttention(64, 4, impl=impl)
    ours.load_state_dict(dict(zip(["qkv.weight", "qkv.bias", "proj.weight", "proj.bias"], ref_params)))
    assert ours.impl == impl and (ours.dim, ours.heads) == (64, 4)
    params = [ours.qkv.weight, ours.qkv.bias, ours.proj.weight, ours.proj.bias]
    x, upstream = torch.randn(2, 10, 64), torch.randn(2, 10, 64)
    assert_equals_torch(ours, params, ref, ref_params, x, upstream, None, F32_TOL)


def qk_normed_attention(mha: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Eqs. 5-8 with every head's q and k layer-normed over D_h, in plain torch (reshape, F.layer_norm, matmul)."""
    b, n, dim = x.shape
    d = dim // mha.heads
    q, k, v = F.linear(x, mha.qkv.weight, mha.qkv.bias).reshape(b, n, 3, mha.heads, d).permute(2, 0, 3, 1, 4)
    q = F.layer_norm(q, (d,), mha.q_norm.weight, mha.q_norm.bias, mha.q_norm.eps)
    k = F.layer_norm(k, (d,), mha.k_norm.weight, mha.k_norm.bias, mha.k_norm.eps)
    heads = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v  # (b, h, n, d)
    return F.linear(heads.transpose(1, 2).reshape(b, n, dim), mha.proj.weight, mha.proj.bias)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_qk_norm_layer_built_alone_matches_the_one_in_a_model(impl):
    """``MultiHeadAttention(dim, heads, qk_norm=True, layer_norm_eps=...)`` is the layer a qk_norm model holds: the
    same modules and keys, and with the model's weights the same output, both equal to qk-norm written out in plain
    torch (F64_TOL). The eps is 1e-1, not the default, so a layer that dropped it would differ."""
    torch.manual_seed(0)
    model = ViT(image_size=8, patch_size=4, dim=24, depth=1, heads=3, mlp_dim=48, qk_norm=True, layer_norm_eps=0.1)
    inside = model.double().blocks[0].attn.mha
    with torch.no_grad():
        for p in inside.parameters():
            p.copy_(torch.randn_like(p))  # LayerNorms away from (1, 0), non-zero biases
    inside.impl = impl
    alone = MultiHeadAttention(24, 3, qk_norm=True, layer_norm_eps=0.1, impl=impl).double()
    assert repr(alone) == repr(inside)
    alone.load_state_dict(inside.state_dict())
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    expected = qk_normed_attention(alone, x)
    assert_close(alone(x), expected, F64_TOL, "qk_norm layer built alone")
    assert_close(inside(x), expected, F64_TOL, "qk_norm layer inside the model")
    plain = MultiHeadAttention(24, 3).double()
    plain.load_state_dict(inside.state_dict(), strict=False)
    assert not torch.allclose(plain(x), expected, atol=1e-3)  # the norms do change the result


def test_from_config_passes_each_field_to_its_argument():
    """An encoder block's attention is the layer built alone from the config's dim, heads, qk_norm, layer_norm_eps,
    attn_dropout and dropout (after proj): the same modules, widths, epsilons and rates, field by field."""
    config = ViTConfig(dim=24, heads=3, qk_norm=True, layer_norm_eps=0.25, attn_dropout=0.125, dropout=0.375)
    alone = MultiHeadAttention(24, 3, qk_norm=True, layer_norm_eps=0.25, attn_dropout=0.125, proj_dropout=0.375)
    built = MultiHeadAttention.from_config(config)
    assert repr(built) == repr(alone)
    assert (built.attend.dropout.p, built.dropout.p, built.q_norm.eps, built.k_norm.eps) == (0.125, 0.375, 0.25, 0.25)
    assert repr(ViT.from_config(replace(config, image_size=8, patch_size=4)).blocks[0].attn.mha) == repr(alone)


def test_qkv_bias_false_leaves_the_fused_projection_without_bias():
    """``qkv_bias=False`` (timm's default for its own Attention): q, k and v are x U_qkv alone; proj keeps its bias."""
    mha = MultiHeadAttention(8, 2, qkv_bias=False)
    assert mha.qkv.bias is None and mha.proj.bias is not None
    assert list(mha.state_dict()) == ["qkv.weight", "proj.weight", "proj.bias"]
    biased = MultiHeadAttention(8, 2)
    biased.load_state_dict({**mha.state_dict(), "qkv.bias": torch.zeros(24)})
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(mha(x), biased(x), rtol=0, atol=0)


def test_equation_6_scale_is_inside_the_softmax_and_uses_head_size():
    """A = softmax(q k^T / sqrt(D_h)): rows sum to 1, and the scale is D_h's, written here with plain matmuls."""
    torch.manual_seed(0)
    dim, heads, n = 64, 4, 9
    mha = MultiHeadAttention(dim, heads).double()
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
    mha = MultiHeadAttention(32, 4, attn_dropout=0.5)
    x = torch.randn(2, 10, 32)
    plain = MultiHeadAttention(32, 4)
    plain.load_state_dict(mha.state_dict())
    for impl in ATTN_IMPLS:
        mha.impl = plain.impl = impl
        mha.eval()
        torch.testing.assert_close(mha(x), plain(x))
        mha.train()
        assert not torch.allclose(mha(x), plain(x), atol=1e-3), impl


def test_output_dropout_after_proj():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, proj_dropout=0.5).train()
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
    mha = MultiHeadAttention(16, 2)
    mha.impl = "sdpa"
    mha(torch.randn(3, 5, 16))
    assert calls == [torch.Size([3, 2, 5, 8])]


# --- a forward hook on attend.softmax -----------------------------------------------------------------------


def hooked_model(impl: str):
    """A 2-layer ViT with a forward hook on each layer's attend.softmax that records what it sees."""
    model = ViT(image_size=8, patch_size=4, dim=16, depth=2, heads=2, mlp_dim=32, num_classes=3, attn_impl=impl)
    seen = []
    for block in model.blocks:
        block.attn.mha.attend.softmax.register_forward_hook(lambda m, args, out: seen.append(out))
    return model, seen


def test_softmax_hook_sees_a_on_the_einsum_path_without_warning(recwarn):
    from vit_einops.inspect import record_attention

    model, seen = hooked_model("einsum")
    x = torch.randn(3, 3, 8, 8)
    _, maps, _ = record_attention(model, x)
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
    model.blocks[0].attn.mha.attend.register_forward_hook(lambda *a: None)  # AttentionRecorder's kind of hook
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(1, 3, 8, 8))


# --- the kernel registry -------------------------------------------------------------------------------------


def doubled_einsum(attend, q, k, v, mask):
    """A kernel for the registry tests: the einsum kernel's output, doubled, so its use is visible."""
    from vit_einops.network.attention import einsum_attention

    return 2 * einsum_attention(attend, q, k, v, mask)


def test_every_list_of_kernels_is_derived_from_the_registry(capsys):
    """ATTN_IMPLS, the train command's --attn-impl and the bench's rows all read KERNELS."""
    from vit_einops.bench.names import core_paths, layer_paths, model_paths
    from vit_einops.commands.cli import main
    from vit_einops.network.kernels import KERNELS

    assert ATTN_IMPLS == tuple(KERNELS) == ("einsum", "chunked", "sdpa")
    assert core_paths()[: len(KERNELS)] == ATTN_IMPLS and model_paths() == (*ATTN_IMPLS, "torch")
    assert layer_paths() == ("mha_chunked", "mha_sdpa", "torch_mha")  # the kernels that never form A, and torch's
    assert {name: k.forms_attention for name, k in KERNELS.items()} == {"einsum": True, "chunked": False, "sdpa": False}
    with pytest.raises(SystemExit):
        main(["train", "--attn-impl", "flash"])
    assert "invalid choice: 'flash' (choose from 'einsum', 'chunked', 'sdpa')" in capsys.readouterr().err


def test_the_memory_estimate_follows_whether_each_kernel_forms_a():
    """A model whose layers all run kernels that never form A is estimated with one block of A at a time; one
    layer that forms it makes the whole matrix count."""
    from vit_einops import max_memory
    from vit_einops.network.sizes import check_model_forward

    model = ViT(image_size=128, patch_size=2, dim=8, heads=1, mlp_dim=8, depth=2, num_classes=5)
    x = torch.zeros(1, 3, 128, 128)
    with torch.no_grad(), max_memory("64MiB"):
        for impls in (("chunked", "sdpa"), ("sdpa", "sdpa")):
            check_model_forward(model.set_attn_impl(impls), x)
        with pytest.raises(ValueError, match="a forward pass of 1 image at 4097 tokens needs about 129.2 MiB"):
            check_model_forward(model.set_attn_impl(("sdpa", "einsum")), x)


def test_a_kernel_is_one_function_and_one_entry(monkeypatch):
    """An entry added to KERNELS is a choice of every layer at once, and Attend runs its function."""
    from vit_einops.network.kernels import FLOAT_DTYPES, KERNELS, Kernel

    entry = Kernel("doubled", "test_attention:doubled_einsum", True, ("cpu",), FLOAT_DTYPES, "twice the einsum")
    monkeypatch.setitem(KERNELS, "doubled", entry)
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2)
    q, k, v = torch.randn(3, 2, 2, 5, 8).unbind(0)
    expected = 2 * mha.attend(q, k, v)
    mha.impl = "doubled"
    assert mha.attend.forms_attention
    torch.testing.assert_close(mha.attend(q, k, v), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown attn_impl 'tripled'; expected one of 'einsum', 'chunked', 'sdpa', "
                                         "'doubled'"):  # fmt: skip
        mha.impl = "tripled"
