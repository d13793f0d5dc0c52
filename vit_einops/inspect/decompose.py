"""What each head says: a target's score split exactly into the parts of the residual stream (Elhage et al. 2021;
Gandelsman et al., ICLR 2024), the logit lens, and head ablation and activation patching on the probe sites.

The last block's output is a sum, z_L = z_0 + sum_l (attn_out_l + mlp_out_l), and attn_out_l is
gamma_l * (sum_h result_{l,h} + b_O). The head turns z_L into a score through LayerNorms, a pooling and a linear
classifier; with each LayerNorm's sigma, the output's norm (a cosine target) and an attention pool's weights taken
at their observed values, that path is affine in z_L: score = sum_i r_i . z_L[i] + c. :func:`decompose` finds the
reader r (b, n, D) and the constants c, then reads every part of z_L with r: each head's share is
r . gamma_l result_{l,h}, each MLP's r . mlp_out_l, and the embeddings, the output projections' biases and the
constants are the named parts of ``rest``. docs/decomposition.md says what is exact and what is observed.

Every value is read from the probe sites (``model.run_with_cache``); ablation and patching replace ``hook_z`` (one
head's A v, so its output projection's columns see zeros, a mean or the clean run's value) or ``hook_resid_pre``.

Axes: b images, L layers, H heads, n tokens (the prefix tokens, then the patches), D width, S pooled slots (1, or
DeiT's class and distillation tokens).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..base.checks import check_choice, check_int
from ..base.threads import follow_free_cores
from ..inputs import model_inputs
from ..network.patch_embed import TokenLayout
from ..network.sizes import check_model_forward, forward_bytes
from .targets import (
    BACKBONE_TARGETS,
    PatchTarget,
    class_targets,
    one_class_each,
    resolve_target,
)

ABLATIONS = ("mean", "zero")
MAX_PASSES = 1 << 16  # forward passes one patching call may run: far past a ViT-H's 32 x 16 heads
BAR_FROM = 8  # passes from which a tty sees a progress bar


@dataclass(frozen=True, eq=False)
class Decomposition:
    """:func:`decompose`'s result. ``total`` (b,): the target's score, equal to the model's own; ``heads`` (b, L, H)
    and ``mlps`` (b, L): each branch's direct share; ``rest`` (b,): the sum of ``parts``, the named remainder
    (embeddings, biases, the final norm's shift, an attention pool's MLP); ``total == heads.sum((1, 2)) +
    mlps.sum(1) + rest``. ``by_source`` (b, L, H, n) when asked for, each head's share split over its source
    tokens (:meth:`sources`); ``layout`` names the tokens."""

    total: torch.Tensor
    heads: torch.Tensor
    mlps: torch.Tensor
    rest: torch.Tensor
    parts: dict[str, torch.Tensor]
    layout: TokenLayout
    by_source: torch.Tensor | None = None
    _reader: torch.Tensor | None = field(default=None, repr=False)
    _patterns: tuple[torch.Tensor, ...] = field(default=(), repr=False)
    _values: tuple[torch.Tensor, ...] = field(default=(), repr=False)  # v_{l,h}[j] W_O,h^T gamma_l: (b, n, H, D)

    def sources(self, layer: int, head: int) -> torch.Tensor:
        """(b, n): head ``head`` of layer ``layer``'s share from each source token j,
        sum_i A[i, j] r_i . gamma v_j W_O,h^T; it sums over n to ``heads[:, layer, head]``."""
        layers, heads = self.heads.shape[1:]
        layer = check_int("layer", layer, 0, layers - 1)
        head = check_int("head", head, 0, heads - 1)
        if self.by_source is not None:
            return self.by_source[:, layer, head]
        pattern, values = self._patterns[layer][:, head], self._values[layer][:, :, head]
        return torch.einsum("bij,biD,bjD->bj", pattern, self._reader, values)

    def all_sources(self) -> torch.Tensor:
        """(b, L, H, n): :meth:`sources` of every head."""
        if self.by_source is not None:
            return self.by_source
        return torch.stack(
            [torch.einsum("bhij,biD,bjhD->bhj", a, self._reader, v) for a, v in zip(self._patterns, self._values)],
            dim=1,
        )

    def source_map(self) -> torch.Tensor:
        """(b, gh, gw): every head's share from each patch, summed over layers and heads: where the heads' direct
        contributions come from (the prefix tokens' shares left out)."""
        shares = self.by_source if self.by_source is not None else self.all_sources()
        return shares.sum((1, 2))[:, self.layout.num_prefix :].unflatten(-1, self.layout.grid)

    def numbers(self) -> Decomposition:
        """The numbers alone, as a study keeps them: ``by_source`` computed, the reader and every layer's attention
        pattern and values dropped (they are the size of the recorded maps again, times the width)."""
        return dataclasses.replace(self, by_source=self.all_sources(), _reader=None, _patterns=(), _values=())

    def to_json(self, image: int = 0) -> dict[str, Any]:
        """Image ``image``'s numbers: total, heads [L][H], mlps [L], rest and its named parts."""
        return {
            "total": float(self.total[image]),
            "heads": self.heads[image].tolist(),
            "mlps": self.mlps[image].tolist(),
            "rest": float(self.rest[image]),
            "parts": {name: float(value[image]) for name, value in self.parts.items()},
            "tokens": {"prefix": list(self.layout.prefix), "grid": list(self.layout.grid)},
        }

    def plot(self, image: int = 0):
        """A figure of image ``image``'s decomposition: the heads' shares (L x H), the MLPs' and rest's, and the
        heads' summed source map on the patch grid."""
        from ..base.plot import new_figure

        fig = new_figure(figsize=(12.0, 3.8))
        heads, bars, grid = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1.0, 1.0]})
        shares = self.heads[image].detach().cpu().numpy()
        bound = float(abs(shares).max()) or 1.0
        shown = heads.imshow(shares, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        heads.set(title="each head's direct share", xlabel="head", ylabel="layer",
                  xticks=range(shares.shape[1]), yticks=range(shares.shape[0]))  # fmt: skip
        fig.colorbar(shown, ax=heads)
        names = [f"MLP {l}" for l in range(self.mlps.shape[1])] + ["heads (all)", "rest"]
        values = [*self.mlps[image].tolist(), float(self.heads[image].sum()), float(self.rest[image])]
        bars.barh(names, values, color=["tab:red" if v < 0 else "tab:blue" for v in values])
        bars.set(title=f"the total {float(self.total[image]):.4g} split", xlabel="share")
        bars.invert_yaxis()
        source = self.source_map()[image].detach().cpu().numpy()
        bound = float(abs(source).max()) or 1.0
        shown = grid.imshow(source, cmap="RdBu_r", vmin=-bound, vmax=bound)
        grid.set(title="the heads' share from each patch", xticks=[], yticks=[])
        fig.colorbar(shown, ax=grid)
        return fig

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads and MLPs of largest share on image 0, by absolute value: ("L3H2" or "MLP3", share)."""
        named = [(f"L{l}H{h}", float(s)) for l, row in enumerate(self.heads[0]) for h, s in enumerate(row)]
        named += [(f"MLP{l}", float(s)) for l, s in enumerate(self.mlps[0])]
        return sorted(named, key=lambda item: -abs(item[1]))[: check_int("k", k, 1)]


def _in_eval(fn: Callable) -> Callable:
    """``fn(model, ...)`` run with the model in eval mode (no dropout: the parts would not add up), its mode
    restored after, and without gradients."""

    @functools.wraps(fn)
    def run(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        was_training = getattr(model, "training", None)
        if isinstance(model, nn.Module):
            model.eval()
        try:
            with torch.no_grad():
                return fn(model, *args, **kwargs)
        finally:
            if isinstance(model, nn.Module):
                model.train(was_training)

    return run


# -- the score of the final tokens --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Score:
    """What is scored: a backbone target, or the class per image (``classes``); ``layout`` the input's tokens."""

    target: Any
    classes: torch.Tensor | None
    layout: TokenLayout

    def __call__(self, model: nn.Module, z: torch.Tensor) -> torch.Tensor:
        """The score (b,) the model's head gives tokens ``z`` (b, n, D) taken as the last block's output."""
        head = model.head
        if self.classes is not None:
            return head(z).gather(1, self.classes[:, None])[:, 0]
        if isinstance(self.target, PatchTarget):
            tokens = head.normed(z) if head.token_norm else z
            return self.target.similarity(tokens, self.layout).flatten(1).mean(dim=-1)
        return self.target.scores(head(z))


def _batch(model: nn.Module, images: Any, target: Any, preprocessed: bool | None, who: str) -> tuple[torch.Tensor, Any]:
    """(the model's batch, the resolved target), each checked before any forward pass."""
    if not hasattr(model, "run_with_cache"):
        raise TypeError(f"{who} reads a vit_einops ViT's probe sites, got {type(model).__name__}")
    x = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, x, grad=False)
    return x, resolve_target(model, target, len(x))


