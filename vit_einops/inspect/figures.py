"""The inspection figures, in the style of the paper's Figures 6, 7 and 11.

Every function returns a ``matplotlib.figure.Figure`` (shown inline when a notebook cell returns it); saving is a
separate step, ``vit_einops.base.plot.save_figure(fig, path)`` (atomic). Layers and heads are numbered from 0
everywhere, as the code indexes them (``model.blocks[0]``, ``AttentionRecorder(model, layers=[0])``,
``arrays.npz``): "layer 11" of a 12-layer model is its last.

Head panels are laid out in a grid of ceil(sqrt(panels)) columns, so 3, 12 or 16 heads stay readable.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..base.checks import check_dense_tensor, check_index, check_int
from ..base.plot import new_figure
from ..base.text import printable_lines
from ..images import to_display
from ..inputs import model_inputs_and_pictures
from ..network.patch_embed import TokenLayout
from ..network.sizes import check_model_forward
from ..prediction import class_name
from .dino import DinoView
from .record import AttentionRecorder
from .rollout import attention_rollout, class_attention_grid, patch_attention_grid
from .tokens import CLASS_TOKEN, check_layout

PANEL_INCHES = 1.45  # one attention panel at least; the grid's figure size follows from it
TITLE_LINE_INCHES = 0.125  # one line of a panel's 8 pt title
MIN_WIDTH_INCHES = 6.4  # matplotlib's default width: 640 px at its 100 dpi, room for the colour bar's whole label
ATTENTION_CMAP = "inferno"
MASK_COLOUR = "cyan"  # DINO's mask outline: visible over inferno's dark and bright ends
NO_PREFIX_TOKENS = (
    "This model has no prefix tokens (no class token, no registers):\nno token before the patches takes any of "
    "their attention."
)
RELEVANCE_LABEL = "relevance / panel maximum"  # target.png's maps are Chefer et al.'s R, not attention


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, cols) of a near-square grid for ``panels`` panels: ceil(sqrt) columns."""
    cols = max(1, math.ceil(math.sqrt(panels)))
    return math.ceil(panels / cols), cols


def _block_inches(panels: int, title_lines: int, min_width: float) -> tuple[float, float]:
    """(width, height) of one image's block of ``panels`` attention panels in a near-square grid, with its colour
    bar and title: each panel square, PANEL_INCHES or wider where the block must fill ``min_width``, under a
    title of ``title_lines`` lines."""
    rows, cols = grid_shape(panels)
    panel = max(PANEL_INCHES, (min_width - 0.9) / cols)
    return cols * panel + 0.9, rows * (panel + title_lines * TITLE_LINE_INCHES) + 0.4


