"""Everything `vit-einops inspect` writes for one model: the figures and the raw arrays behind them."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .._checks import check_index
from .._io import atomic_write_bytes
from .._plot import save_figure
from ..model import ViT
from ..predict import check_finite_outputs, class_name
from .distance import mean_attention_distance, patch_distances
from .embeddings import embedding_filter_components, position_similarity
from .figures import plot_attention_distance, plot_attention_overlays, plot_filters, plot_position_similarity
from .record import AttentionRecorder
from .rollout import attention_rollout, class_attention_grid


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.device == b.device and torch.equal(a, b))


def _check_finite(arrays: dict[str, torch.Tensor]) -> None:
    bad = [name for name, value in arrays.items() if value.is_floating_point() and not torch.isfinite(value).all()]
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

    Returns the written paths by name: attention, attention_distance, position_similarity, embedding_filters
    (each ``<name>.png``, written atomically), arrays (``arrays.npz``: the recorded maps, the drawn
    ``class_attention`` of layer ``class_attention_layer``, rollout, distances, similarities, filters).
    """
    depth = len(model.blocks)
    layer = check_index("layer", layer, depth, f"a ViT of depth {depth}")
    model.eval()
    out = Path(out_dir)
    cfg = model.config
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
        distance_sum = torch.zeros(cfg.depth, cfg.heads, dtype=torch.float64)
        with AttentionRecorder(model) as recorder:
            for start in range(0, len(distance_images), batch_size):
                recorder.clear()
                batch = distance_images[start : start + batch_size]
                model(batch)
                batch_distance = mean_attention_distance(recorder.maps, cfg.grid_size, cfg.patch_size)
                distance_sum += batch_distance.double() * len(batch)
        distance = (distance_sum / len(distance_images)).float()
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
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "attention": plot_attention_overlays(
            images if display_images is None else display_images, heads, rollout_grid, titles, layer=layer
        ),
        "attention_distance": plot_attention_distance(distance, uniform),
        "position_similarity": plot_position_similarity(similarity),
        "embedding_filters": plot_filters(components, explained),
    }
    paths = {name: save_figure(fig, out / f"{name}.png") for name, fig in figures.items()}
    buf = io.BytesIO()
    np.savez(buf, **{k: v.detach().cpu().numpy() for k, v in arrays.items()})
    atomic_write_bytes(out / "arrays.npz", buf.getvalue())
    paths["arrays"] = out / "arrays.npz"
    return paths