def _scored(model: nn.Module, x: torch.Tensor, target: Any, who: str, logits: torch.Tensor | None = None) -> _Score:
    """What is scored on batch ``x``: a backbone target, or the class per image, read from ``logits`` (the model's
    output on ``x`` where a caller's own pass gave it, else from a pass of its own)."""
    classes = None
    if not isinstance(target, BACKBONE_TARGETS):
        classes = one_class_each(class_targets(target, model(x) if logits is None else logits), who)
    return _Score(target, classes, model.patch_embed.layout(x.shape[-2:]))


def _prepare(model: nn.Module, images: Any, target: Any, preprocessed: bool | None, who: str):
    """(the model's batch, what is scored: the resolved target, or the class per image)."""
    x, target = _batch(model, images, target, preprocessed, who)
    return x, _scored(model, x, target, who)


# -- the reader r: score = sum_i r_i . z_L[i] + constants --------------------------------------------------


def _center(v: torch.Tensor) -> torch.Tensor:
    return v - v.mean(dim=-1, keepdim=True)


def _through_norm(norm: nn.LayerNorm, x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u . LN(x) = u' . x + c with LN's sigma at its observed value on x: (u', c per image). u, x (b, ..., D)."""
    sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
    gamma = norm.weight if norm.weight is not None else 1.0
    shift = (u * norm.bias).flatten(1).sum(1) if norm.bias is not None else u.new_zeros(len(u))
    return _center(u * gamma / sigma), shift


def _pool_reader(model: nn.Module, cache: Any, pool_in: torch.Tensor, u: torch.Tensor, parts: dict) -> torch.Tensor:
    """Slot readers u (b, S, D) on the pooling's output -> token readers (b, n, D) on its input ``pool_in``; an
    attention pool's weights and heads' outputs are read at its probe sites (``attn_pool.hook_pattern``, ``hook_z``)."""
    head = model.head
    pool = head.pool
    reader = torch.zeros_like(pool_in)
    if pool.mode == "cls":
        reader[:, : u.shape[1]] = u
    elif pool.mode == "mean":
        prefix = pool.num_prefix_tokens
        reader[:, prefix:] = u[:, :1] / (pool_in.shape[1] - prefix)
    else:  # "map": the latent query's attention weights A (b, H, n) at their observed values
        b, n, dim = pool_in.shape
        weights = cache["attn_pool.hook_pattern"][:, :, 0]  # (b, H, n)
        z = cache["attn_pool.hook_z"][:, 0]  # (b, H, d): each head's A v
        heads, d = z.shape[1], z.shape[-1]
        attended = pool.proj(z.flatten(1))  # (b, D)
        g = (u[:, 0] @ pool.proj.weight).view(b, heads, d)  # u W_O, per head
        w_v = pool.kv.weight[dim:].view(heads, d, dim)
        reader = torch.einsum("bhj,bhd,hdD->bjD", weights, g, w_v)
        bias = u[:, 0] @ pool.proj.bias if pool.proj.bias is not None else u.new_zeros(b)
        if pool.kv.bias is not None:  # each head's weights sum to 1: b_v passes whole
            bias = bias + (g.flatten(1) * pool.kv.bias[dim:]).sum(1)
        parts["attention pool's biases"] = bias
        parts["attention pool's MLP"] = (u[:, 0] * pool.mlp(pool.norm(attended))).sum(1)
    return reader


def not_decomposable(model: nn.Module) -> str:
    """Why :func:`decompose` cannot split ``model``'s score, as a clause after "it" ("" where it can): a head
    with a tanh pre_logits layer is not linear, so no part's share passes through it exactly."""
    if "pre_logits" in model.head._modules:
        return ("needs a linear classifier: this model's head has a tanh pre_logits layer (representation_size), "
                "which no part's share passes through exactly")  # fmt: skip
    return ""


def _reader(model: nn.Module, cache: Any, score: _Score) -> tuple[torch.Tensor, dict]:
    """(r (b, n, D), the named constants): score = sum_i r_i . z_L[i] + sum(constants)."""
    head = model.head
    if why := not_decomposable(model):
        raise ValueError(f"decompose {why}")
    z = cache["resid_post", -1]
    parts: dict[str, torch.Tensor] = {}
    target, classes, layout = score.target, score.classes, score.layout
    if isinstance(target, PatchTarget):
        tokens = head.normed(z) if head.token_norm else z
        gh, gw = layout.grid
        chosen = tokens[:, layout.num_prefix + target.row * gw + target.col]
        unit = chosen / chosen.norm(dim=-1, keepdim=True)
        reader = torch.zeros_like(tokens)
        patches = tokens[:, layout.num_prefix :]
        reader[:, layout.num_prefix :] = unit[:, None] / (patches.norm(dim=-1, keepdim=True) * gh * gw)
        if head.token_norm:
            reader, parts["final norm's shift"] = _through_norm(head.norm, z, reader)
        return reader, parts
    features = cache["ln_final.hook_normalized"] if not head.token_norm else cache["hook_pooled"]
    output = head.classify(features)
    if classes is not None:
        a = F.one_hot(classes, output.shape[-1]).to(output.dtype)
    else:
        e = target.vector.to(output.device, output.dtype).expand_as(output)
        a = e / (e.norm(dim=-1, keepdim=True) * output.norm(dim=-1, keepdim=True))  # cos with |y| observed
    fcs = [head.fc, head.fc_dist] if head.distilled else [head.fc]
    u, bias = [], a.new_zeros(len(a))
    for fc in fcs:
        if isinstance(fc, nn.Linear):
            u.append(a @ fc.weight / len(fcs))
            if fc.bias is not None:
                bias = bias + a @ fc.bias / len(fcs)
        else:
            u.append(a / len(fcs))
    parts["classifier's bias"] = bias
    u = torch.stack(u, dim=1)  # (b, S, D)
    if head.token_norm:
        reader = _pool_reader(model, cache, cache["ln_final.hook_normalized"], u, parts)
        reader, parts["final norm's shift"] = _through_norm(head.norm, z, reader)
    else:
        u, parts["final norm's shift"] = _through_norm(head.norm, cache["hook_pooled"][:, None], u)
        reader = _pool_reader(model, cache, z, u, parts)
    return reader, parts


# -- decompose ----------------------------------------------------------------------------------------------


def _sites(model: nn.Module, extra: Sequence[str] = ()) -> list[str]:
    depth = len(model.blocks)
    pool = ["attn_pool.hook_pattern", "attn_pool.hook_z"] if model.head.pool.mode == "map" else []
    names = pool + ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", f"blocks.{depth - 1}.hook_resid_post"]
    for l in range(depth):
        names += [f"blocks.{l}.attn.hook_result", f"blocks.{l}.hook_attn_out", f"blocks.{l}.hook_mlp_out"]
        names += [f"blocks.{l}.attn.{site}" for site in extra]
    return names + ["ln_final.hook_normalized", "hook_pooled"]


def _gamma(branch: nn.Module, like: torch.Tensor) -> torch.Tensor:
    """A branch's LayerScale gamma (D,), ones without LayerScale."""
    ls = getattr(branch, "ls", None)
    return ls.gamma if ls is not None else torch.ones(like.shape[-1], dtype=like.dtype, device=like.device)


@_in_eval
def decompose(
    model: nn.Module, images: Any, target: Any = None, *, by_source: bool = False, preprocessed: bool | None = None
) -> Decomposition:
    """The target's score split exactly into each head's and MLP's direct share and the named rest (module
    docstring; docs/decomposition.md).

    Args:
        images: as :func:`vit_einops.predict` takes them (``preprocessed``: how a float tensor is taken).
        target: None (each image's predicted class), a class index or one per image (b,), or for a model without
            a classifier a backbone target (:class:`EmbeddingTarget`, :class:`ImageTarget`, :class:`PatchTarget`).
        by_source: also split every head's share over its source tokens (``Decomposition.by_source``).
    """
    x, target = _batch(model, images, target, preprocessed, "decompose")
    logits, cache = model.run_with_cache(x, _sites(model, ("hook_pattern", "hook_v")))
    score = _scored(model, x, target, "decompose", logits)  # the class from this pass's logits: no pass of its own
    z = cache["resid_post", -1]
    total = logits.gather(1, score.classes[:, None])[:, 0] if score.classes is not None else score(model, z)
    reader, parts = _reader(model, cache, score)
    heads, mlps, biases, patterns, values = [], [], reader.new_zeros(len(x)), [], []
    for l, block in enumerate(model.blocks):
        gamma = _gamma(block.attn, z)
        result = cache["result", l] * gamma
        heads.append(torch.einsum("bnD,bnhD->bh", reader, result))
        biases = biases + (reader * (cache["attn_out", l] - result.sum(2))).sum((1, 2))
        mlps.append((reader * cache["mlp_out", l]).sum((1, 2)))
        mha = block.attn.mha
        w_o = mha.proj.weight.view(mha.proj.weight.shape[0], mha.heads, -1)  # (D, H, d)
        patterns.append(cache["pattern", l])
        values.append(torch.einsum("bnhd,Dhd->bnhD", cache["v", l], w_o) * gamma)
    z0 = cache["resid_pre", 0]
    embedded = (reader * z0).sum((1, 2))
    if getattr(model.patch_embed, "norm_pre", None) is None and not model.training:
        pos = cache["hook_pos_embed"]
        positions = (reader[:, -pos.shape[1] :] * pos).sum((1, 2))
        parts = {"patch and prefix tokens": embedded - positions, "position embeddings": positions, **parts}
    else:
        parts = {"embeddings (after the pre-norm)": embedded, **parts}
    parts["attention output biases"] = biases
    rest = sum(parts.values())
    decomposition = Decomposition(
        total, torch.stack(heads, 1), torch.stack(mlps, 1), rest, parts, score.layout,
        _reader=reader, _patterns=tuple(patterns), _values=tuple(values),
    )  # fmt: skip
    if by_source:
        object.__setattr__(decomposition, "by_source", decomposition.all_sources())
    return decomposition


def decompose_memory(config: Any, b: int) -> int:
    """The bytes :func:`decompose` with ``by_source`` (and :func:`logit_lens` after it) works in on ``b`` images of
    ``config``'s size (a :class:`~vit_einops.network.config.ViTConfig`): its pass, and beside it every layer's
    cached sites, float32: each head's result and its values through W_O (b n H D each), the branch outputs
    (b n D, two), the attention pattern (b H n^2) and v (b n D); the sources' einsum works on one layer's b H n D."""
    n, depth, heads, dim = config.num_tokens, config.depth, config.heads, config.dim
    cached = depth * b * (2 * n * heads * dim + 3 * n * dim + heads * n * n) + b * heads * n * dim
    return forward_bytes(config, b) + 4 * cached


def decomposition_bytes(config: Any, b: int) -> int:
    """The bytes a study keeps of a decomposition (:meth:`Decomposition.numbers`) and its logit lens, float32:
    the sources (b L H n), the heads' shares (b L H), the MLPs' and the lens (b L each) and a few (b,) numbers."""
    depth, heads = config.depth, config.heads
    return 4 * b * (depth * heads * (config.num_tokens + 1) + 2 * depth + 16)


# -- the logit lens -----------------------------------------------------------------------------------------


@_in_eval
def logit_lens(model: nn.Module, images: Any, target: Any = None, *, preprocessed: bool | None = None) -> torch.Tensor:
    """(b, L + 1): the score each layer's residual stream would give if the model stopped there, the final norm and
    head applied to it: index 0 the embeddings z_0, index l the output of block l - 1, index L the model's score."""
    x, target = _batch(model, images, target, preprocessed, "the logit lens")
    depth = len(model.blocks)
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.hook_resid_post" for l in range(depth)]
    output, cache = model.run_with_cache(x, names)
    score = _scored(model, x, target, "the logit lens", output)  # the class from this pass's logits
    return torch.stack([score(model, cache[name]) for name in names], dim=1)


# -- ablation and patching ----------------------------------------------------------------------------------


def _head_sets(model: nn.Module, heads: Any) -> list[list[tuple[int, int]]]:
    """``heads``: a (layer, head) pair, or a list whose entries are pairs (each ablated alone) or lists of pairs
    (ablated together) -> a list of sets of checked pairs."""
    depth, count = len(model.blocks), model.blocks[0].attn.mha.heads

    def pair(entry: Any) -> tuple[int, int]:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise TypeError(f"a head is a (layer, head) pair, got {entry!r:.60}")
        return check_int("layer", entry[0], 0, depth - 1), check_int("head", entry[1], 0, count - 1)

    def is_pair(entry: Any) -> bool:
        return isinstance(entry, tuple) and len(entry) == 2 and not isinstance(entry[0], (tuple, list))

    if is_pair(heads):
        heads = [heads]
    if not isinstance(heads, (list, tuple)) or not heads:
        raise ValueError(f"heads names no head: expected (layer, head) pairs or lists of them, got {heads!r:.60}")
    sets = []
    for entry in heads:
        chosen = [pair(entry)] if is_pair(entry) or not isinstance(entry, (list, tuple)) else [pair(p) for p in entry]
        if not chosen:
            raise ValueError("heads holds an empty set of heads; each set names at least one (layer, head)")
        sets.append(chosen)
    return sets


def _replacing(values: dict[int, torch.Tensor], heads: list[tuple[int, int]]) -> list:
    """fwd_hooks replacing hook_z's head h of layer l by ``values[l][..., h, :]``."""
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)

    def hook_for(l: int, hs: list[int]):
        def replace(z: torch.Tensor, hook: Any) -> torch.Tensor:
            z = z.clone()
            z[:, :, hs] = values[l][:, :, hs].expand_as(z[:, :, hs])
            return z

        return (f"blocks.{l}.attn.hook_z", replace)

    return [hook_for(l, hs) for l, hs in by_layer.items()]


def _check_passes(passes: int, what: str) -> int:
    return check_int(f"the forward passes {what} would run", passes, 1, MAX_PASSES)


def _bar(total: int):
    """A tqdm bar on a tty's stderr from BAR_FROM passes, else None."""
    if total < BAR_FROM or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="patching", unit="pass", file=sys.stderr, dynamic_ncols=True)


