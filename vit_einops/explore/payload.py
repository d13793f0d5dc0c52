"""The numbers an explorer page carries: computed with vit_einops.inspect, quantised, and packed for JSON.

The page holds one pane per model (:func:`build_payload`; two models are shown side by side on the same images)
and what the panes share (:func:`page_payload`). A pane carries the token layout of the input it ran on
(``layout``: its prefix tokens "cls", "dist", "reg1", ... and its patch grid, as
:class:`~vit_einops.network.patch_embed.TokenLayout` has them): maps over the image show the patches, the prefix tokens are
listed beside them with their share of each row (``head_statistics`` gives the patches' mean share per layer and
head). DINO's view (:func:`dino_pane`, from the study's :func:`~vit_einops.inspect.dino_view`, the one the report
draws at its default layer) is the last layer's class-token attention over the patches per head, with the mask that
keeps 60% of its mass (:func:`dino_mask`), computed from the recorded attention before it is quantised.

Sizes: ViT-B/16 at 224 px records 12 layers x 12 heads x 197 x 197 = 5.6 million attention weights per image.
Each row of A (one query, all keys) is stored as integers of ``bits`` bits (8 by default, L = 2^bits - 1
levels) scaled by the row's own maximum,

    q_ij = round(L * A_ij / max_j A_ij),    A_ij ~ q_ij * max_j A_ij / L,

so every weight is within half a step, ``max_j A_ij / (2 L)`` (1/510 of the row maximum at 8 bits), of the
recorded value; the page shows that bound beside each weight. A pane keeps the rows that fit its budget of codes
(:func:`attention_rows`): every row of every head; else the mean of the heads for every query, quantised on its
own row maxima the same way, beside each head's rows of the prefix tokens; else those prefix rows alone. Its
``left_out`` says in words what it did not keep. Fewer bits make a smaller page: the compressed
size follows the codes' entropy, and near-uniform rows (an untrained model) are the costly case (a random-weight
ViT-B/16 on 2 photos: 13.0 MB at 8 bits, 8.6 MB at 6, 4.9 MB at 4). The row maxima are kept exactly (float32).
Rollout and relevance (one n x n matrix per image and class), and each explanation method's map on the patch grid
(one per method of :data:`~vit_einops.inspect.METHODS` and image, labelled with the method's parameters; the gradient
methods explain the target when one is given, else the top class, and are absent for a model without a classifier
and no target, ``methods_note`` saying why) are stored as float16 after division by a power of two that brings
their largest magnitude into (1/2, 1]: a relative error of at most 2^-11, or 2^-25 of that power of two for values too small for a normal
float16. Every binary array is compressed with zlib (the page inflates it with the browser's own
DecompressionStream) and written as base64.

The decomposition view (:func:`~vit_einops.inspect.decompose`, computed once in the study run) splits the score the
gradient methods explain (the target, else each image's top class) into each head's and MLP's direct share and the
rest, with the logit lens beside it; those numbers are stored exactly (float32 values as JSON numbers), each head's
share by source token as float16 like the methods' maps. A model without a classifier and no target has no score
to decompose: its images' ``decomposition`` is null and ``decomposition_note`` says why.

Every number is finite: non-finite logits, maps, norms or relevance (a model with nan, inf or huge weights) are a
ValueError naming the array, never a page of nan. The undefined statistics are written as null: the mean
attention distance of a head that sends no attention between patches (it attends only to the prefix tokens),
beside its patch mass 0, and the mass DINO's mask keeps where the class token puts none on the patches. A class
whose relevance is exactly the identity (its logit gives no gradient, e.g. a zero-initialised head) is flagged
``relevance_identity`` so the page can say why its map is blank.

A model without a classifier (``num_classes`` 0: its output is pooled features; or an embedding projection, CLIP's:
``ViTConfig.embedding``) lists no classes: ``top`` is empty.
Relevance is then for the ``target`` given (:mod:`vit_einops.inspect.targets`), one entry per image with its score,
or absent (null) without one; a classifier's page adds the target's entry beside its classes.

The final tokens (``forward_features``, b n D) are stored as float16 after the same division by a power of two, for
the similarity view's cosines: each element is within 2^-11 of itself relatively (and subnormals within 2^-25 of
the scale, at most max|z|), so each token moves by at most about 2^-11 of its norm and the cosine of two by at most
twice that, within ``COSINE_BOUND`` = 2^-9 with room for the subnormals and the browser's float64 sums.

Every array is computed from one study (:func:`~vit_einops.inspect.run_study`, the one ``vit-einops inspect``
draws: its recorded pass, rollout, DINO view, patch PCA and target's relevance); the float64 work (the statistics,
the heads' mean, the quantisation) runs one layer at a time, so its memory is one layer's maps, not all.

The patch PCA view (DINOv2's picture, :func:`~vit_einops.inspect.patch_feature_pca` with its defaults) is fitted
on each pane's own tokens, jointly over the page's images; each image carries its ``rgb`` (gh, gw, 3) as uint8,
``round(255 c)`` (to nearest, ties to even: within 1/510 of the colour c in [0, 1]), written as a PNG of one
pixel per patch (a 37 x 37 grid is 4.1 KB of codes before compression).
"""

