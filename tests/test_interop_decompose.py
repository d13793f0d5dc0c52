"""decompose against timm's own modules: each head's, each MLP's and each source token's share computed from hooks on
timm's modules (the input of each block's attn.proj split into its heads' slices, the MLP branch's output, the
attention matrix of attn_drop with timm's fused attention off, v from the branch's normed input) and a reader r
that autograd finds on a linearised copy of timm's head written here (the final norm's sigma, the output's norm
and an attention pool's weights and MLP detached), for a tiny timm ViT, DINOv2 with registers, SigLIP (attention
pool) and EVA-02 (mean pool, fc_norm, RoPE, SwiGLU). float32, max |difference| <= 1e-5. On the same four, a head
zeroed through our hooks (ablate_heads, mode "zero") changes the score as timm's own model does with that head's
columns of attn.proj.weight zeroed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _interop import interop_library, perturbed, report_diffs

from vit_einops.inspect import EmbeddingTarget, ablate_heads, decompose
from vit_einops.interop import load_timm

timm = interop_library("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

TOL = 1e-5
DIFFS: dict[str, float] = {}
TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, img_size=32, patch_size=8)
MODELS = {
    "vit (class token)": dict(num_classes=10),
    "dinov2 with registers": dict(init_values=0.5, reg_tokens=4, no_embed_class=True, num_classes=0),
    "siglip (attention pool)": dict(class_token=False, global_pool="map", num_classes=0),
    "eva02_tiny_patch14_224": None,  # timm.create_model's own, at its size
}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    report_diffs(DIFFS)


def _models(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    if MODELS[name] is None:
        theirs = perturbed(timm.create_model(name, pretrained=False))
        return theirs, load_timm(theirs.state_dict(), arch=name)
    theirs = perturbed(VisionTransformer(**TINY, **MODELS[name]))
    return theirs, load_timm(theirs.state_dict(), heads=2, act="gelu", layer_norm_eps=1e-6)


def _observed_norm(norm: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm with sigma detached: linear in x."""
    sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps).detach()
    return (x - x.mean(-1, keepdim=True)) / sigma * norm.weight + norm.bias


def _linear_score(theirs: torch.nn.Module, z: torch.Tensor, target) -> torch.Tensor:
    """timm's head on its last block's output z, every observed value detached: affine in z."""
    pool = getattr(theirs, "attn_pool", None)
    if pool is not None:  # AttentionPoolLatent: its weights and its MLP detached
        y = _observed_norm(theirs.norm, z)
        b, n, dim = y.shape
        h = pool.num_heads
        q = pool.q(pool.latent.expand(b, -1, -1)).view(b, 1, h, -1).transpose(1, 2)
        k, v = pool.kv(y).view(b, n, 2, h, -1).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-1, -2) * pool.scale).softmax(-1).detach()
        out = pool.proj((attn @ v).transpose(1, 2).reshape(b, 1, dim))
        features = (out + pool.mlp(pool.norm(out)).detach())[:, 0]
    elif getattr(theirs, "global_pool", "token") == "avg":
        features = _observed_norm(theirs.fc_norm, z[:, theirs.num_prefix_tokens :].mean(1))
    else:
        features = _observed_norm(theirs.norm, z)[:, 0]
    if isinstance(target, EmbeddingTarget):
        e = target.vector
        return (features @ e) / (features.norm(dim=-1).detach() * e.norm())
    return theirs.head(features).gather(1, target[:, None])[:, 0]