@_in_eval
def ablate_heads(
    model: nn.Module, images: Any, heads: Any, mode: str = "mean", reference: Any = None, target: Any = None,
    *, preprocessed: bool | None = None,
) -> torch.Tensor:
    """(len(sets), b): the change of the target's score when each set of ``heads`` is ablated, its A v (hook_z,
    so its output projection's input) replaced by zeros (``mode="zero"``) or by its mean over the ``reference``
    images (``"mean"``, Gandelsman et al.; the batch itself by default), token by token.

    ``heads``: a (layer, head) pair, or a list whose entries are pairs (each ablated alone) or lists of pairs
    (ablated together)."""
    mode = check_choice("mode", mode, ABLATIONS)
    sets = _head_sets(model, heads)
    x, score = _prepare(model, images, target, preprocessed, "ablate_heads")
    _check_passes(len(sets) + 2, "ablate_heads")
    depth = len(model.blocks)
    names = [f"blocks.{l}.attn.hook_z" for l in range(depth)]
    if mode == "zero":
        means = None
    else:
        ref = x if reference is None else model_inputs(model, reference, preprocessed=preprocessed)
        if ref.shape[1:] != x.shape[1:]:
            raise ValueError(f"reference images of shape {tuple(ref.shape[1:])} for images {tuple(x.shape[1:])}")
        check_model_forward(model, ref, grad=False)
        _, cache = model.run_with_cache(ref, names)
        means = {l: cache[name].mean(dim=0, keepdim=True) for l, name in enumerate(names)}
    clean = score(model, _final(model, x))
    changes = []
    for chosen in sets:
        follow_free_cores()
        values = means if means is not None else {l: _zeros(model, x) for l, _ in chosen}
        hooks = _replacing(values, chosen)
        changes.append(score(model, _final(model, x, hooks)) - clean)
    return torch.stack(changes)