from __future__ import annotations

import base64
import io
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..base.checks import check_int
from ..inspect import (
    DINO_KEEP,
    METHODS,
    DinoView,
    attention_relevance,
    dino_mask,
    head_statistics,
    patch_distances,
    run_study,
)
from ..inspect.methods import TARGET_NEEDED, unexplained
from ..inspect.recorded import study_memory
from ..inspect.targets import check_study_target, has_classifier, target_name
from ..network.patch_embed import TokenLayout
from ..network.config import ViTConfig
from ..prediction import check_finite_outputs, class_name

DEFAULT_BITS = 8
# The bytes of attention codes a pane may hold (one per stored weight, before compression): every row of every head
# of ViT-B/16 at 224 px for 4 images (22 MB); at DINOv2's 518 px (1,374 tokens) one image's mean of heads (23 MB).
DEFAULT_ATTENTION_BUDGET = 24_000_000
HALF_RELATIVE = 2.0**-11  # float16: 10 stored mantissa bits, rounding to nearest
HALF_SUBNORMAL = 2.0**-25  # half the spacing of float16's subnormals (2^-24), relative to the stored scale
# How far a cosine of two float16-stored tokens may be from the recorded tokens' (module docstring).
COSINE_BOUND = 2.0**-9


def pack(array: np.ndarray) -> str:
    """Little-endian bytes of ``array``, zlib-compressed (level 6: within 1% of level 9's size at a third of its time
    on attention codes), base64 text."""
    data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def check_bits(bits: Any) -> int:
    """Bits per stored attention weight: 2 to 8, each code one uint8."""
    return check_int("bits", bits, 2, 8)


def quantise_rows(maps: np.ndarray, bits: int = DEFAULT_BITS) -> tuple[np.ndarray, np.ndarray]:
    """Rows of A (..., n) -> (uint8 codes (..., n) in 0..2^bits-1, row maxima (...) float32); see the module
    docstring."""
    levels = 2 ** check_bits(bits) - 1
    rowmax = maps.max(axis=-1).astype(np.float32)
    if (rowmax <= 0).any():
        raise ValueError("an attention row has no positive weight; rows of A must be softmax distributions")
    codes = np.rint(maps / rowmax.astype(np.float64)[..., None] * levels)
    return codes.clip(0, levels).astype(np.uint8), rowmax