def _timm_parts(theirs: torch.nn.Module, x: torch.Tensor, target):
    """(heads (b, L, H), mlps (b, L), sources (b, L, H, n), score (b,)) from hooks on timm's modules."""
    seen: dict[str, list] = {"proj": [], "mlp": [], "attn": [], "input": []}
    handles = []
    for block in theirs.blocks:
        block.attn.fused_attn = False
        handles += [
            block.attn.proj.register_forward_pre_hook(lambda m, a: seen["proj"].append(a[0])),
            block.attn.attn_drop.register_forward_hook(lambda m, a, out: seen["attn"].append(out)),
            block.attn.register_forward_pre_hook(lambda m, a: seen["input"].append(a[0])),
            block.mlp.register_forward_hook(lambda m, a, out: seen["mlp"].append(out)),
        ]
    z = []
    handles.append(theirs.blocks[-1].register_forward_hook(lambda m, a, out: z.append(out)))
    try:
        with torch.no_grad():
            theirs(x)
    finally:
        for handle in handles:
            handle.remove()
    zl = z[0].detach().requires_grad_(True)
    score = _linear_score(theirs, zl, target)
    (reader,) = torch.autograd.grad(score.sum(), zl)
    heads, mlps, sources = [], [], []
    for l, block in enumerate(theirs.blocks):
        count = block.attn.num_heads
        gamma1 = block.ls1.gamma if hasattr(getattr(block, "ls1", None), "gamma") else 1.0
        gamma2 = block.ls2.gamma if hasattr(getattr(block, "ls2", None), "gamma") else 1.0
        w = block.attn.proj.weight.view(-1, count, block.attn.proj.weight.shape[1] // count)  # (D, H, d)
        z_heads = seen["proj"][l].unflatten(-1, (count, -1))  # (b, n, H, d)
        heads.append(torch.einsum("bnD,bnhd,Dhd->bh", reader * gamma1, z_heads, w))
        mlps.append((reader * gamma2 * seen["mlp"][l]).sum((1, 2)))
        qkv = block.attn.qkv
        dim = qkv.weight.shape[1]
        bias = qkv.bias if qkv.bias is not None else torch.cat((block.attn.q_bias, block.attn.k_bias, block.attn.v_bias))
        v = F.linear(seen["input"][l], qkv.weight[2 * dim :], bias[2 * dim :]).unflatten(-1, (count, -1))
        values = torch.einsum("bjhd,Dhd->bjhD", v, w) * gamma1
        sources.append(torch.einsum("bhij,biD,bjhD->bhj", seen["attn"][l], reader, values))
    return torch.stack(heads, 1), torch.stack(mlps, 1), torch.stack(sources, 1), score.detach()


@pytest.mark.parametrize("impl", ["einsum", "sdpa"])
@pytest.mark.parametrize("name", list(MODELS))
def test_heads_mlps_and_sources_are_timms(name, impl):
    theirs, ours = _models(name)
    ours.set_attn_impl(impl)
    size = ours.config.image_size
    torch.manual_seed(1)
    x = torch.randn(1, 3, *size)
    if ours.has_classifier:
        with torch.no_grad():
            target = theirs(x).argmax(-1)
    else:
        target = EmbeddingTarget(torch.randn(ours.num_features))
    heads, mlps, sources, score = _timm_parts(theirs, x, target)
    d = decompose(ours, x, target, by_source=True, preprocessed=True)
    for what, actual, expected in (
        ("total", d.total, score), ("heads", d.heads, heads), ("mlps", d.mlps, mlps),
        ("sources", d.by_source, sources),
    ):  # fmt: skip
        diff = DIFFS[f"decompose timm {name} {impl} {what}"] = (actual - expected).abs().max().item()
        assert diff <= TOL, f"{name} {impl} {what}: max |difference| {diff:.2e} > {TOL:g}"


def _timm_score(theirs: torch.nn.Module, x: torch.Tensor, target) -> torch.Tensor:
    """timm's own score of x (b,): the target class's logit, or the cosine of its pooled output to the embedding."""
    with torch.no_grad():
        out = theirs(x)
    if isinstance(target, EmbeddingTarget):
        return F.cosine_similarity(out, target.vector[None], dim=-1)
    return out.gather(1, target[:, None])[:, 0]


@pytest.mark.parametrize("name", list(MODELS))
def test_a_head_zeroed_through_our_hooks_changes_the_score_as_timms_proj_columns_zeroed(name):
    """ablate_heads(mode="zero") replaces a head's A v (hook_z) by zeros; timm's model with that head's columns of
    attn.proj.weight zeroed is the same model without it: the score changes alike, head by head and for a set of
    heads in two layers zeroed together."""
    theirs, ours = _models(name)
    torch.manual_seed(1)
    x = torch.randn(2, 3, *ours.config.image_size)
    if ours.has_classifier:
        with torch.no_grad():
            target = theirs(x).argmax(-1)
    else:
        target = EmbeddingTarget(torch.randn(ours.num_features))
    depth, count = len(ours.blocks), ours.blocks[0].attn.mha.heads
    sets = [[(0, 0)], [(depth - 1, count - 1)], [(0, count - 1), (depth - 1, 0)]]
    changes = ablate_heads(ours, x, sets, mode="zero", target=target, preprocessed=True)  # (sets, b)
    clean = _timm_score(theirs, x, target)
    for chosen, change in zip(sets, changes, strict=True):
        saved = {l: theirs.blocks[l].attn.proj.weight.detach().clone() for l, _ in chosen}
        try:
            with torch.no_grad():
                for l, h in chosen:
                    weight = theirs.blocks[l].attn.proj.weight
                    d = weight.shape[1] // count
                    weight[:, h * d : (h + 1) * d] = 0
            expected = _timm_score(theirs, x, target) - clean
        finally:
            with torch.no_grad():
                for l, weight in saved.items():
                    theirs.blocks[l].attn.proj.weight.copy_(weight)
        assert expected.abs().max() > 1e-4, f"{name} {chosen}: zeroing the head changes nothing to compare"
        diff = DIFFS[f"ablate_heads zero timm {name} {chosen}"] = (change - expected).abs().max().item()
        assert diff <= TOL, f"{name} {chosen}: max |difference| {diff:.2e} > {TOL:g}"
