"""Named probe sites (TransformerLens's names): every site on every kernel and family against the einsum kernel and
against a forward pass written out here in plain torch ops, the head decomposition of the attention output, head
ablation, a replaced attention pattern, hooks that never outlive their call, gradients through the cache, and a
forward pass that opens no file."""

from __future__ import annotations

import builtins
import io
import math
import os

import pytest
import torch
import torch.nn.functional as F
from _tiny import TINY_RGB16, tiny_vit

from vit_einops import ATTN_IMPLS, ViT

FAMILIES = {
    "class token": {},
    "registers": dict(register_tokens=2),
    "mean pooling": dict(pool="mean", fc_norm=True),
    "layer scale": dict(layer_scale=0.5),
    "qk-norm": dict(qk_norm=True),
    "eva02 (rope, swiglu, qv bias)": dict(rope_grid=4, ffn="swiglu", qkv_bias="qv", pool="mean", fc_norm=True),
    "siglip (attention pool)": dict(class_token=False, pool="map"),
}
IMPLS = ATTN_IMPLS
F32 = dict(rtol=1e-5, atol=1e-5)
F64 = dict(rtol=1e-9, atol=1e-10)


def family_vit(overrides: dict, dtype=torch.float32, seed: int = 0) -> ViT:
    """A tiny ViT of the family with noise on every parameter (zero biases and heads would hide a misplaced
    tensor)."""
    torch.manual_seed(seed)
    model = tiny_vit(TINY_RGB16, **overrides).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    return model


def images(dtype=torch.float32, b: int = 2) -> torch.Tensor:
    return torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=dtype)


# --- a forward pass written out in plain torch ops --------------------------------------------------------------