def to_half(matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """(values float16, scale): ``matrix ~ values * scale`` with scale a power of two (an exact division)."""
    peak = float(np.abs(matrix).max()) if matrix.size else 0.0
    if not math.isfinite(peak):
        raise ValueError("cannot store a matrix with non-finite values")
    scale = 2.0 ** math.ceil(math.log2(peak)) if peak > 0 else 1.0
    return (matrix / scale).astype(np.float16), scale


def png_base64(picture: np.ndarray) -> str:
    """(H, W) or (H, W, 3) uint8 -> PNG as base64 text."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def pca_colours(rgb: torch.Tensor) -> np.ndarray:
    """PCA colours in [0, 1] (..., 3) -> uint8 codes round(255 c), each within 1/510 of c."""
    return np.rint(rgb.detach().double().cpu().numpy() * 255).astype(np.uint8)


def _as_list(t: torch.Tensor, digits: int = 6) -> Any:
    """Rounded numbers as nested lists, nan as None (JSON's null; the page says why a value is missing)."""
    values = np.round(t.detach().double().cpu().numpy(), digits)
    return np.where(np.isnan(values), None, values).tolist()


def relevance_is_identity(relevance: torch.Tensor) -> bool:
    """True when R = I exactly: no head's (dy/dA * A)+ is non-zero, so every row is its own token alone (the
    class's logit does not depend on attention, e.g. a zero-initialised classification head gives dy/dA = 0)."""
    return bool(torch.equal(relevance, torch.eye(relevance.shape[-1], dtype=relevance.dtype, device=relevance.device)))


def dino_pane(view: DinoView | None) -> dict[str, Any] | None:
    """What a pane keeps of the study's DINO view (``Study.dino``, :func:`~vit_einops.inspect.dino_view`): each
    head's mask and, beside them, the mask of the heads' mean, with the share of the row's mass each mask holds:
    {"masks" (b, h + 1, patches) bool, "kept" (b, h + 1)}, the last entry the mean of heads. A row with no weight on
    any patch (the class token reads only prefix tokens) has no mask: all False, ``kept`` nan. None where the study
    has no view (a model with no class token)."""
    if view is None:
        return None
    rows = view.attention.double().flatten(-2)  # (b, h, patches)
    mean = rows.mean(dim=1, keepdim=True)
    rows = torch.cat([rows, mean], dim=1)
    masks = torch.cat([view.mask.flatten(-2), dino_mask(mean)], dim=1)  # all False where a row has no patch weight
    total = rows.sum(dim=-1)
    some = total > 0
    kept = torch.where(some, (rows * masks).sum(dim=-1) / torch.where(some, total, 1.0), torch.nan)
    return {"masks": masks, "kept": kept}


def _relevance_entry(relevance: torch.Tensor, **fields: Any) -> dict[str, Any]:
    """One map of R (n, n) as the page stores it, beside what names it."""
    rel16, rel_scale = to_half(relevance.detach().double().cpu().numpy())
    return {
        **fields,
        "relevance": pack(rel16),
        "relevance_scale": rel_scale,
        "relevance_identity": relevance_is_identity(relevance),
    }


def _method_entry(grid: torch.Tensor) -> dict[str, Any]:
    """One method's map (gh, gw) as the page stores it: float16 after a power-of-two scale (:func:`to_half`)."""
    values, scale = to_half(grid.detach().double().cpu().numpy())
    return {"map": pack(values), "scale": scale}


def decomposition_entry(decomposed: Any, image: int) -> dict[str, Any]:
    """One image's decomposition (:func:`~vit_einops.inspect.study.study_decomposition`) as the page stores it: the
    total, each head's (L x H) and MLP's (L) share, the rest and its named parts, and the logit lens (L + 1) as
    numbers (float64 from float32, exact); each head's share by source token (L, H, n) as float16 after a
    power-of-two scale (:func:`to_half`)."""
    d = decomposed.decomposition
    sources, scale = to_half(d.by_source[image].detach().double().cpu().numpy())
    return {
        "total": float(d.total[image]),
        "heads": d.heads[image].double().tolist(),
        "mlps": d.mlps[image].double().tolist(),
        "rest": float(d.rest[image]),
        "parts": [[name, float(value[image])] for name, value in d.parts.items()],
        "lens": decomposed.lens[image].double().tolist(),
        "sources": pack(sources),
        "sources_scale": scale,
    }


def attention_rows(b: int, depth: int, heads: int, n: int, prefix: int, budget: int) -> tuple[int, bool]:
    """Which rows of A a pane stores, its codes (one byte each) within ``budget`` bytes: (Q, mean) where each
    head's rows of the first Q queries are kept (n: every query; ``prefix``: the prefix tokens' rows alone) and
    ``mean`` says whether the mean of the heads is kept for every query. Every row of every head where it fits,
    else the mean of heads for every query beside each head's prefix rows, else the prefix rows alone (kept
    whatever the budget: b l h P n codes, a few hundred KB at 1,374 tokens)."""
    if b * depth * heads * n * n <= budget:
        return n, False
    if b * depth * (heads * prefix * n + n * n) <= budget:
        return prefix, True
    return prefix, False


def pane_memory(config: ViTConfig, b: int, *, classes: int, target: bool, budget: int) -> tuple[int, int]:
    """(the memory :func:`build_payload` works in, the bytes of the pane it keeps for the page) for a model of
    ``config`` (its ``image_size`` the inputs') on ``b`` images with relevance for ``classes`` classes and a
    ``target`` or not, from the sizes alone.

    Working: its study's (:func:`~vit_einops.inspect.recorded.study_memory`) with, beside the study's recorded
    float32 maps, the pane's own float64 work (the copies of one layer at a time, the heads' mean of every layer,
    l b n^2) and the classes' relevance.
    Kept: the pane's stored arrays (:func:`attention_rows`, float16 rollout, relevance, tokens and, where there is
    something to explain, the decomposition's sources, b L H n) as base64 text, 4/3 of their bytes (compression only
    shrinks them), and the decomposition's numbers as JSON text (b (L H + 2 L + 16) numbers, 25 characters each)."""
    n, depth, heads = config.num_tokens, config.depth, config.heads
    beside = 6 * b * heads * n * n * 8 + depth * b * n * n * 8
    work = study_memory(config, b, target=target, beside_maps=beside, classes=classes)
    queries, mean = attention_rows(b, depth, heads, n, config.num_prefix_tokens, budget)
    stored = b * depth * (heads * queries * n + (n * n if mean else 0)) + b * n * n * 2 * (1 + classes + int(target))
    stored += b * n * config.dim * 2
    explained = bool(classes or target)  # the decomposition is the gradient methods' score: absent where they are
    stored += explained * b * depth * heads * n * 2
    numbers = explained * b * (depth * heads + 2 * depth + 16) * 25
    return work, stored * 4 // 3 + numbers


def _left_out(b: int, depth: int, heads: int, n: int, prefix: int, queries: int, mean: bool, budget: int) -> list[str]:
    """What a pane's attention leaves out (:func:`attention_rows`), in words for the page; empty when nothing."""
    if queries == n:
        return []
    full = b * depth * heads * n * n
    over = f"every head's row of every query would be {full / 1e6:.1f} MB of codes, over the budget of "
    over += f"{budget / 1e6:.1f} MB"
    kept = "no head's rows (there are no prefix tokens)"
    if prefix:
        kept = f"each head's rows of the {prefix} prefix token{'s' * (prefix > 1)}"
    notes = [f"left out: each head's attention rows of the {n - prefix:,} patch queries ({over}); kept: {kept}"]
    if mean:
        notes[0] += ", and the mean of the heads' rows for every query"
    else:
        notes.append("left out: the mean of the heads' rows of the patch queries (it does not fit the budget either)")
    return notes


def _pack_rows(maps: torch.Tensor, queries: int, bits: int) -> tuple[str, str]:
    """Rows of A (l, h, n, n) of one image: the first ``queries`` rows of every layer and head quantised
    (:func:`quantise_rows`), one layer at a time in float64; packed (codes, row maxima)."""
    codes = np.empty((*maps.shape[:2], queries, maps.shape[-1]), dtype=np.uint8)
    rowmax = np.empty(codes.shape[:-1], dtype=np.float32)
    for layer in range(len(maps)):
        codes[layer], rowmax[layer] = quantise_rows(maps[layer, :, :queries].double().numpy(), bits)
    return pack(codes), pack(rowmax)


def _pack_mean(fused: torch.Tensor, bits: int) -> tuple[str, str]:
    """The mean of the heads' rows of one image, (l, n, n) float64, quantised as the rows are; packed."""
    codes, rowmax = quantise_rows(fused.numpy(), bits)
    return pack(codes), pack(rowmax)


def _by_layer(maps: torch.Tensor, layout: TokenLayout, patch_size: tuple[int, int]) -> dict[str, torch.Tensor]:
    """:func:`head_statistics` and the mean of the heads of maps (l, b, h, n, n), one layer at a time in float64:
    the float64 copy of one layer's maps, never of all."""
    stats, fused = [], []
    for layer in maps:
        layer = layer.double()[None]
        stats.append(head_statistics(layer, layout, patch_size))
        fused.append(layer.mean(dim=2))
    out = {key: torch.cat([s[key] for s in stats]) for key in stats[0]}
    out["fused"] = torch.cat(fused)  # (l, b, n, n)
    return out


def build_payload(
    model: torch.nn.Module,
    images: torch.Tensor,
    *,
    name: str,
    class_names: Sequence[str] | None,
    pictures: Sequence[np.ndarray],
    top_k: int,
    bits: int = DEFAULT_BITS,
    target: Any = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    attention_budget: int = DEFAULT_ATTENTION_BUDGET,
) -> dict[str, Any]:
    """Everything one pane of the page draws, for ``model`` (in eval mode) on ``images`` (b, C, H, W); see the
    module docstring. ``method_params``: the explanation methods' parameters by name (the rollout and relevance
    views use the "rollout" and "relevance" methods' too). The model runs once for the attention, the token norms,
    the PCA and the tokens of the similarity view (:func:`~vit_einops.inspect.recorded.record_pass`), and again
    with gradients where there is relevance to compute (and in the explanation methods).

    Layers, heads, tokens and classes are numbered from 0. The tokens are those of the input's ``layout``: the
    prefix tokens in token order, then the patches of the input's grid in row-major order.
    """
    weights = "check the model's weights (non-finite or huge values); the explorer shows recorded numbers only"
    check_study_target("the explorer", target)
    method_params = dict(method_params or {})

    def check(run: Any) -> None:
        check_finite_outputs("model's logits", run.output, weights)
        check_finite_outputs("attention maps", run.maps, weights)  # (l, b, h, n, n)
        check_finite_outputs("token norms", run.norms, weights)  # (l, b, n)
        check_finite_outputs("final tokens", run.tokens, weights)

    # Every method on the grid; the gradient ones explain the target, else the top class. DINO's view is the last
    # layer's (the study's default), as the page draws it.
    study = run_study(model, images, target, method_params, check)
    method_maps, run, rollout, pca = study.methods, study.run, study.rollout, study.pca
    decomposed = study.decomposition
    logits, maps, layout, norms = run.output, run.maps, run.layout, run.norms
    depth, b, heads, n, _ = maps.shape
    classifier = has_classifier(model)  # not pooled features, not an embedding projection (CLIP's)
    k = min(top_k, logits.shape[-1]) if classifier else 0
    start_layer = METHODS["relevance"].resolve(method_params.get("relevance", {}))["start_layer"]
    if classifier:
        top = logits.double().softmax(dim=-1).topk(k, dim=-1)
        relevance = attention_relevance(model, images, top.indices, preprocessed=True, start_layer=start_layer)
        check_finite_outputs("relevance maps", relevance, f"the gradients overflowed; {weights}")
    patch_size = tuple(model.config.patch_size)
    stats = _by_layer(maps, layout, patch_size)  # each (l, b, h), prefix_share (.., p), fused (l, b, n, n)
    fused = stats.pop("fused")  # (l, b, n, n), float64
    dino = dino_pane(study.dino)
    pca_codes = pca_colours(pca.rgb)  # (b, gh, gw, 3)
    queries, mean = attention_rows(b, depth, heads, n, layout.num_prefix, attention_budget)

    pages = []
    for i in range(b):
        codes, rowmax = _pack_rows(maps[:, i], queries, bits)  # (l, h, queries, n), (l, h, queries)
        mean_codes, mean_rowmax = _pack_mean(fused[:, i], bits) if mean else (None, None)
        rollout16, rollout_scale = to_half(rollout[i].detach().cpu().numpy())
        tokens16, tokens_scale = to_half(run.tokens[i].detach().double().cpu().numpy())
        classes = [
            _relevance_entry(
                relevance[i, c],
                index=int(top.indices[i, c]),
                name=class_name(int(top.indices[i, c]), class_names),
                probability=float(top.values[i, c]),
                logit=float(logits[i, top.indices[i, c]]),
            )
            for c in range(k)
        ]
        chosen = None
        if study.target is not None:
            relevance_i, score = study.target.relevance[i], float(study.target.scores[i])
            chosen = _relevance_entry(relevance_i, name=target_name(target), score=score)
        pages.append(
            {
                "png": png_base64(pictures[i]),
                "pca": png_base64(pca_codes[i]),
                "attention": codes,
                "attention_rowmax": rowmax,
                "attention_mean": mean_codes,
                "attention_mean_rowmax": mean_rowmax,
                "rollout": pack(rollout16),
                "rollout_scale": rollout_scale,
                "methods": [_method_entry(grid[i]) for grid in method_maps.values()],
                "tokens": pack(tokens16),
                "tokens_scale": tokens_scale,
                "top": classes,
                "target": chosen,
                "stats": {
                    "distance": _as_list(stats["distance"][:, i]),
                    "patch_mass": _as_list(stats["patch_mass"][:, i]),
                    "entropy": _as_list(stats["entropy"][:, i]),
                    "prefix_share": _as_list(stats["prefix_share"][:, i]),
                    "norms": _as_list(norms[:, i], 4),
                },
                "dino": None
                if dino is None
                else {"masks": dino["masks"][i].int().tolist(), "kept": _as_list(dino["kept"][i])},
                "decomposition": None if decomposed is None else decomposition_entry(decomposed, i),
            }
        )
    return {
        "name": name,
        "classifier": classifier,
        "depth": depth,
        "heads": heads,
        "layout": {"prefix": list(layout.prefix), "grid": list(layout.grid)},
        "patch": list(patch_size),
        "input_size": list(images.shape[-2:]),
        "in_channels": int(images.shape[-3]),
        "token_dim": int(run.tokens.shape[-1]),
        "attention_queries": queries,
        "attention_budget": attention_budget,
        "left_out": _left_out(b, depth, heads, n, layout.num_prefix, queries, mean, attention_budget),
        "uniform_entropy": math.log(n),
        "uniform_distance": patch_distances(layout.grid, patch_size).mean().item(),
        "dino_keep": DINO_KEEP,
        "pca_explained": _as_list(pca.explained_variance_ratio[:3]),
        "methods": [
            {"name": name, "label": METHODS[name].label(method_params.get(name), every=True),
             "reference": METHODS[name].reference, "gradient": METHODS[name].gradient}
            for name in method_maps
        ],  # fmt: skip
        "methods_note": _methods_note(model, target),
        # Absent where the gradient methods are, for their reason: without a classifier or a target, no score.
        "decomposition_note": "" if decomposed else f"the decomposition is not on this page; it would {TARGET_NEEDED}",
        "images": pages,
    }


def _methods_note(model: Any, target: Any) -> str:
    """Why the page holds no gradient method (:func:`~vit_einops.inspect.methods.unexplained`), or ""."""
    left_out = unexplained(model, target)
    return f"{', '.join(left_out)}: not on this page; they {TARGET_NEEDED}" if left_out else ""


def page_payload(panes: Sequence[dict[str, Any]], titles: Sequence[str], bits: int) -> dict[str, Any]:
    """The page's JSON: one or two panes (:func:`build_payload`, one per model) of the same images, and what
    they share (the image titles, the stated precision)."""
    return {
        "format": 2,
        "titles": list(titles),
        "attention_bits": bits,
        "attention_levels": 2**bits - 1,
        "half_relative": HALF_RELATIVE,
        "half_subnormal": HALF_SUBNORMAL,
        "cosine_bound": COSINE_BOUND,
        "panes": list(panes),
    }
