"""Everything `vit-einops inspect` writes for one model: the figures and the raw arrays behind them."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .._checks import check_index
from .._io import atomic_write_bytes, staged_directory
from .._plot import save_figure
from ..model import ViT
from ..prediction import check_finite_outputs, class_name
from .distance import distance_sums, mean_attention_distance, patch_distances, ratio_or_nan
from .embeddings import embedding_filter_components, position_similarity
from .figures import plot_attention_distance, plot_attention_overlays, plot_filters, plot_position_similarity
from .record import AttentionRecorder
from .rollout import attention_rollout, class_attention_grid

FIGURES = ("attention", "attention_distance", "position_similarity", "embedding_filters")
# Everything write_report puts in its folder: the only names a folder it replaces may hold.
REPORT_FILES = frozenset((*(f"{name}.png" for name in FIGURES), "arrays.npz"))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.device == b.device and torch.equal(a, b))


# nan here means "undefined", not overflow: a head whose patches attend only to the class token sends no attention
# between patches, so it has no mean attention distance (see distance_sums). Such heads are common in trained ViTs.
UNDEFINED_WHERE_NAN = ("mean_attention_distance",)


def _check_finite(arrays: dict[str, torch.Tensor]) -> None:
    def finite(name: str, value: torch.Tensor) -> bool:
        if name in UNDEFINED_WHERE_NAN:
            return not torch.isinf(value).any()
        return bool(torch.isfinite(value).all())

    bad = [name for name, value in arrays.items() if value.is_floating_point() and not finite(name, value)]
    if bad:
        raise ValueError(
            f"inspect computed non-finite values (nan or inf) in {', '.join(bad)}; nothing was written "
            "(the model's weights or the preprocessing overflow float32)"
        )


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
) -> dict[str, Path]:
    """Write the inspection figures and ``arrays.npz`` for ``model`` (put in eval mode) under ``out_dir``.

    Args:
        images: (b, C, H, W), the model's inputs drawn with their attention (a handful).
        display_images: the same images as they should be drawn, in [0, 1] (default ``images``): pass them when
            ``images`` are normalised (mean/std), e.g. the preprocessing's resize and crop without normalisation.
        distance_images: the images the mean attention distance averages over (default ``images``); the paper
            averages over many, e.g. a test set.
        titles: one label per drawn image (e.g. "label 3"); the model's prediction is added below each.
        classes: the class names of the model's outputs, to name the predictions (default: "class 3").
        layer: the block whose heads' class-token attention is drawn (0 is the first, -1 the last); the figures
            number layers and heads from 0, as this index does.
        overwrite: replace an earlier report in ``out_dir``; without it, a non-empty ``out_dir`` is refused.

    The folder is written as one unit (:func:`vit_einops._io.staged_directory`): a kill leaves the whole old report
    or the whole new one. A folder holding any file but a report's is never replaced.

    Returns the written paths by name: attention, attention_distance, position_similarity, embedding_filters
    (each ``<name>.png``, written atomically), arrays (``arrays.npz``: the recorded maps, the drawn
    ``class_attention`` of layer ``class_attention_layer``, rollout, distances, similarities, filters).
    """
    cfg = model.config
    cfg.check_class_token_layout("vit-einops inspect")
    depth = len(model.blocks)
    layer = check_index("layer", layer, depth, f"a ViT of depth {depth}")
    model.eval()
    out = Path(out_dir)
    with AttentionRecorder(model) as recorder:
        logits = model(images)
    check_finite_outputs(images, logits)
    maps = recorder.maps  # (l, b, h, n, n)
    heads = class_attention_grid(maps[layer], cfg.grid_size)  # (b, h, gh, gw)
    rollout = attention_rollout(maps)
    rollout_grid = class_attention_grid(rollout, cfg.grid_size)
    titles = titles or [f"image {i}" for i in range(len(images))]
    predicted = [class_name(p, classes) for p in logits.argmax(-1).tolist()]
    titles = [f"{title}\npredicted {name}" for title, name in zip(titles, predicted, strict=True)]

    if distance_images is None or _same(distance_images, images):
        distance = mean_attention_distance(maps, cfg.grid_size, cfg.patch_size)  # recorded above already
    else:
        # The distance is a ratio of sums over images (see distance_sums): batches add their sums.
        weighted = torch.zeros(cfg.depth, cfg.heads, dtype=torch.float64)
        mass = torch.zeros(cfg.depth, cfg.heads, dtype=torch.float64)
        with AttentionRecorder(model) as recorder:
            for start in range(0, len(distance_images), batch_size):
                recorder.clear()
                model(distance_images[start : start + batch_size])
                batch_weighted, batch_mass = distance_sums(recorder.maps, cfg.grid_size, cfg.patch_size)
                weighted += batch_weighted.sum(dim=1)
                mass += batch_mass.sum(dim=1)
        distance = ratio_or_nan(weighted, mass).float()
    uniform = patch_distances(cfg.grid_size, cfg.patch_size).mean().item()

    similarity = position_similarity(model.patch_embed.pos_embed.weight, cfg.grid_size)
    components, explained = embedding_filter_components(model)

    arrays = {
        "images": images,
        "logits": logits,
        "attention": maps,
        "class_attention": heads,
        "class_attention_layer": torch.tensor(layer),
        "rollout": rollout,
        "mean_attention_distance": distance,
        "position_similarity": similarity,
        "filter_components": components,
        "filter_explained_variance": explained,
    }
    # Nothing is written when any array is nan or inf: figures of them would draw nothing, and arrays.npz would
    # hand the NaN on to whoever reads it.
    _check_finite(arrays)
    figures = {
        "attention": plot_attention_overlays(
            images if display_images is None else display_images, heads, rollout_grid, titles, layer=layer
        ),
        "attention_distance": plot_attention_distance(distance, uniform),
        "position_similarity": plot_position_similarity(similarity),
        "embedding_filters": plot_filters(components, explained),
    }
    buf = io.BytesIO()
    np.savez(buf, **{k: v.detach().cpu().numpy() for k, v in arrays.items()})
    with staged_directory(out, owned=REPORT_FILES, replace=overwrite) as staging:
        for name, fig in figures.items():
            save_figure(fig, staging / f"{name}.png")
        atomic_write_bytes(staging / "arrays.npz", buf.getvalue(), replace=False)
    paths = {name: out / f"{name}.png" for name in figures}
    paths["arrays"] = out / "arrays.npz"
    return paths