def rotated(t: torch.Tensor, model: ViT, prefix: int) -> torch.Tensor:
    """2-D RoPE of (b, n, h, d) q or k as EVA-02 defines it: channel pair m of the first half turns by
    y / 10000^(m / (d/4)), of the second half by x / the same; prefix tokens unturned. The angles in float32,
    as timm's (and the model's) table, whatever the model's dtype."""
    (gh, gw), (rh, rw), d = model.patch_embed.grid_size, model.config.rope_grid, t.shape[-1]
    omega = 1.0 / 10000.0 ** (torch.arange(d // 4, dtype=torch.float32) / (d // 4))
    y = (torch.arange(gh, dtype=torch.float32) / gh * rh).repeat_interleave(gw)
    x = (torch.arange(gw, dtype=torch.float32) / gw * rw).repeat(gh)
    angles = torch.cat([y[:, None] * omega, x[:, None] * omega], -1).repeat_interleave(2, -1)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # (n', 1, d)
    patches = t[:, prefix:]
    turned = torch.stack([-patches[..., 1::2], patches[..., 0::2]], dim=-1).flatten(-2)  # (-x1, x0, -x3, x2, ...)
    return torch.cat([t[:, :prefix], patches * cos + turned * sin], dim=1)


def written_out(model: ViT, x: torch.Tensor, pool_pattern: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Every probe site's value (and the output, "out") of ``model`` on ``x``, from its weights alone; with
    ``pool_pattern``, the attention pool attends with that A instead of its own."""
    c, pe = model.config, model.patch_embed
    ln = lambda t, norm: F.layer_norm(t, norm.normalized_shape, norm.weight, norm.bias, norm.eps)  # noqa: E731
    sites = {}
    t = F.conv2d(x, pe.proj.weight, pe.proj.bias, stride=c.patch_size).flatten(2).transpose(1, 2)
    prefix = [pe._modules[name].weight for name in ("cls_token", "reg_token") if name in pe._modules]
    t = torch.cat([p.expand(len(x), -1, -1) for p in prefix] + [t], dim=1)
    sites["hook_embed"], sites["hook_pos_embed"] = t, pe.pos_embed.weight
    z = t + pe.pos_embed.weight
    b, n, dim, h = *z.shape, c.heads
    d = dim // h
    for layer, block in enumerate(model.blocks):
        mha, ff, s = block.attn.mha, block.mlp.ff, {}
        s["hook_resid_pre"] = z
        qkv = F.linear(ln(z, block.attn.norm), mha.qkv.weight, mha.qkv.bias)
        if c.qkv_bias == "qv":
            qkv = qkv + torch.cat([mha.q_bias, torch.zeros_like(mha.q_bias), mha.v_bias])
        q, k, v = qkv.reshape(b, n, 3, h, d).unbind(2)  # the (qkv h d) layout
        if c.qk_norm:
            q, k = ln(q, mha.q_norm), ln(k, mha.k_norm)
        if c.rope_grid is not None:
            q, k = rotated(q, model, c.num_prefix_tokens), rotated(k, model, c.num_prefix_tokens)
        s["attn.hook_q"], s["attn.hook_k"], s["attn.hook_v"] = q, k, v
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
        pattern = scores.softmax(-1)
        s["attn.hook_attn_scores"], s["attn.hook_pattern"] = scores, pattern
        s["attn.hook_z"] = torch.einsum("bhij,bjhd->bihd", pattern, v)
        s["attn.hook_result"] = torch.einsum("bnhd,Dhd->bnhD", s["attn.hook_z"], mha.proj.weight.view(dim, h, d))
        gamma = lambda branch: branch.ls.gamma if c.layer_scale is not None else 1.0  # noqa: E731
        s["hook_attn_out"] = (s["attn.hook_result"].sum(2) + mha.proj.bias) * gamma(block.attn)
        z = s["hook_resid_mid"] = z + s["hook_attn_out"]
        s["mlp.hook_pre"] = F.linear(ln(z, block.mlp.norm), ff.fc1.weight, ff.fc1.bias)
        if c.ffn == "swiglu":
            gate, value = s["mlp.hook_pre"].chunk(2, dim=-1)
            s["mlp.hook_post"] = F.silu(gate) * value
        else:
            s["mlp.hook_post"] = F.gelu(s["mlp.hook_pre"])
        s["hook_mlp_out"] = F.linear(s["mlp.hook_post"], ff.fc2.weight, ff.fc2.bias) * gamma(block.mlp)
        z = s["hook_resid_post"] = z + s["hook_mlp_out"]
        sites.update({f"blocks.{layer}.{name}": value for name, value in s.items()})
    head = model.head
    if c.pool == "map":  # SigLIP's MAP head: one learned query attends over the normed tokens, then a residual MLP
        pool, tokens = head.pool, ln(z, head.norm)
        q = F.linear(pool.latent.expand(b, 1, dim), pool.q.weight, pool.q.bias).view(b, 1, h, d)
        k, v = F.linear(tokens, pool.kv.weight, pool.kv.bias).view(b, n, 2, h, d).unbind(2)
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
        pattern = scores.softmax(-1) if pool_pattern is None else pool_pattern
        z_pool = torch.einsum("bhij,bjhd->bihd", pattern, v)
        attended = F.linear(z_pool.reshape(b, 1, dim), pool.proj.weight, pool.proj.bias)
        hidden = F.gelu(F.linear(ln(attended, pool.norm), pool.mlp.fc1.weight, pool.mlp.fc1.bias))
        pooled = (attended + F.linear(hidden, pool.mlp.fc2.weight, pool.mlp.fc2.bias))[:, 0]
        sites["ln_final.hook_normalized"] = tokens
        sites.update({"attn_pool.hook_q": q, "attn_pool.hook_k": k, "attn_pool.hook_v": v, "attn_pool.hook_z": z_pool,
                      "attn_pool.hook_attn_scores": scores, "attn_pool.hook_pattern": pattern, "hook_pooled": pooled})
    elif c.fc_norm:
        sites["hook_pooled"] = z[:, c.num_prefix_tokens :].mean(1)
        sites["ln_final.hook_normalized"] = pooled = ln(sites["hook_pooled"], head.norm)
    else:
        sites["ln_final.hook_normalized"] = ln(z, head.norm)
        sites["hook_pooled"] = pooled = sites["ln_final.hook_normalized"][:, 0]
    sites["out"] = F.linear(pooled, head.fc.weight, head.fc.bias)
    return sites


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_site_equals_the_forward_written_out(family, impl):
    model = family_vit(FAMILIES[family], torch.float64).set_attn_impl(impl)
    x = images(torch.float64)
    out, cache = model.run_with_cache(x)
    expected = written_out(model, x)
    assert list(cache) == list(model.probe_sites())  # every site, in the order the pass reaches them
    for name, value in expected.items():
        torch.testing.assert_close(out if name == "out" else cache[name], value, **F64, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(out, model(x), **F64)  # caching changes nothing but the order of sums (per head)


@pytest.mark.parametrize("impl", [i for i in IMPLS if i != "einsum"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_site_on_every_kernel_equals_the_einsum_kernels(family, impl):
    model = family_vit(FAMILIES[family])
    x = images()
    out, cache = model.run_with_cache(x)
    other_out, other = model.set_attn_impl(impl).run_with_cache(x)
    assert list(other) == list(cache)
    for name in cache:
        torch.testing.assert_close(other[name], cache[name], **F32, msg=lambda m: f"{name} on {impl}: {m}")
    torch.testing.assert_close(other_out, out, **F32)


def test_probe_sites_name_and_shape_every_activation():
    model = family_vit({})
    sites = model.probe_sites()
    assert list(sites)[:3] == ["hook_image", "hook_embed", "hook_pos_embed"]
    assert list(sites)[-2:] == ["ln_final.hook_normalized", "hook_pooled"]
    assert [n.removeprefix("blocks.1.") for n in sites if n.startswith("blocks.1.")] == [
        "hook_resid_pre", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v",
        "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out",
        "hook_resid_mid", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post",
        "hook_mlp_out", "hook_resid_post",
    ]  # fmt: skip
    assert all(site.name == name and not site.hooks for name, site in sites.items())
    _, cache = model.run_with_cache(images(b=3))
    b, n, h, d, dim = 3, 17, 4, 8, 32
    shapes = {
        "hook_image": (b, 3, 16, 16), "hook_embed": (b, n, dim), "hook_pos_embed": (1, n, dim), "blocks.0.attn.hook_q": (b, n, h, d),
        "blocks.0.attn.hook_pattern": (b, h, n, n), "blocks.0.attn.hook_z": (b, n, h, d),
        "blocks.0.attn.hook_result": (b, n, h, dim), "blocks.0.mlp.hook_pre": (b, n, 64),
        "blocks.0.hook_resid_post": (b, n, dim), "ln_final.hook_normalized": (b, n, dim), "hook_pooled": (b, dim),
    }  # fmt: skip
    assert {name: tuple(cache[name].shape) for name in shapes} == shapes
    # ln1 and ln2 are each branch's pre-norm output, what the MSA and the MLP take.
    for layer, block in enumerate(model.blocks):
        ln1, ln2 = cache[f"blocks.{layer}.ln1.hook_normalized"], cache[f"blocks.{layer}.ln2.hook_normalized"]
        torch.testing.assert_close(ln1, block.attn.norm(cache["resid_pre", layer]))
        torch.testing.assert_close(ln2, block.mlp.norm(cache["resid_mid", layer]))
    # The probe modules hold nothing: the state dict is the model's weights alone.
    assert all("hook" not in key for key in model.state_dict())


# --- the attention output decomposes over heads -----------------------------------------------------------------


@pytest.mark.parametrize("layer_scale", [None, 0.5])
@pytest.mark.parametrize("impl", IMPLS)
def test_result_summed_over_heads_plus_the_bias_is_attn_out(impl, layer_scale):
    """hook_attn_out is what the attention branch adds to the residual stream: LayerScale's gamma times
    (sum over heads of hook_result + proj.bias); without LayerScale, gamma is 1."""
    model = family_vit(dict(layer_scale=layer_scale)).set_attn_impl(impl)
    _, cache = model.run_with_cache(images())
    for layer, block in enumerate(model.blocks):
        gamma = block.attn.ls.gamma if layer_scale is not None else 1.0
        summed = (cache["result", layer].sum(dim=2) + block.attn.mha.proj.bias) * gamma
        torch.testing.assert_close(summed, cache["attn_out", layer], **F32)
        torch.testing.assert_close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])


@pytest.mark.parametrize("site", ["z", "result"])
@pytest.mark.parametrize("impl", IMPLS)
def test_a_head_zeroed_by_a_hook_equals_zeroing_its_output_projection_columns(impl, site):
    model = family_vit(dict(layer_scale=0.5)).set_attn_impl(impl)
    x, layer, head, d = images(), 1, 2, 8

    def ablate(value, hook):
        value = value.clone()
        value[:, :, head] = 0  # (b, n, h, d) or (b, n, h, D): the head axis is the third either way
        return value

    ablated = model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.attn.hook_{site}", ablate)])
    cut = family_vit(dict(layer_scale=0.5)).set_attn_impl(impl)
    with torch.no_grad():
        cut.blocks[layer].attn.mha.proj.weight[:, head * d : (head + 1) * d] = 0
    torch.testing.assert_close(ablated, cut(x), **F32)
    assert not torch.allclose(ablated, model(x), atol=1e-3)  # the head mattered


def test_a_replaced_pattern_changes_the_output_identically_on_every_kernel():
    """A replaced A is what the layer attends with, whichever kernel is chosen (uniform attention here)."""
    model, x = family_vit({}), images()

    def uniform(pattern, hook):
        return torch.full_like(pattern, 1 / pattern.shape[-1])

    outputs = {impl: model.set_attn_impl(impl).run_with_hooks(x, [("blocks.0.attn.hook_pattern", uniform)])
               for impl in IMPLS}  # fmt: skip
    for impl in IMPLS:
        torch.testing.assert_close(outputs[impl], outputs["einsum"], **F32)
    assert not torch.allclose(outputs["einsum"], model(x), atol=1e-3)
    # The uniform pattern's z is every head's mean of v over the tokens.
    _, cache = model.set_attn_impl("sdpa").run_with_cache(x, ["blocks.0.attn.hook_v"])
    z = {}
    model.run_with_hooks(x, [("blocks.0.attn.hook_pattern", uniform),
                             ("blocks.0.attn.hook_z", lambda value, hook: z.setdefault("z", value))])  # fmt: skip
    torch.testing.assert_close(z["z"], cache["v", 0].mean(1, keepdim=True).expand_as(z["z"]), **F32)


def test_the_attention_pools_pattern_is_a_site_that_can_be_replaced():
    """SigLIP's MAP head: its sites sit between the final LayerNorm and the pooled output, A is (b, h, 1, n) with
    rows summing to 1, and a replaced A (uniform over the tokens) is what the pool attends with, as the pool
    written out with that A computes."""
    model, x = family_vit(FAMILIES["siglip (attention pool)"], torch.float64), images(torch.float64)
    names = list(model.probe_sites())
    assert names[-8:] == ["ln_final.hook_normalized", "attn_pool.hook_q", "attn_pool.hook_k", "attn_pool.hook_v",
                          "attn_pool.hook_attn_scores", "attn_pool.hook_pattern", "attn_pool.hook_z", "hook_pooled"]
    assert model.probe_sites()["attn_pool.hook_pattern"].shape == "(b, h, 1, n)"
    pattern = model.run_with_cache(x, "attn_pool.hook_pattern")[1]["attn_pool.hook_pattern"]
    assert pattern.shape == (2, 4, 1, 16)  # 16 patch tokens, no class token
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 4, 1, dtype=torch.float64))
    uniform = torch.full_like(pattern, 1 / 16)
    replaced = model.run_with_hooks(x, [("attn_pool.hook_pattern", lambda value, hook: uniform)])
    torch.testing.assert_close(replaced, written_out(model, x, pool_pattern=uniform)["out"], **F64)
    assert not torch.allclose(replaced, model(x), atol=1e-3)


def test_hooks_run_in_order_and_a_wrong_replacement_is_named():
    model, x = family_vit({}), images()
    seen = []
    model.run_with_hooks(x, [("hook_pooled", lambda v, hook: seen.append(("first", hook.name)) or v * 2),
                             ("hook_pooled", lambda v, hook: seen.append(("second", v.shape)))])  # fmt: skip
    assert seen == [("first", "hook_pooled"), ("second", torch.Size([2, 32]))]
    with pytest.raises(ValueError, match=r"the hook on blocks.0.attn.hook_z returned shape \(2, 17, 32\); a hook "
                                         r"returns None \(keep the value\) or a tensor of the value's shape "
                                         r"\(2, 17, 4, 8\) \(b, n, h, d\)"):  # fmt: skip
        model.run_with_hooks(x, [("blocks.0.attn.hook_z", lambda v, hook: v.flatten(2))])


# --- hooks never outlive their call -------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_no_hook_remains_after_an_exception_inside_a_hook(impl):
    model, x = family_vit({}).set_attn_impl(impl), images()
    expected = model(x)

    def boom(value, hook):
        raise RuntimeError("inside the hook")

    with pytest.raises(RuntimeError, match="inside the hook"):
        model.run_with_hooks(x, [("blocks.0.attn.hook_q", lambda v, hook: v * 0), ("blocks.1.hook_resid_mid", boom)])
    with pytest.raises(RuntimeError, match="inside the hook"):
        model.run_with_hooks(x, [(lambda name: name.endswith("hook_pattern"), boom)])
    assert all(not site.hooks for site in model.probe_sites().values())
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


# --- names ----------------------------------------------------------------------------------------------------


def test_names_filter_takes_none_a_name_a_list_or_a_callable():
    model, x = family_vit({}), images()
    assert len(model.run_with_cache(x)[1]) == len(model.probe_sites())
    assert list(model.run_with_cache(x, "blocks.1.attn.hook_pattern")[1]) == ["blocks.1.attn.hook_pattern"]
    chosen = ["hook_pooled", "blocks.0.hook_resid_post"]
    assert list(model.run_with_cache(x, chosen)[1]) == chosen[::-1]  # in the order the pass reaches them
    _, cache = model.run_with_cache(x, lambda name: name.endswith("hook_pattern"))
    assert list(cache) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    # TransformerLens's key shorthand
    assert cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"] is cache["attn", -1]


def test_unknown_names_are_refused_with_the_closest_sites():
    model, x = family_vit({}), images()
    with pytest.raises(ValueError, match=r"no probe site 'blocks.0.attn.hook_patern'; did you mean "
                                         r"'blocks.0.attn.hook_pattern' or 'blocks.1.attn.hook_pattern' or "
                                         r"'blocks.0.attn.hook_z'\? The sites are hook_image, hook_embed, "
                                         r"hook_pos_embed, blocks.0.hook_resid_pre, "):  # fmt: skip
        model.run_with_hooks(x, [("blocks.0.attn.hook_patern", lambda v, hook: None)])
    with pytest.raises(ValueError, match=r"no probe site 'blocks.7.hook_resid_post'"):
        model.run_with_cache(x, ["blocks.7.hook_resid_post"])
    _, cache = model.run_with_cache(x, "blocks.0.hook_resid_post")
    with pytest.raises(KeyError, match="'blocks.1.attn.hook_pattern' is not in this cache; it holds "
                                       "blocks.0.hook_resid_post"):  # fmt: skip
        cache["pattern", 1]
    with pytest.raises(KeyError, match=r"unknown short name 'patern' in \('patern', 0\); expected one of resid_pre"):
        cache["patern", 0]
    with pytest.raises(KeyError, match=r"layer 2 of \('pattern', 2\) is not a block of this model \(depth 2\)"):
        cache["pattern", 2]


# --- gradients ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_flow_through_the_cache(impl):
    """With detach=False the cached A is in the graph on every kernel, and its gradient is the einsum kernel's
    (dO v^T for O = A v); by default the cache holds detached values."""
    model, x = family_vit({}), images()
    grads = {}
    for kernel in ("einsum", impl):
        out, cache = model.set_attn_impl(kernel).run_with_cache(x, ["blocks.0.attn.hook_pattern"], detach=False)
        (grads[kernel],) = torch.autograd.grad(out[:, 1].sum(), cache["pattern", 0])
    torch.testing.assert_close(grads[impl], grads["einsum"], **F32)
    assert grads[impl].abs().sum() > 0
    assert not model.run_with_cache(x, ["blocks.0.attn.hook_pattern"])[1]["pattern", 0].requires_grad


# --- the forward pass reads nothing ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["class token", "eva02 (rope, swiglu, qv bias)", "siglip (attention pool)"])
@pytest.mark.parametrize("impl", IMPLS)
def test_a_forward_pass_opens_no_file(monkeypatch, family, impl):
    """No budget, /proc or sysfs read, no environment lookup: every way to open a file raises during the pass."""
    model, x = family_vit(FAMILIES[family]).set_attn_impl(impl), images()
    expected = model(x)

    def refuse(*args, **kwargs):
        raise AssertionError(f"the forward pass opened {args[0]!r}")

    for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(os, "environ", {})
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    torch.testing.assert_close(model.run_with_cache(x)[0], expected, **F32)