def _zeros(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    mha = model.blocks[0].attn.mha
    return x.new_zeros(1, 1, mha.heads, mha.dim // mha.heads)


def _final(model: nn.Module, x: torch.Tensor, hooks: Sequence = ()) -> torch.Tensor:
    """z_L of ``x``, with ``hooks`` attached."""
    depth = len(model.blocks)
    seen: dict[str, torch.Tensor] = {}

    def keep(value: torch.Tensor, hook: Any) -> None:
        seen["z"] = value

    model.run_with_hooks(x, [*hooks, (f"blocks.{depth - 1}.hook_resid_post", keep)])
    return seen["z"]


def _clean_and_corrupted(model, clean, corrupted, target, preprocessed, who):
    x, score = _prepare(model, clean, target, preprocessed, who)
    y = model_inputs(model, corrupted, preprocessed=preprocessed)
    if y.shape != x.shape:
        raise ValueError(f"{who}: the corrupted images have shape {tuple(y.shape)}, the clean ones {tuple(x.shape)}")
    return x, y, score


def patch_passes(model: nn.Module, what: str = "heads", tokens: int | None = None) -> int:
    """The forward passes :func:`patch_heads` (``what="heads"``) or :func:`patch_positions` (``"positions"``, with
    ``tokens`` tokens, the model's own by default) runs: two clean and corrupted runs, then one per head or per
    layer and token."""
    check_choice("what", what, ("heads", "positions"))
    depth = len(model.blocks)
    if what == "heads":
        return 2 + depth * model.blocks[0].attn.mha.heads
    layout = model.patch_embed.layout()
    return 2 + depth * (layout.num_prefix + layout.num_patches if tokens is None else tokens)


def _patched_scores(model, y, jobs: list, score: _Score, passes: int) -> torch.Tensor:
    """The corrupted batch's summed score under each job's hooks, one pass each, with a bar on a tty."""
    bar = _bar(passes)
    out = []
    try:
        for hooks in jobs:
            follow_free_cores()  # a command's thread policy, between passes (nothing without one)
            out.append(score(model, _final(model, y, hooks)).sum())
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return torch.stack(out)


def _restored(patched: torch.Tensor, low: torch.Tensor, high: torch.Tensor, who: str) -> torch.Tensor:
    gap = (high - low).sum()
    if gap == 0:
        raise ValueError(
            f"{who}: the clean and corrupted images give the same score, so the share restored is undefined "
            f"(0 / 0); give corrupted images whose score differs"
        )
    return (patched - low.sum()) / gap


@_in_eval
def patch_heads(
    model: nn.Module, clean: Any, corrupted: Any, target: Any = None, *, preprocessed: bool | None = None
) -> torch.Tensor:
    """(L, H): the share of the clean-to-corrupted score difference (summed over the batch) that copying one head's
    A v (hook_z) from the clean run into the corrupted one restores: 1 restores it all, 0 nothing. The target
    (None: the predicted class) is decided on the clean images. Runs :func:`patch_passes` forward passes."""
    x, y, score = _clean_and_corrupted(model, clean, corrupted, target, preprocessed, "patch_heads")
    passes = _check_passes(patch_passes(model, "heads"), "patch_heads")
    check_model_forward(model, y, grad=False)
    depth, count = len(model.blocks), model.blocks[0].attn.mha.heads
    names = [f"blocks.{l}.attn.hook_z" for l in range(depth)]
    _, cache = model.run_with_cache(x, names)
    high, low = score(model, _final(model, x)), score(model, _final(model, y))
    values = {l: cache[name] for l, name in enumerate(names)}
    jobs = [_replacing(values, [(l, h)]) for l in range(depth) for h in range(count)]
    out = _patched_scores(model, y, jobs, score, passes).view(depth, count)
    return _restored(out, low, high, "patch_heads")


@_in_eval
def patch_positions(
    model: nn.Module, clean: Any, corrupted: Any, target: Any = None, *, preprocessed: bool | None = None
) -> torch.Tensor:
    """(L, n): as :func:`patch_heads`, copying the residual stream entering block l (hook_resid_pre) at one token."""
    x, y, score = _clean_and_corrupted(model, clean, corrupted, target, preprocessed, "patch_positions")
    depth = len(model.blocks)
    names = [f"blocks.{l}.hook_resid_pre" for l in range(depth)]
    _, cache = model.run_with_cache(x, names)
    tokens = cache[names[0]].shape[1]
    passes = _check_passes(patch_passes(model, "positions", tokens), "patch_positions")
    check_model_forward(model, y, grad=False)
    high, low = score(model, _final(model, x)), score(model, _final(model, y))

    def patch(l: int, i: int):
        def replace(z: torch.Tensor, hook: Any) -> torch.Tensor:
            z = z.clone()
            z[:, i] = cache[names[l]][:, i]
            return z

        return [(names[l], replace)]

    jobs = [patch(l, i) for l in range(depth) for i in range(tokens)]
    out = _patched_scores(model, y, jobs, score, passes).view(depth, tokens)
    return _restored(out, low, high, "patch_positions")
