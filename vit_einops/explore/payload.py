"""The numbers an explorer page carries: computed with vit_einops.inspect, quantised, and packed for JSON.

The page holds one pane per model (:func:`build_payload`; two models are shown side by side on the same images)
and what the panes share (:func:`page_payload`). A pane carries the token layout of the input it ran on
(``layout``: its prefix tokens "cls", "dist", "reg1", ... and its patch grid, as
:class:`~vit_einops.network.patch_embed.TokenLayout` has them): maps over the image show the patches, the prefix tokens are
listed beside them with their share of each row (``head_statistics`` gives the patches' mean share per layer and
head). DINO's view (:func:`dino_view`) is the last layer's class-token attention over the patches per head, with the
mask that keeps 60% of its mass (:func:`dino_mask`), computed from the recorded attention before it is quantised.

Sizes: ViT-B/16 at 224 px records 12 layers x 12 heads x 197 x 197 = 5.6 million attention weights per image.
Each row of A (one query, all keys) is stored as integers of ``bits`` bits (8 by default, L = 2^bits - 1
levels) scaled by the row's own maximum,

    q_ij = round(L * A_ij / max_j A_ij),    A_ij ~ q_ij * max_j A_ij / L,

so every weight is within half a step, ``max_j A_ij / (2 L)`` (1/510 of the row maximum at 8 bits), of the
recorded value; the page shows that bound beside each weight. Fewer bits make a smaller page: the compressed
size follows the codes' entropy, and near-uniform rows (an untrained model) are the costly case (a random-weight
ViT-B/16 on 2 photos: 13.0 MB at 8 bits, 8.6 MB at 6, 4.9 MB at 4). The row maxima are kept exactly (float32).
Rollout and relevance (one n x n matrix per image and class), and each explanation method's map on the patch grid
(one per method of :data:`~vit_einops.inspect.METHODS` and image, labelled with the method's parameters; the gradient
methods explain the target when one is given, else the top class, and are absent for a model without a classifier
and no target) are stored as float16 after division by a power of two that brings their largest magnitude into
(1/2, 1]: a relative error of at most 2^-11, or 2^-25 of that power of two for values too small for a normal
float16. Every binary array is compressed with zlib (the page inflates it with the browser's own
DecompressionStream) and written as base64.

Every number is finite: non-finite logits, maps, norms or relevance (a model with nan, inf or huge weights) are a
ValueError naming the array, never a page of nan. The undefined statistics are written as null: the mean
attention distance of a head that sends no attention between patches (it attends only to the prefix tokens),
beside its patch mass 0, and the mass DINO's mask keeps where the class token puts none on the patches. A class
whose relevance is exactly the identity (its logit gives no gradient, e.g. a zero-initialised head) is flagged
``relevance_identity`` so the page can say why its map is blank.

A model without a classifier (``num_classes`` 0: its output is pooled features) lists no classes: ``top`` is empty.
Relevance is then for the ``target`` given (:mod:`vit_einops.inspect.targets`), one entry per image with its score,
or absent (null) without one; a classifier's page adds the target's entry beside its classes.

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

from ..base.checks import check_int_in_range
from ..inspect import (
    DINO_KEEP,
    METHODS,
    attention_gradients,
    attention_relevance,
    attention_rollout,
    class_attention_grid,
    dino_mask,
    explain_all,
    head_statistics,
    patch_distances,
    patch_feature_pca,
    record_attention,
    relevance_from_gradients,
    token_norms,
)
from ..inspect.methods import class_index
from ..inspect.targets import BACKBONE_TARGETS, TARGET_KINDS, target_name
from ..network.patch_embed import ClassToken, TokenLayout
from ..prediction import check_finite_outputs, class_name

DEFAULT_BITS = 8
HALF_RELATIVE = 2.0**-11  # float16: 10 stored mantissa bits, rounding to nearest
HALF_SUBNORMAL = 2.0**-25  # half the spacing of float16's subnormals (2^-24), relative to the stored scale


def pack(array: np.ndarray) -> str:
    """Little-endian bytes of ``array``, zlib-compressed (level 9), base64 text."""
    data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def check_bits(bits: Any) -> int:
    """Bits per stored attention weight: 2 to 8, each code one uint8."""
    return check_int_in_range("bits", bits, 2, 8)


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


def dino_view(maps: torch.Tensor, layout: TokenLayout) -> dict[str, Any] | None:
    """The last layer's class-token attention over the patches, per head and for the mean of the heads, and
    :func:`dino_mask` of each: {"masks" (b, h + 1, patches) bool, "kept" (b, h + 1) the share of the row's mass
    each mask holds}, the last entry the mean of heads. A row with no weight on any patch (the class token reads
    only prefix tokens) has no mask: all False, ``kept`` nan. None for a model with no class token (no "cls" in
    ``layout.prefix``)."""
    if ClassToken.NAME not in layout.prefix:
        return None
    rows = class_attention_grid(maps[-1].double(), layout).flatten(-2)  # (b, h, patches)
    rows = torch.cat([rows, rows.mean(dim=1, keepdim=True)], dim=1)
    total = rows.sum(dim=-1)
    some = total > 0
    masks = dino_mask(rows)  # all False where the row has no weight on the patches
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
) -> dict[str, Any]:
    """Everything one pane of the page draws, for ``model`` (in eval mode) on ``images`` (b, C, H, W); see the
    module docstring. ``method_params``: the explanation methods' parameters by name (the rollout and relevance
    views use the "rollout" and "relevance" methods' too).

    Layers, heads, tokens and classes are numbered from 0. The tokens are those of the input's ``layout``: the
    prefix tokens in token order, then the patches of the input's grid in row-major order.
    """
    weights = "check the model's weights (non-finite or huge values); the explorer shows recorded numbers only"
    # The encoder's layers only (the first len(blocks) Attend modules): an attention-pooling head has one too.
    logits, maps, layout = record_attention(model, images, range(len(model.blocks)), preprocessed=True)
    check_finite_outputs("model's logits", logits, weights)
    check_finite_outputs("attention maps", maps, weights)  # (l, b, h, n, n)
    depth, b, heads, n, _ = maps.shape
    norms = token_norms(model, images).norms  # (l, b, n)
    check_finite_outputs("token norms", norms, weights)
    classifier = model.num_classes > 0
    k = min(top_k, logits.shape[-1]) if classifier else 0
    method_params = dict(method_params or {})
    start_layer = METHODS["relevance"].resolve(method_params.get("relevance", {}))["start_layer"]
    if classifier:
        top = logits.double().softmax(dim=-1).topk(k, dim=-1)
        relevance = attention_relevance(model, images, top.indices, preprocessed=True, start_layer=start_layer)
        check_finite_outputs("relevance maps", relevance, f"the gradients overflowed; {weights}")
    if target is not None:
        if not isinstance(target, BACKBONE_TARGETS):
            raise TypeError(f"the explorer's target is a backbone target ({TARGET_KINDS}), got {target!r:.60}")
        _, target_maps, target_grads, scores = attention_gradients(model, images, target)
        target_relevance = relevance_from_gradients(target_maps, target_grads, start_layer)[0]  # (b, n, n)
        check_finite_outputs("relevance maps", target_relevance, f"the gradients overflowed; {weights}")
    rollout_params = METHODS["rollout"].resolve(method_params.get("rollout", {}))
    rollout = attention_rollout(maps.double(), **rollout_params, kept=class_index(layout))  # (b, n, n)
    # Every method on the grid; the gradient ones explain the target, else the top class.
    method_maps = explain_all(model, images, target, method_params, preprocessed=True)  # {name: (b, gh, gw)}
    check_finite_outputs("explanation maps", torch.stack(list(method_maps.values())), weights)
    patch_size = tuple(model.config.patch_size)
    stats = head_statistics(maps.double(), layout, patch_size)  # each (l, b, h), prefix_share (.., p)
    dino = dino_view(maps, layout)
    pca = patch_feature_pca(model, images, min(3, model.num_features, b * layout.num_patches), preprocessed=True)
    pca_codes = pca_colours(pca.rgb)  # (b, gh, gw, 3)
    maps64 = maps.detach().double().cpu().numpy()

    pages = []
    for i in range(b):
        codes, rowmax = quantise_rows(maps64[:, i], bits)  # (l, h, n, n), (l, h, n)
        rollout16, rollout_scale = to_half(rollout[i].detach().cpu().numpy())
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
        if target is not None:
            chosen = _relevance_entry(target_relevance[i], name=target_name(target), score=float(scores[i, 0]))
        pages.append(
            {
                "png": png_base64(pictures[i]),
                "pca": png_base64(pca_codes[i]),
                "attention": pack(codes),
                "attention_rowmax": pack(rowmax),
                "rollout": pack(rollout16),
                "rollout_scale": rollout_scale,
                "methods": [_method_entry(grid[i]) for grid in method_maps.values()],
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
        "uniform_entropy": math.log(n),
        "uniform_distance": patch_distances(layout.grid, patch_size).mean().item(),
        "dino_keep": DINO_KEEP,
        "pca_explained": _as_list(pca.explained_variance_ratio[:3]),
        "methods": [
            {"name": name, "label": METHODS[name].label(method_params.get(name), every=True),
             "reference": METHODS[name].reference, "gradient": METHODS[name].gradient}
            for name in method_maps
        ],  # fmt: skip
        "images": pages,
    }


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
        "panes": list(panes),
    }
