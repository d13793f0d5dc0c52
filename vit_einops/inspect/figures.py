"""The inspection figures as PNGs (matplotlib, Agg backend), in the style of the paper's Figures 6, 7 and 11."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .._plot import pyplot, save_figure


def _show_image(ax, image: torch.Tensor) -> None:
    """(C, H, W) in [0, 1] -> grey or RGB panel without axes."""
    if image.shape[0] == 1:
        ax.imshow(image[0].cpu().numpy(), cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(image.permute(1, 2, 0).clamp(0, 1).cpu().numpy())  # (C, H, W) -> (H, W, C) for imshow
    ax.set_xticks([])
    ax.set_yticks([])


def _upsample(grid_map: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(gh, gw) -> (H, W), scaled to [0, 1] so every panel uses the full colour range (as Figure 6 does)."""
    up = F.interpolate(grid_map[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]
    return (up - up.min()) / (up.max() - up.min()).clamp_min(1e-12)


def plot_attention_overlays(
    images: torch.Tensor,
    head_maps: torch.Tensor,
    rollout_maps: torch.Tensor,
    path: str | Path,
    titles: list[str] | None = None,
) -> Path:
    """One row per image: the input, each head's last-layer class-token attention over it, and the rollout.

    Shapes: images (b, C, H, W) in [0, 1]; head_maps (b, h, gh, gw); rollout_maps (b, gh, gw).
    """
    plt = pyplot()
    b, heads = head_maps.shape[:2]
    size = tuple(images.shape[-2:])
    fig, axes = plt.subplots(
        b, heads + 2, figsize=(1.6 * (heads + 2), 1.7 * b + 0.6), squeeze=False, layout="constrained"
    )
    for row in range(b):
        _show_image(axes[row, 0], images[row])
        axes[row, 0].set_ylabel(titles[row] if titles else f"image {row}", fontsize=8)
        panels = [*head_maps[row], rollout_maps[row]]
        for col, grid_map in enumerate(panels, start=1):
            _show_image(axes[row, col], images[row])
            axes[row, col].imshow(_upsample(grid_map, size).cpu().numpy(), cmap="inferno", alpha=0.6, vmin=0, vmax=1)
    axes[0, 0].set_title("input", fontsize=9)
    for h in range(heads):
        axes[0, h + 1].set_title(f"last layer\nhead {h}", fontsize=9)
    axes[0, heads + 1].set_title("rollout\n(all layers)", fontsize=9)
    fig.suptitle("Class-token attention (Figure 6 style)", fontsize=10)
    return save_figure(fig, path)


def plot_attention_distance(distance: torch.Tensor, path: str | Path, uniform_distance: float | None = None) -> Path:
    """Mean attention distance (l, h) as a scatter over layers, one dot per head (Figure 7 right / Figure 11)."""
    plt = pyplot()
    layers, heads = distance.shape
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    for h in range(heads):
        ax.scatter(range(1, layers + 1), distance[:, h].cpu().numpy(), s=18, label=f"head {h}")
    if uniform_distance is not None:
        ax.axhline(uniform_distance, color="grey", linestyle="--", linewidth=1, label="uniform attention")
    ax.set(xlabel="network depth (layer)", ylabel="mean attention distance (pixels)", title="Mean attention distance")
    ax.set_xticks(range(1, layers + 1))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def plot_position_similarity(similarity: torch.Tensor, path: str | Path) -> Path:
    """The grid of grids of Figure 7 (centre): tile (r, c) shows cos(E_pos[r, c], E_pos[., .]) over the grid."""
    plt = pyplot()
    gh, gw = similarity.shape[:2]
    fig, axes = plt.subplots(gh, gw, figsize=(0.75 * gw + 1.0, 0.75 * gh + 0.5), squeeze=False, layout="constrained")
    for r in range(gh):
        for c in range(gw):
            image = axes[r, c].imshow(similarity[r, c].cpu().numpy(), cmap="viridis", vmin=-1, vmax=1)
            axes[r, c].set_xticks([])
            axes[r, c].set_yticks([])
        axes[r, 0].set_ylabel(str(r + 1), fontsize=7)
    for c in range(gw):
        axes[-1, c].set_xlabel(str(c + 1), fontsize=7)
    fig.colorbar(image, ax=axes, shrink=0.8, label="cosine similarity")
    fig.suptitle("Position embedding similarity", fontsize=10)
    return save_figure(fig, path)


def plot_filters(components: torch.Tensor, explained: torch.Tensor, path: str | Path) -> Path:
    """Principal components of the patch-embedding filters (Figure 7 left), each scaled to its own range."""
    plt = pyplot()
    k = components.shape[0]
    cols = min(k, 7)
    rows = math.ceil(k / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(max(1.2 * cols, 3.5), 1.35 * rows + 0.5), squeeze=False, layout="constrained"
    )
    for ax in axes.flat:
        ax.set_axis_off()
    for i, (component, ratio) in enumerate(zip(components, explained, strict=True)):
        lo, hi = component.min(), component.max()
        _show_image(axes.flat[i], (component - lo) / (hi - lo).clamp_min(1e-12))
        axes.flat[i].set_axis_on()
        axes.flat[i].set_title(f"PC{i + 1} {100 * ratio:.0f}%", fontsize=7)
    fig.suptitle("Patch-embedding filters:\nprincipal components", fontsize=10)
    return save_figure(fig, path)
