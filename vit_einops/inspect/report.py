"""Everything `vit-einops inspect` writes for one model: the figures and the raw arrays behind them."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base.io import atomic_write_chunks, staged_directory
from ..base.plot import save_figure
from ..network.config import ViTConfig
from ..network.model import ViT
from ..prediction import check_finite_logits, check_finite_outputs, class_name
from .dino import DINO_KEEP
from .distance import distance_sums, mean_attention_distance, patch_distances, ratio_or_nan
from .embeddings import embedding_filter_components, model_position_similarity
from .figures import (
    plot_attention_distance,
    plot_attention_overlays,
    plot_decomposition,
    plot_filters,
    plot_methods,
    plot_position_similarity,
    plot_prefix_share,
    plot_target_relevance,
    plot_token_norms,
)
from .methods import METHODS, left_out_clauses, unexplained
from .pca import plot_patch_pca
from .record import AttentionRecorder
from .recorded import study_memory
from .rollout import class_attention_grid, patch_attention_grid
from .stats import prefix_token_share
from .study import run_study
from .targets import PatchTarget, check_study_target, target_name

FIGURES = (
    "attention",
    "methods",
    "attention_distance",
    "position_similarity",
    "embedding_filters",
    "prefix_share",
    "token_norms",
    "patch_pca",
)
TARGET_FIGURE = "target"  # drawn only for a backbone target
DECOMPOSITION_FIGURE = "decomposition"  # drawn only where there is a score to decompose (a classifier or a target)
# Everything write_report puts in its folder: the only names a folder it replaces may hold.
REPORT_FILES = frozenset((*(f"{name}.png" for name in (*FIGURES, TARGET_FIGURE, DECOMPOSITION_FIGURE)), "arrays.npz"))
# What arrays.npz holds, by --arrays: every layer's recorded maps (l, b, h, n, n) are most of a full file (562 MB for
# one image at 518 px in DINOv2-S), so they are kept only when asked for; the arrays every figure draws are small.
ARRAYS = {
    "figures": "the arrays the figures draw, without every layer's attention maps",
    "full": "also every layer's attention maps (layers, images, heads, tokens, tokens), float32",
    "none": "no arrays.npz",
}


# An allowance for matplotlib's figures, their rendering and the libraries it loads, beside the arrays; the whole
# estimate against the measured peak is benchmarks/native_size.py's.
FIGURE_BYTES = 256 * 2**20


def attention_maps_bytes(config: ViTConfig, b: int) -> int:
    """The bytes of every layer's float32 attention maps of ``b`` images (l b h n^2): what ``arrays="full"`` adds to
    ``arrays.npz``."""
    return config.depth * b * config.heads * config.num_tokens**2 * 4


def report_memory(config: ViTConfig, b: int, *, target: bool, arrays: str = "figures") -> int:
    """The memory :func:`write_report` works in on ``b`` images of ``config``'s size: its study's
    (:func:`study_memory`) with, beside the study's recorded maps, the report's own float64 work (one layer's
    copies, for the distances and the prefix shares), and at the end ``arrays.npz``'s buffer (with
    ``arrays="full"`` a copy of the maps, and the rest) beside the figures."""
    n, depth, heads = config.num_tokens, config.depth, config.heads
    beside = 4 * b * heads * n * n * 8
    written = 2 * attention_maps_bytes(config, b) * (arrays == "full") + 2 * depth * b * n * n * 4 + FIGURE_BYTES
    return study_memory(config, b, target=target, beside_maps=beside, after=written)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.device == b.device and torch.equal(a, b))


# nan here means "undefined", not overflow: a head whose patches attend only to the class token sends no attention
# between patches, so it has no mean attention distance (see distance_sums). Such heads are common in trained ViTs.
UNDEFINED_WHERE_NAN = ("mean_attention_distance",)


@torch.no_grad()
def write_report(
    model: ViT,
    images: torch.Tensor,
    out_dir: str | Path,
    *,
    distance_images: torch.Tensor | None = None,
    titles: list[str] | None = None,
    classes: Sequence[str] | None = None,
    batch_size: int = 256,
    layer: int = -1,
    display_images: torch.Tensor | None = None,
    overwrite: bool = False,
    target: Any = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    arrays: str = "figures",
) -> dict[str, Path]:
    """Write the inspection figures and ``arrays.npz`` for ``model`` (put in eval mode) under ``out_dir``.

    Args:
        images: (b, C, H, W), the model's inputs drawn with their attention (a handful).
        display_images: the same images as they should be drawn, in [0, 1] (default ``images``): pass them when
            ``images`` are normalised (mean/std), e.g. the preprocessing's resize and crop without normalisation.
        distance_images: the images the mean attention distance averages over (default ``images``); the paper
            averages over many, e.g. a test set.
        titles: one label per drawn image (e.g. "label 3"); a classifier's prediction is added below each.
        classes: the class names of the model's outputs, to name the predictions (default: "class 3").
        layer: the block whose heads' class-token attention is drawn, with DINO's view of it (0 is the first, -1
            the last; the study's ``layer``, :func:`~vit_einops.inspect.run_study`); the figures number layers and
            heads from 0, as this index does.
        overwrite: replace an earlier report in ``out_dir``; without it, a non-empty ``out_dir`` is refused.
        target: a backbone target (:mod:`vit_einops.inspect.targets`): ``arrays.npz`` then also holds its
            relevance ``target_relevance`` (b, n, n), its score ``target_score`` (b,), and for a patch the
            similarity map ``target_similarity`` (b, gh, gw).
        method_params: the explanation methods' parameters by method name (:data:`~vit_einops.inspect.METHODS`;
            the others take their defaults): ``{"rollout": {"head_fusion": "max", "discard_ratio": 0.9}}``. The
            rollout drawn in ``attention.png`` is the "rollout" method's.
        arrays: what ``arrays.npz`` holds (:data:`ARRAYS`): "figures" (the default) the arrays below but
            ``attention``, "full" every one of them, "none" writes no ``arrays.npz``.

    The folder is written as one unit (:func:`vit_einops.base.io.staged_directory`): a kill leaves the whole old report
    or the whole new one. A folder holding any file but a report's is never replaced.

    The tokens before the patches (the input's ``layout.prefix``: class, distillation, register tokens) are
    named: the attention maps show the patches, ``prefix_share.png`` the share of the patches' attention each
    prefix token takes, ``token_norms.png`` the token norms with the prefix tokens marked (the register paper's
    high-norm patches). ``attention.png`` is DINO's Figure 3 at the default (last) layer: each head's class-token
    attention over the patches, the patches holding 60% of it outlined (:func:`~vit_einops.inspect.dino_view`).
    A model without a class token draws the attention each patch receives
    (:func:`~vit_einops.inspect.patch_attention_grid`) instead of the class token's, and no mask.
    ``methods.png`` draws every explanation method of :data:`~vit_einops.inspect.METHODS` over each image, titled
    with its parameters (:func:`~vit_einops.inspect.explain_all`): the gradient methods explain the predicted
    class, or ``target``, and are left out for a model without a classifier and no target (the figure says so and
    names the flags that give one).
    ``patch_pca.png`` is DINOv2's PCA picture: the first three components of one PCA over the drawn images' final
    patch tokens as RGB (:func:`~vit_einops.inspect.patch_feature_pca`).

    ``decomposition.png`` draws the score the gradient methods explain split into each head's and MLP's direct
    share (the L x H grid, the MLPs beside it) and the source maps of the top heads over each image
    (:func:`~vit_einops.inspect.plot_decomposition`, from the study's :func:`~vit_einops.inspect.decompose`); it
    is left out, as those methods are, for a model without a classifier and no target.

    With a ``target``, ``target.png`` draws its relevance over each image (the class token's row of R, or the mean
    of the patch rows for a model without one) and, for a patch target, the similarity map with the patch outlined
    (:func:`~vit_einops.inspect.plot_target_relevance`).

    Everything drawn but the distances, the position similarity and the filters is one study
    (:func:`~vit_einops.inspect.run_study`, as the explorer draws it): the model runs once for it
    (:func:`~vit_einops.inspect.record_pass`), again only with gradients for a target's relevance (and in the
    explanation methods), and for ``distance_images`` other than ``images``.

    Returns the written paths by name (``target`` and ``decomposition`` too where drawn): attention, methods,
    attention_distance, position_similarity, embedding_filters, prefix_share, token_norms, patch_pca (each
    ``<name>.png``, written atomically), arrays (``arrays.npz``, unless ``arrays="none"``: ``attention``, the recorded maps (l, b, h, n, n),
    with ``arrays="full"`` only; the drawn ``class_attention`` (or ``patch_attention``) of layer
    ``class_attention_layer``, rollout, distances, similarities, filters, ``prefix_tokens`` (their names),
    ``prefix_share`` (l, b, h, p), ``token_norms`` (l, b, n), ``dino_attention`` and ``dino_mask`` (b, h, gh, gw):
    DINO's view of the drawn layer, ``patch_pca`` (b, gh, gw, k) and ``patch_pca_components`` (k, D): the PCA's
    projections and components, k = 3 or fewer where D or the patches are fewer; ``method_<name>`` (b, gh, gw) for
    each method drawn, ``-`` in its name written ``_``, and ``method_labels``, their titles; with a decomposition,
    ``decomposition_total``, ``_heads`` (b, L, H), ``_mlps`` (b, L), ``_rest`` (b,), ``_sources`` (b, L, H, n),
    ``_parts`` (k, b) with ``decomposition_part_names`` (k,), and ``logit_lens`` (b, L + 1)).
    """
    check_study_target("write_report", target)
    if arrays not in ARRAYS:
        raise ValueError(f"write_report's arrays is one of {', '.join(ARRAYS)}, got {arrays!r:.60}")
    cfg = model.config
    model.eval()
    out = Path(out_dir)
    method_params = dict(method_params or {})
    # The recorded pass's output is checked first, to name the image and the cause; every array is checked below.
    study = run_study(
        model, images, target, method_params, lambda run: check_finite_logits(images, run.output), layer=layer
    )
    method_maps, run, rollout, pca, layer = study.methods, study.run, study.rollout, study.pca, study.layer
    decomposed = study.decomposition
    logits, maps, layout = run.output, run.maps, run.layout  # maps (l, b, h, n, n)
    has_class = study.dino is not None  # DINO's view is the class token's
    # Without a class token, the attention each patch receives from the patches is the map there is to draw.
    token_map = class_attention_grid if has_class else patch_attention_grid
    heads = study.dino.attention if has_class else patch_attention_grid(maps[layer], layout)  # (b, h, gh, gw)
    rollout_grid = token_map(rollout, layout)
    labels = {name: METHODS[name].label(method_params.get(name), every=True) for name in method_maps}
    left_out = " ".join(f"Not drawn: {names}; {why}." for names, why in left_out_clauses(unexplained(model, target)))
    titles = titles or [f"image {i}" for i in range(len(images))]
    if model.has_classifier:  # pooled features or an embedding (CLIP's projection) predict nothing
        predicted = [class_name(p, classes) for p in logits.argmax(-1).tolist()]
        titles = [f"{title}\npredicted {name}" for title, name in zip(titles, predicted, strict=True)]

    if distance_images is None or _same(distance_images, images):
        # Recorded above already; one layer at a time, so that the float64 sums never copy every layer's maps.
        distance = torch.cat([mean_attention_distance(m[None], layout, cfg.patch_size) for m in maps])
        distance_grid = layout.grid
    else:
        # The distance is a ratio of sums over images (see distance_sums): batches add their sums.
        weighted = torch.zeros(cfg.depth, cfg.heads, dtype=torch.float64)
        mass = torch.zeros(cfg.depth, cfg.heads, dtype=torch.float64)
        with AttentionRecorder(model) as recorder:
            for start in range(0, len(distance_images), batch_size):
                recorder.clear()
                model(distance_images[start : start + batch_size])
                batch_weighted, batch_mass = distance_sums(recorder.maps, recorder.layout, cfg.patch_size)
                weighted += batch_weighted.sum(dim=1)
                mass += batch_mass.sum(dim=1)
        distance = ratio_or_nan(weighted, mass).float()
        distance_grid = model.patch_embed.layout(distance_images.shape[-2:]).grid
    uniform = patch_distances(distance_grid, cfg.patch_size).mean().item()

    similarity = model_position_similarity(model)
    components, explained = embedding_filter_components(model)
    share = torch.cat([prefix_token_share(m[None], layout) for m in maps])  # (l, b, h, p), a layer at a time
    norms = run.norms  # (l, b, n)

    saved = {
        "images": images,
        "logits": logits,
        "attention": maps,
        "class_attention" if has_class else "patch_attention": heads,
        "class_attention_layer": torch.tensor(layer),
        "rollout": rollout,
        "mean_attention_distance": distance,
        "position_similarity": similarity,
        "filter_components": components,
        "filter_explained_variance": explained,
        "prefix_share": share,
        "token_norms": norms,
        "patch_pca": pca.projections,
        "patch_pca_components": pca.components,
        **{f"method_{name.replace('-', '_')}": value for name, value in method_maps.items()},
    }
    if decomposed is not None:
        d = decomposed.decomposition
        saved.update(
            decomposition_total=d.total, decomposition_heads=d.heads, decomposition_mlps=d.mlps,
            decomposition_rest=d.rest, decomposition_sources=d.by_source,
            decomposition_parts=torch.stack(list(d.parts.values())), logit_lens=decomposed.lens,
        )  # fmt: skip
    if study.target is not None:
        saved["target_relevance"] = study.target.relevance  # (b, n, n)
        saved["target_score"] = study.target.scores
        if isinstance(target, PatchTarget):
            saved["target_similarity"] = target.similarity(run.tokens, layout)
    method_titles = titles  # what the gradient methods explain (the predicted class), without DINO's note
    masks = None
    if has_class:  # DINO's view of the drawn layer: its maps outlined where they hold 60% of the mass
        saved.update(dino_attention=study.dino.attention, dino_mask=study.dino.mask)
        masks = study.dino.mask
        titles = [f"{title}\noutlined: {100 * DINO_KEEP:.0f}% of the class token's attention" for title in titles]
    # Nothing is written when any array is nan or inf: figures of them would draw nothing, and arrays.npz would
    # hand the NaN on to whoever reads it.
    overflow = "nothing was written (the weights or the preprocessing overflow float32)"
    for name, value in saved.items():
        if value.is_floating_point():
            defined = value.nan_to_num(0.0, math.inf, -math.inf) if name in UNDEFINED_WHERE_NAN else value
            check_finite_outputs(name, defined, overflow)
    shown = images if display_images is None else display_images
    figures = {
        "attention": plot_attention_overlays(shown, heads, rollout_grid, titles, layer=layer, masks=masks),
        "methods": plot_methods(
            shown, {labels[name]: value for name, value in method_maps.items()}, method_titles, note=left_out
        ),
        "attention_distance": plot_attention_distance(distance, uniform, layout),
        "position_similarity": plot_position_similarity(similarity),
        "embedding_filters": plot_filters(components, explained),
        "prefix_share": plot_prefix_share(share, layout),
        "token_norms": plot_token_norms(norms, layout),
        "patch_pca": plot_patch_pca(pca, shown, method_titles),
    }
    if target is not None:
        figures[TARGET_FIGURE] = plot_target_relevance(
            shown,
            token_map(saved["target_relevance"], layout),
            target_name(target),
            method_titles,  # no DINO outline is drawn there
            similarity=saved.get("target_similarity"),
            patch=(target.row, target.col) if isinstance(target, PatchTarget) else None,
        )
    if decomposed is not None:
        d = decomposed.decomposition
        figures[DECOMPOSITION_FIGURE] = plot_decomposition(
            shown, d.heads, d.mlps, d.total, d.by_source, d.layout, method_titles
        )
    if arrays != "full":
        del saved["attention"]  # checked above all the same: maps that overflow are refused whatever is kept
    buf = None if arrays == "none" else io.BytesIO()
    if buf is not None:
        np.savez(
            buf,
            prefix_tokens=np.array(layout.prefix, dtype=str),
            method_labels=np.array(list(labels.values()), dtype=str),
            **({} if decomposed is None else {"decomposition_part_names": np.array(list(d.parts), dtype=str)}),
            **{k: v.detach().cpu().numpy() for k, v in saved.items()},
        )
    with staged_directory(out, owned=REPORT_FILES, replace=overwrite) as staging:
        for name, fig in figures.items():
            save_figure(fig, staging / f"{name}.png")
        if buf is not None:
            atomic_write_chunks(staging / "arrays.npz", (buf.getbuffer(),), replace=False)  # no copy of the buffer
    paths = {name: out / f"{name}.png" for name in figures}
    if buf is not None:
        paths["arrays"] = out / "arrays.npz"
    return paths