def _show_image(ax, image: torch.Tensor) -> None:
    """(C, H, W) -> grey or RGB panel without ticks."""
    image = to_display(image)
    if image.shape[0] == 1:
        ax.imshow(image[0].numpy(), cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(image.permute(1, 2, 0).clamp(0, 1).numpy())  # (C, H, W) -> (H, W, C) for imshow
    ax.set_xticks([])
    ax.set_yticks([])


def _upsample(grid_map: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(gh, gw) -> (H, W), divided by its maximum so every panel uses the full colour range (as Figure 6 does)."""
    up = F.interpolate(grid_map[None, None].float().cpu(), size=size, mode="bilinear", align_corners=False)[0, 0]
    return up.clamp_min(0) / up.max().clamp_min(1e-12)


def _outline(ax, mask: torch.Tensor, size: tuple[int, int]) -> None:
    """The border of a (gh, gw) bool mask's patches, drawn over an (H, W) panel; nothing when the mask keeps every
    patch or none (no border exists, and matplotlib would warn of a contour with no level)."""
    if mask.all() or not mask.any():
        return
    up = F.interpolate(mask[None, None].float().cpu(), size=size, mode="nearest")[0, 0]
    ax.contour(up.numpy(), levels=[0.5], colors=MASK_COLOUR, linewidths=1.0)


def _attention_colorbar(fig, axes, label: str = "attention / panel maximum", *, cax=None) -> None:
    """The 0..1 colour bar of panels each scaled to their own maximum, beside ``axes`` or in ``cax``; ``label``
    says what the colours are."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    mappable = ScalarMappable(norm=Normalize(0, 1), cmap=ATTENTION_CMAP)
    if cax is not None:
        fig.colorbar(mappable, cax=cax, label=label)
    else:
        fig.colorbar(mappable, ax=axes, shrink=0.6, label=label)


def _draw_attention(
    fig,
    image: torch.Tensor,
    head_maps: torch.Tensor,
    rollout_map: torch.Tensor | None,
    title: str,
    layer: int,
    heads: range | None = None,
    masks: torch.Tensor | None = None,
) -> None:
    """One image on ``fig`` (a Figure or SubFigure): the input, the rollout (unless None) and the heads, in a grid.

    head_maps (h, gh, gw) is the class token's attention over the patches in layer ``layer`` (0-based) of the
    heads numbered ``heads`` (default 0..h-1); rollout_map (gh, gw) is the rollout through every layer. Each
    panel is scaled to its own maximum, printed in its title, so the colour bar reads relative to it. masks
    (h, gh, gw) bool, when given, outlines each head's kept patches (DINO's mask) and counts them in the title.
    """
    heads = range(head_maps.shape[0]) if heads is None else heads
    panels = [("input", None, None)]
    if rollout_map is not None:
        panels.append(("rollout\n(all layers)", rollout_map, None))
    head_masks = [None] * len(head_maps) if masks is None else list(masks)
    panels += [
        (f"layer {layer} head {h}", grid_map, mask)
        for h, grid_map, mask in zip(heads, head_maps, head_masks, strict=True)
    ]
    rows, cols = grid_shape(len(panels))
    axes = fig.subplots(rows, cols, squeeze=False)
    size = tuple(image.shape[-2:])
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (name, grid_map, mask) in zip(axes.flat, panels, strict=False):
        ax.set_axis_on()
        _show_image(ax, image)
        if grid_map is None:
            ax.set_title(name, fontsize=8, parse_math=False)
            continue
        ax.imshow(_upsample(grid_map, size).numpy(), cmap=ATTENTION_CMAP, alpha=0.6, vmin=0, vmax=1)
        if mask is None:
            ax.set_title(f"{name}\nmax {grid_map.max().item():.3g}", fontsize=8, parse_math=False)
            continue
        _outline(ax, mask, size)
        kept = f"keeps {int(mask.sum())}/{mask.numel()}"
        ax.set_title(f"{name}\nmax {grid_map.max().item():.3g}\n{kept}", fontsize=8, parse_math=False)
    _attention_colorbar(fig, axes)
    # The title holds a file name and a class name: literal text, so "$" in one is a dollar sign, not mathtext, and
    # control characters escaped (a font has no glyph for ESC: matplotlib's warning would print it raw).
    fig.suptitle(printable_lines(title), fontsize=10, parse_math=False)


def plot_attention_overlays(
    images: torch.Tensor,
    head_maps: torch.Tensor,
    rollout_maps: torch.Tensor | None,
    titles: list[str] | None = None,
    *,
    layer: int,
    masks: torch.Tensor | None = None,
):
    """Each image with its heads' class-token attention in layer ``layer`` (0-based) and the rollout, over it
    (Figure 6 style): one block per image, the blocks in a near-square grid.

    Shapes: images (b, C, H, W); head_maps (b, h, gh, gw); rollout_maps (b, gh, gw), or None for the heads alone;
    masks (b, h, gh, gw) bool, or None: each head's kept patches, outlined (see :func:`plot_dino_view`).
    Returns a Figure.
    """
    b, heads = head_maps.shape[:2]
    block_rows, block_cols = grid_shape(b)
    width, height = _block_inches(
        heads + (1 if rollout_maps is None else 2), 2 if masks is None else 3, MIN_WIDTH_INCHES / block_cols
    )
    fig = new_figure(figsize=(block_cols * width, block_rows * height))
    subfigs = fig.subfigures(block_rows, block_cols, squeeze=False)
    for sub in subfigs.flat[b:]:
        sub.set_visible(False)
    for i, sub in enumerate(subfigs.flat[:b]):
        title = titles[i] if titles else f"image {i}"
        rollout = None if rollout_maps is None else rollout_maps[i]
        _draw_attention(sub, images[i], head_maps[i], rollout, title, layer, masks=None if masks is None else masks[i])
    return fig


def plot_methods(
    images: torch.Tensor, maps: Mapping[str, torch.Tensor], titles: list[str] | None = None, *, note: str = ""
):
    """Each explanation method's map over each image (:func:`~vit_einops.inspect.explain_all`): one row per image,
    the input then one panel per method under a column heading of its label (name, then its parameters), each
    panel's map scaled to its own maximum and laid over the input. The panels are one picture (a single image
    drawn once), so a report of many images and methods stays quick to draw. ``note``, when given, is printed
    under the panels: why methods are missing (e.g. the gradient methods without a target).

    Shapes: images (b, C, H, W); maps {label: (b, gh, gw)}. Returns a Figure.
    """
    from matplotlib import colormaps

    b, _, h, w = images.shape
    cols = len(maps) + 1
    gap = max(1, min(h, w) // 16)  # white between panels
    mosaic = torch.ones(b * (h + gap) - gap, cols * (w + gap) - gap, 3)
    cmap = colormaps[ATTENTION_CMAP]
    for i in range(b):
        picture = to_display(images[i]).expand(3, h, w).permute(1, 2, 0)  # (H, W, 3); grey drawn as RGB
        panels = [picture]
        for grid_maps in maps.values():
            heat = torch.from_numpy(cmap(_upsample(grid_maps[i], (h, w)).numpy())[..., :3]).float()
            panels.append(0.4 * picture + 0.6 * heat)  # the overlay's alpha, as the attention figure draws it
        for c, panel in enumerate(panels):
            mosaic[i * (h + gap) : i * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = panel
    fig = new_figure(figsize=(max(MIN_WIDTH_INCHES, 1.1 * cols + 2.0), 1.1 * b + 1.3))
    ax = fig.subplots()
    ax.imshow(mosaic.clamp(0, 1).numpy())
    headings = ["input"] + [label.replace(" (", "\n(", 1).replace(", ", ",\n") for label in maps]  # a parameter a line
    ax.set_xticks([c * (w + gap) + w / 2 for c in range(cols)], headings, fontsize=6, parse_math=False)
    ax.xaxis.tick_top()
    names = [printable_lines(titles[i] if titles else f"image {i}") for i in range(b)]
    ax.set_yticks([i * (h + gap) + h / 2 for i in range(b)], names, fontsize=6, parse_math=False)  # literal text
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    _attention_colorbar(fig, ax, "map / its own maximum")
    fig.suptitle("Explanation methods", fontsize=10)
    if note:
        width = fig.get_figwidth()
        # A method's name (gradient-rollout) is never split at its hyphen: the note names methods to type.
        wrapped = textwrap.fill(printable_lines(note), max(20, int(14 * width)), break_on_hyphens=False)
        fig.supxlabel(wrapped, fontsize=7, parse_math=False)
    return fig


def plot_decomposition(
    images: torch.Tensor,
    heads: torch.Tensor,
    mlps: torch.Tensor,
    total: torch.Tensor,
    sources: torch.Tensor,
    layout: TokenLayout,
    titles: list[str] | None = None,
    *,
    top: int = 3,
):
    """The score decomposed (:func:`~vit_einops.inspect.decompose`), one row per image: each head's direct share
    as an L x H grid with the MLPs' shares beside it, on one diverging scale (red adds to the score, blue takes
    from it), then the source maps of the ``top`` heads of largest absolute share laid over the image, each on its
    own diverging scale (its largest absolute part over the patches; the prefix tokens' parts are left out).

    Shapes: images (b, C, H, W); heads (b, L, H); mlps (b, L); total (b,); sources (b, L, H, n), ``layout``'s
    tokens. Returns a Figure.
    """
    b, depth, count = heads.shape
    top = min(check_int("top", top, 1), depth * count)
    h, w = images.shape[-2:]
    size = (h, w)
    row_inches = max(1.9, 0.22 * depth + 1.0)
    fig = new_figure(figsize=(max(MIN_WIDTH_INCHES, 0.3 * count + 2.2 + 1.7 * top), b * row_inches + 0.4))
    ratios = [max(2, count) * 0.3, 0.45] + [1.5] * top
    axes = fig.subplots(b, 2 + top, squeeze=False, gridspec_kw={"width_ratios": ratios})
    for i in range(b):
        shares, own = heads[i].detach().double().cpu(), mlps[i].detach().double().cpu()
        bound = float(max(shares.abs().max(), own.abs().max())) or 1.0
        grid, mlp = axes[i, 0], axes[i, 1]
        shown = grid.imshow(shares.numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        title = printable_lines(titles[i] if titles else f"image {i}")
        grid.set_title(f"{title}\nscore {float(total[i]):.4g}; heads", fontsize=7, loc="left", parse_math=False)
        grid.set_xlabel("head", fontsize=7)
        grid.set_ylabel("layer", fontsize=7)
        grid.set_xticks(range(count))
        grid.set_yticks(range(depth))
        grid.tick_params(labelsize=6)
        mlp.imshow(own[:, None].numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        mlp.set_title("MLP", fontsize=7)
        mlp.set_xticks([])
        mlp.set_yticks([])
        fig.colorbar(shown, ax=mlp, shrink=0.8).ax.tick_params(labelsize=6)
        order = shares.flatten().abs().argsort(descending=True)[:top].tolist()
        for ax, index in zip(axes[i, 2:], order, strict=True):
            layer, head = divmod(index, count)
            parts = sources[i, layer, head, layout.num_prefix :].detach().double().cpu().unflatten(-1, layout.grid)
            up = F.interpolate(parts[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
            scale = float(parts.abs().max()) or 1.0
            _show_image(ax, images[i])
            ax.imshow(up.numpy(), cmap="RdBu_r", vmin=-scale, vmax=scale, alpha=0.6)
            ax.set_title(f"layer {layer} head {head}\nshare {float(shares[layer, head]):.3g}", fontsize=7)
    fig.suptitle("The score decomposed: each head's and MLP's direct share; the top heads' source maps", fontsize=9)
    return fig


def plot_dino_view(images: torch.Tensor, view: DinoView, titles: list[str] | None = None, *, layer: int, keep: float):
    """DINO's Figure 3 for each image: every head's class-token attention over the patches in layer ``layer``
    (0-based; DINO draws the last), with the patches that hold ``keep`` of its mass outlined and counted.

    Shapes: images (b, C, H, W); ``view`` a :class:`~vit_einops.inspect.dino.DinoView` of (b, h, gh, gw) maps.
    Returns a Figure.
    """
    share = f"outlined: {100 * keep:.0f}% of the mass"
    titles = [f"{t}\n{share}" for t in (titles or [f"image {i}" for i in range(len(images))])]
    return plot_attention_overlays(images, view.attention, None, titles, layer=layer, masks=view.mask)


def plot_token_norms(norms: torch.Tensor, layout: TokenLayout, *, layer: int = -1):
    """How long the tokens of the residual stream are, prefix tokens marked (Darcet et al. 2024, Fig. 2/3): on the
    left, a histogram of the patch tokens' norms after block ``layer`` (all images), each prefix token's norm a
    named vertical line; on the right, by block, the patches' median and largest norm and each prefix token's.
    A few patches far above the median are the high-norm artifact that registers absorb.

    Shapes: norms (l, b, n) over the tokens of ``layout`` (:func:`token_norms` gives both). Returns a Figure.
    """
    from matplotlib import colormaps

    check_dense_tensor("norms", norms)
    if norms.ndim != 3:
        raise ValueError(f"plot_token_norms takes norms (layers, b, n), got shape {tuple(norms.shape)}")
    names = check_layout(layout, norms.shape[-1]).prefix
    layers = norms.shape[0]
    layer = check_index("layer", layer, layers, f"{layers} layers of norms")
    values = norms.detach().double().cpu()
    patches, prefix = values[..., layout.patches], values[..., : len(names)]  # (l, b, N'), (l, b, p)
    colours = colormaps["tab10"]
    fig = new_figure(figsize=(9.0, 3.6))
    hist, lines = fig.subplots(1, 2)
    hist.hist(patches[layer].flatten().numpy(), bins=40, color="lightgrey", edgecolor="grey", label="patch tokens")
    for p, name in enumerate(names):
        hist.axvline(prefix[layer, :, p].mean().item(), color=colours(p % 10), linewidth=1.5, label=name)
    hist.set(xlabel="token norm", ylabel="patch tokens", title=f"After block {layer} (0-based)")
    hist.legend(fontsize=7)
    x = range(layers)
    flat = patches.flatten(1)  # (l, b * N')
    lines.plot(x, flat.median(dim=1).values.numpy(), color="grey", label="patches: median")
    lines.plot(x, flat.max(dim=1).values.numpy(), color="grey", linestyle="--", label="patches: largest")
    for p, name in enumerate(names):
        lines.plot(x, prefix[:, :, p].mean(dim=1).numpy(), color=colours(p % 10), marker="o", markersize=3, label=name)
    lines.set(xlabel="block (0-based)", ylabel="token norm", title="Token norms by block")
    lines.set_xticks(list(x))
    lines.legend(fontsize=7)
    lines.grid(alpha=0.3)
    return fig


def plot_prefix_share(share: torch.Tensor, layout: TokenLayout):
    """The share of the patches' attention that lands on each prefix token (:func:`prefix_token_share`), by layer:
    one line per prefix token of ``layout`` (the mean over images and heads), a dot per head, and the patches' own
    share (the rest). A register or class token near 1 is an attention sink. A model without prefix tokens (p = 0)
    gets a figure saying so instead of an empty chart. Shapes: share (l, b, h, p). Returns a Figure."""
    from matplotlib import colormaps

    check_dense_tensor("share", share)
    if share.ndim != 4:
        raise ValueError(f"plot_prefix_share takes share (layers, b, h, p), got shape {tuple(share.shape)}")
    names = check_layout(layout).prefix
    if share.shape[-1] != len(names):
        raise ValueError(
            f"{len(names)} prefix tokens {layout.shown()} for {share.shape[-1]} prefix-token columns of share (shape "
            f"{tuple(share.shape)}); expected one column per prefix token"
        )
    fig = new_figure(figsize=(5.6, 3.8))
    ax = fig.subplots()
    if not names:  # SigLIP's layout: attention pooling, no class token, no registers
        ax.set_axis_off()
        ax.text(0.5, 0.5, NO_PREFIX_TOKENS, ha="center", va="center", wrap=True, fontsize=9, transform=ax.transAxes)
        ax.set_title("Attention on prefix tokens")
        return fig
    values = share.detach().double().cpu()
    layers = values.shape[0]
    per_head = values.mean(dim=1)  # (l, h, p)
    colours = colormaps["tab10"]
    x = torch.arange(layers).double()
    for p, name in enumerate(names):
        ax.scatter(x.repeat_interleave(per_head.shape[1]).numpy(), per_head[..., p].flatten().numpy(), s=8,
                   color=colours(p % 10), alpha=0.4, edgecolors="none")  # fmt: skip
        ax.plot(x.numpy(), per_head[..., p].mean(dim=1).numpy(), color=colours(p % 10), marker="o", label=name)
    patches = 1 - per_head.sum(dim=-1).mean(dim=1)
    ax.plot(x.numpy(), patches.numpy(), color="grey", linestyle="--", label="patches")
    ax.set(xlabel="layer (0-based)", ylabel="share of the patches' attention", title="Attention on prefix tokens")
    ax.set_xticks(range(layers))
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


@torch.no_grad()
def show_attention(
    model: Any, image: Any, layer: int = -1, head: int | None = None, *, preprocessed: bool | None = None
):
    """One image's attention maps, for a notebook: the input as the model saw it, and the class token's attention
    over the patches in ``layer`` (a block index: 0 is the first, -1 the last): with ``head=None`` every head and
    the attention rollout through all layers, with ``head=k`` head k alone. The prefix tokens (registers,
    distillation) of the input's token layout are left out of the maps; a model without a class token shows the
    attention each patch receives from the patches
    (:func:`~vit_einops.inspect.patch_attention_grid`).

    Args:
        model: a ViT (any attention impl: the maps are recorded with :class:`AttentionRecorder`). It runs in eval
            mode here and is given back in the mode it had.
        image: one image as :func:`vit_einops.predict` takes it: a path, a PIL image, a uint8 or float tensor
            (C, H, W) or (1, C, H, W); ``preprocessed`` says how a float tensor is taken (see
            :mod:`vit_einops.inputs`).
        head: None for every head, or the one head to draw (negative counts from the end).

    Returns a Figure (save it with ``vit_einops.base.plot.save_figure`` or ``fig.savefig``).
    """
    inputs, pictures = model_inputs_and_pictures(model, image, preprocessed=preprocessed, name="image")
    if len(inputs) != 1:
        raise ValueError(f"show_attention draws one image: (C, H, W) or (1, C, H, W), got shape {tuple(inputs.shape)}")
    depth, heads = len(model.blocks), model.config.heads
    layer = check_index("layer", layer, depth, f"a ViT of depth {depth}")
    check_model_forward(model, inputs, kept=depth)
    if head is not None:
        head = check_index("head", head, heads, f"a layer of {heads} heads")
    was_training = model.training
    model.eval()
    try:
        with AttentionRecorder(model) as recorder:
            logits = model(inputs)
    finally:
        model.train(was_training)
    maps, layout = recorder.maps, recorder.layout  # maps (l, 1, h, n, n)
    token_map = class_attention_grid if CLASS_TOKEN in layout.prefix else patch_attention_grid
    head_maps = token_map(maps[layer, 0], layout)  # (h, gh, gw)
    rollout = token_map(attention_rollout(maps)[0], layout)
    title = f"layer {layer} of 0..{depth - 1}"
    if logits.ndim == 2 and model.has_classifier:  # pooled features or an embedding predict no class
        index = int(logits[0].argmax())
        name = class_name(index, getattr(model, "class_names", None))
        title += f"; predicted {name} (p {logits[0].softmax(-1)[index].item():.2f})"
    shown = range(heads) if head is None else range(head, head + 1)
    if head is not None:
        head_maps, rollout = head_maps[head : head + 1], None  # one head alone: no rollout beside it
    fig = new_figure(figsize=_block_inches(len(shown) + (1 if rollout is None else 2), 2, MIN_WIDTH_INCHES))
    _draw_attention(fig, pictures[0], head_maps, rollout, title, layer, shown)
    return fig


def plot_attention_distance(
    distance: torch.Tensor, uniform_distance: float | None = None, layout: TokenLayout | None = None
):
    """Mean attention distance (l, h) over layers, one dot per head coloured by its index (Figure 7 right /
    Figure 11); layers and heads numbered from 0. A head whose distance is undefined (nan: its patches attend only
    to the prefix tokens, named by ``layout``) is drawn as a red cross on the axis and named in the legend.
    Returns a Figure."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm

    layers, heads = distance.shape
    fig = new_figure(figsize=(5.6, 3.8))
    ax = fig.subplots()
    cmap = colormaps["viridis"].resampled(heads)
    norm = BoundaryNorm([h - 0.5 for h in range(heads + 1)], heads)
    values = distance.detach().float().cpu()
    for h in range(heads):
        ax.scatter(range(layers), values[:, h].numpy(), s=18, color=cmap(norm(h)), edgecolors="none")
    undefined = torch.isnan(values).nonzero().tolist()  # [[layer, head], ...]
    prefix = () if layout is None else layout.prefix
    sinks = f"prefix tokens ({', '.join(prefix)})" if prefix else "prefix tokens"
    sinks = "the class token" if prefix == (CLASS_TOKEN,) else sinks
    if undefined:
        ax.scatter(
            [layer for layer, _ in undefined], [0] * len(undefined), marker="x", s=30, color="red", clip_on=False,
            label=f"n/a: attends only to {sinks} ({len(undefined)} head{'s' if len(undefined) > 1 else ''})",
        )  # fmt: skip
    if uniform_distance is not None:
        ax.axhline(uniform_distance, color="grey", linestyle="--", linewidth=1, label="uniform attention")
    if undefined or uniform_distance is not None:
        ax.legend(fontsize=7, loc="lower right")
    ax.set(xlabel="layer (0-based)", ylabel="mean attention distance (pixels)", title="Mean attention distance")
    ax.set_xticks(range(layers))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="head (0-based)")
    bar.set_ticks(range(heads) if heads <= 16 else range(0, heads, math.ceil(heads / 16)))
    return fig


def position_mosaic(similarity: torch.Tensor) -> torch.Tensor:
    """(gh, gw, gh, gw) -> one (gh (gh + 1) - 1, gw (gw + 1) - 1) picture: tile (r, c) at rows r (gh + 1) ..,
    columns c (gw + 1) .., a row and column of nan (drawn blank) between tiles."""
    gh, gw = similarity.shape[:2]
    padded = F.pad(similarity.float().cpu(), (0, 1, 0, 1), value=math.nan)  # (gh, gw, gh + 1, gw + 1)
    return padded.permute(0, 2, 1, 3).reshape(gh * (gh + 1), gw * (gw + 1))[:-1, :-1]


def plot_position_similarity(similarity: torch.Tensor):
    """The grid of grids of Figure 7 (centre): tile (r, c) shows cos(E_pos[r, c], E_pos[., .]) over the patch
    grid; patch rows and columns numbered from 0. The tiles are one picture (:func:`position_mosaic`), so that
    DINOv2's 37 x 37 grid draws in a second rather than as 1,369 panels. Shapes: similarity (gh, gw, gh, gw), what
    :func:`~vit_einops.inspect.model_position_similarity` returns for a model. Returns a Figure."""
    check_dense_tensor("similarity", similarity)
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(
            f"plot_position_similarity takes similarity (gh, gw, gh, gw), as model_position_similarity(model) "
            f"returns it, got shape {tuple(similarity.shape)}"
        )
    gh, gw = similarity.shape[:2]
    side = min(12.0, 0.5 * max(gh, gw) + 2.5)  # 12 in at 120 dpi: at least 2 px per patch of a 37 x 37 grid
    fig = new_figure(figsize=(side + 1.2, side * gh / gw + 0.8))
    ax = fig.subplots()
    image = ax.imshow(position_mosaic(similarity).numpy(), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    step_r, step_c = math.ceil(gh / 16), math.ceil(gw / 16)  # at most 16 labels a side
    ax.set_yticks([r * (gh + 1) + (gh - 1) / 2 for r in range(0, gh, step_r)], [str(r) for r in range(0, gh, step_r)])
    ax.set_xticks([c * (gw + 1) + (gw - 1) / 2 for c in range(0, gw, step_c)], [str(c) for c in range(0, gw, step_c)])
    ax.tick_params(labelsize=7, length=0)
    ax.set(xlabel="input patch column", ylabel="input patch row", title="Position embedding similarity")
    fig.colorbar(image, ax=ax, shrink=0.8, label="cosine similarity")
    return fig


def plot_target_relevance(
    images: torch.Tensor,
    relevance: torch.Tensor,
    name: str,
    titles: list[str] | None = None,
    *,
    similarity: torch.Tensor | None = None,
    patch: tuple[int, int] | None = None,
):
    """A backbone target's explanation, one column per image: the image, its relevance map for the target over it
    (Chefer et al.'s R, the row :func:`~vit_einops.inspect.report.write_report` names, scaled to its maximum), and
    for a patch target the similarity map cos(z_j, z_p) on [-1, 1] with the chosen patch p outlined.

    Shapes: images (b, C, H, W); relevance (b, gh, gw); similarity (b, gh, gw) or None; patch (row, col) of the
    grid. ``name`` says what the target's score is. Returns a Figure.
    """
    from matplotlib.patches import Rectangle

    b = len(images)
    rows = 3 if similarity is not None else 2
    # The colour bars get a narrow column of their own, so every row's panels share the same columns; the figure
    # is as wide as its panels (a wide figure around one image would leave an empty column beside it).
    width = 2.4 * b + 1.2
    fig = new_figure(figsize=(width, 2.4 * rows + 0.6))
    axes = fig.subplots(rows, b + 1, squeeze=False, width_ratios=[1] * b + [0.08])
    size = tuple(images.shape[-2:])
    axes[0, b].set_axis_off()  # no colour bar beside the inputs
    for i in range(b):
        _show_image(axes[0, i], images[i])
        axes[0, i].set_title(printable_lines(titles[i] if titles else f"image {i}"), fontsize=8, parse_math=False)
        _show_image(axes[1, i], images[i])
        axes[1, i].imshow(_upsample(relevance[i], size).numpy(), cmap=ATTENTION_CMAP, alpha=0.6, vmin=0, vmax=1)
        axes[1, i].set_title(f"relevance, max {relevance[i].max().item():.3g}", fontsize=8)
        if similarity is not None:
            shown = axes[2, i].imshow(similarity[i].float().cpu().numpy(), cmap="viridis", vmin=-1, vmax=1)
            axes[2, i].set(xticks=[], yticks=[])
            axes[2, i].set_title("cosine to the patch", fontsize=8)
            if patch is not None:
                axes[2, i].add_patch(Rectangle((patch[1] - 0.5, patch[0] - 0.5), 1, 1, fill=False, color="red"))
    _attention_colorbar(fig, None, RELEVANCE_LABEL, cax=axes[1, b])
    if similarity is not None:
        fig.colorbar(shown, cax=axes[2, b], label="cosine similarity")
    # Wrapped to the figure's width (about 11 characters an inch at 10 pt): one image's figure is narrow.
    heading = textwrap.fill(printable_lines(f"Relevance for the target: {name}"), max(20, int(11 * width)))
    fig.suptitle(heading, fontsize=10, parse_math=False)
    return fig


def plot_filters(components: torch.Tensor, explained: torch.Tensor):
    """Principal components of the patch-embedding filters (Figure 7 left), each scaled to its own range (a
    colour bar for single-channel filters; RGB filters are their own colours). Returns a Figure."""
    k = components.shape[0]
    cols = min(k, 7)
    rows = math.ceil(k / cols)
    fig = new_figure(figsize=(max(1.2 * cols, 3.5) + 0.8, max(1.35 * rows, 2.0) + 0.5))  # 2.0: the bar's label
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for i, (component, ratio) in enumerate(zip(components, explained, strict=True)):
        lo, hi = component.min(), component.max()
        _show_image(axes.flat[i], (component - lo) / (hi - lo).clamp_min(1e-12))
        axes.flat[i].set_axis_on()
        axes.flat[i].set_title(f"PC{i + 1} {100 * ratio:.0f}%", fontsize=7)
    if components.shape[1] == 1:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        fig.colorbar(ScalarMappable(Normalize(0, 1), "gray"), ax=axes, shrink=0.8, label="component / its range")
    fig.suptitle("Patch-embedding filters:\nprincipal components", fontsize=10)
    return fig
