"""Figures for notebooks: Figure objects, no backend change, readable head grids, one numbering of layers and heads."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from _figures import unreadable
from _tiny import TINY_RGB, tiny_vit
from matplotlib.figure import Figure
from PIL import Image

from vit_einops import TokenLayout, ViT
from vit_einops.inspect import (
    DinoView,
    decompose,
    dino_mask,
    logit_lens,
    model_position_similarity,
    plot_attention_distance,
    plot_attention_overlays,
    plot_decomposition,
    plot_dino_view,
    plot_filters,
    plot_methods,
    plot_position_similarity,
    plot_prefix_share,
    plot_token_norms,
    record_attention,
    save_figure,
    show_attention,
    write_report,
)
from vit_einops.train import plot_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def vit(heads: int = 3) -> ViT:
    """16x16 images in a 4x4 grid of patches, ``heads`` heads of 8: the head grid's layout depends on ``heads``."""
    return tiny_vit(TINY_RGB, image_size=16, patch_size=4, dim=8 * heads, heads=heads, num_classes=4)


def image_axes(fig: Figure) -> list:
    """The panels that show an image (colour bars excluded), in every subfigure."""
    axes = [ax for ax in fig.get_axes() if ax.get_images() and ax.axison]
    return axes


def class_attention_by_softmax_hook(model: ViT, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The class token's row of A in block ``layer`` from a hook on the einsum path's softmax: (h, N')."""
    seen = []
    handle = model.blocks[layer].attn.mha.attend.softmax.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        model.set_attn_impl("einsum")(x)
    finally:
        handle.remove()
    return seen[0][0, :, 0, 1:]


def test_every_plot_function_returns_a_figure_that_pyplot_does_not_hold():
    records = [dict(epoch=e, train_loss=1.0 / e, train_acc=0.5, test_acc=0.4 + 0.1 * e) for e in (1, 2)]
    figures = [
        plot_curves(records),
        plot_attention_overlays(torch.rand(2, 3, 16, 16), torch.rand(2, 3, 4, 4), torch.rand(2, 4, 4), layer=1),
        plot_attention_distance(torch.rand(2, 3) * 10, uniform_distance=5.0),
        plot_position_similarity(torch.rand(4, 4, 4, 4)),
        plot_filters(torch.rand(3, 1, 4, 4), torch.tensor([0.5, 0.3, 0.2])),
        show_attention(vit(), torch.rand(3, 16, 16)),
        plot_token_norms(torch.rand(2, 3, 21), TokenLayout(("cls", "reg1", "reg2", "reg3", "reg4"), (4, 4))),
        plot_prefix_share(torch.rand(2, 3, 4, 2) / 2, TokenLayout(("cls", "dist"), (4, 4))),
        plot_dino_view(torch.rand(1, 3, 16, 16), DinoView(torch.rand(1, 2, 4, 4), torch.rand(1, 2, 4, 4) > 0.5),
                       layer=1, keep=0.6),  # fmt: skip
        plot_methods(torch.rand(2, 1, 8, 8), {"attention": torch.rand(2, 4, 4), "random": torch.rand(2, 4, 4)}),
    ]
    assert all(type(fig) is Figure for fig in figures)
    if "matplotlib.pyplot" in sys.modules:  # another test may have imported it; none of ours registered there
        assert sys.modules["matplotlib.pyplot"].get_fignums() == []


def test_methods_figure_lays_each_map_over_its_image_under_its_label():
    """plot_methods' one picture: panel (image i, column c) is the input (column 0), or 0.4 * the input + 0.6 * the
    colour map of method c's map, bilinearly upsampled and divided by its maximum; headings name the labels, one
    parameter a line, and image names are literal text."""
    from matplotlib import colormaps

    images = torch.rand(2, 3, 8, 8)
    maps = {"a": torch.rand(2, 2, 2), "rollout (residual 0.5, head_fusion max)": torch.rand(2, 2, 2)}
    fig = plot_methods(images, maps, ["$x^{2$", "b"])
    ax = fig.axes[0]
    mosaic = ax.get_images()[0].get_array()
    assert mosaic.shape == (2 * 8 + 1, 3 * 8 + 2, 3)  # a 1-pixel white gap between panels
    for i in range(2):
        picture = images[i].permute(1, 2, 0).numpy()
        np.testing.assert_allclose(mosaic[i * 9 : i * 9 + 8, :8], picture, atol=1e-6)
        for c, grid in enumerate(maps.values(), start=1):
            up = torch.nn.functional.interpolate(grid[i][None, None], size=(8, 8), mode="bilinear")[0, 0]
            heat = colormaps["inferno"]((up / up.max()).numpy())[..., :3]
            np.testing.assert_allclose(mosaic[i * 9 : i * 9 + 8, c * 9 : c * 9 + 8], 0.4 * picture + 0.6 * heat,
                                       atol=1e-6)  # fmt: skip
    assert [t.get_text() for t in ax.get_xticklabels()] == ["input", "a", "rollout\n(residual 0.5,\nhead_fusion max)"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["$x^{2$", "b"]
    fig.savefig(io.BytesIO(), format="png")  # mathtext in a name would fail to draw


def test_importing_and_plotting_leave_the_backend_alone():
    """Library code never picks a backend: a notebook's inline backend (here the user's choice, svg) stays."""
    code = (
        "import matplotlib, sys, torch\n"
        "matplotlib.use('svg')\n"
        "import vit_einops, vit_einops.inspect, vit_einops.train.plots, vit_einops.base.plot\n"
        "from vit_einops import ViT\n"
        "m = ViT(image_size=8, patch_size=4, dim=8, depth=1, heads=2, mlp_dim=16, num_classes=2)\n"
        "vit_einops.inspect.show_attention(m, torch.rand(3, 8, 8))\n"
        "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["svg", "False"]


@pytest.mark.parametrize("heads", [3, 12, 16])
def test_heads_are_a_near_square_grid_with_a_colour_bar(heads):
    model = vit(heads)
    fig = show_attention(model, torch.rand(3, 16, 16))
    panels = image_axes(fig)
    assert len(panels) == heads + 2  # input, rollout, every head
    cols = math.ceil(math.sqrt(heads + 2))
    assert len({round(ax.get_position().x0, 3) for ax in panels}) == cols
    assert len({round(ax.get_position().y0, 3) for ax in panels}) == math.ceil((heads + 2) / cols)
    colorbars = [ax for ax in fig.get_axes() if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "attention / panel maximum"
    titles = [ax.get_title().split("\n")[0] for ax in panels]
    assert titles == ["input", "rollout", *[f"layer 1 head {h}" for h in range(heads)]]


@pytest.mark.parametrize("layer, shown", [(0, 0), (-1, 1), (-2, 0)])
@torch.no_grad()
def test_show_attention_draws_the_chosen_layer(layer, shown):
    """Each head panel's title carries its map's maximum: compared with A read off the einsum path's softmax."""
    model = vit(3).set_attn_impl("sdpa")
    x = torch.rand(3, 16, 16)
    fig = show_attention(model, x, layer=layer)
    expected = class_attention_by_softmax_hook(model, x[None], shown)
    heads = [ax for ax in image_axes(fig) if "head" in ax.get_title()]
    for h, ax in enumerate(heads):
        name, maximum = ax.get_title().split("\n")
        assert name == f"layer {shown} head {h}"
        assert float(maximum.removeprefix("max ")) == pytest.approx(expected[h].max().item(), rel=1e-3)


def test_show_attention_restores_the_training_mode_and_checks_its_arguments():
    model = vit().train()
    show_attention(model, torch.rand(1, 3, 16, 16))
    assert model.training
    with pytest.raises(ValueError, match=r"layer 2 out of range for a ViT of depth 2 \(valid: -2..1\)"):
        show_attention(model, torch.rand(3, 16, 16), layer=2)
    with pytest.raises(ValueError, match=r"one image: \(C, H, W\) or \(1, C, H, W\), got shape \(2, 3, 16, 16\)"):
        show_attention(model, torch.rand(2, 3, 16, 16))
    with pytest.raises(TypeError, match="image must be a"):
        show_attention(torch.nn.Module(), np.zeros((3, 16, 16)))


@pytest.mark.parametrize("head", [0, 2, -1])
@torch.no_grad()
def test_show_attention_head_draws_that_heads_map_alone(head):
    """head=k: the input and head k's panel, whose map is record_attention's slice [layer, 0, k, 0, 1:] on the
    patch grid, upsampled bilinearly and scaled to its maximum (float32 tolerance: rtol 1.3e-6, atol 1e-5); and
    the same panel as head k's in the figure of every head."""
    model = vit(3)
    x = torch.rand(3, 16, 16)
    k = head % 3
    fig = show_attention(model, x, layer=0, head=head)
    panels = image_axes(fig)
    assert [ax.get_title().split("\n")[0] for ax in panels] == ["input", f"layer 0 head {k}"]
    _, maps, _ = record_attention(model, x[None])
    grid = maps[0, 0, k, 0, 1:].reshape(4, 4)  # the class token's row over the 4x4 patches, row-major
    up = torch.nn.functional.interpolate(grid[None, None], size=(16, 16), mode="bilinear", align_corners=False)[0, 0]
    drawn = torch.from_numpy(np.asarray(panels[1].get_images()[-1].get_array()))
    torch.testing.assert_close(drawn, up / up.max())
    maximum = float(panels[1].get_title().split("\n")[1].removeprefix("max "))
    assert maximum == pytest.approx(grid.max().item(), rel=1e-3)
    every = [ax for ax in image_axes(show_attention(model, x, layer=0)) if ax.get_title().startswith("layer")]
    assert np.array_equal(np.asarray(every[k].get_images()[-1].get_array()), drawn.numpy())


def test_show_attention_refuses_a_head_out_of_range():
    with pytest.raises(ValueError, match=re.escape("head 3 out of range for a layer of 3 heads (valid: -3..2)")):
        show_attention(vit(3), torch.rand(3, 16, 16), head=3)
    with pytest.raises(TypeError, match="head must be an int"):
        show_attention(vit(3), torch.rand(3, 16, 16), head=1.0)


def test_show_attention_names_the_prediction():
    model = vit()
    model.reset_classifier(4, class_names=["a", "b", "c", "d"])
    fig = show_attention(model, torch.rand(3, 16, 16))
    assert fig._suptitle.get_text().startswith("layer 1 of 0..1; predicted a (p 0.25)")  # zero head: uniform


@torch.no_grad()
def test_write_report_layer_chooses_the_drawn_layer(tmp_path, rendered_only):
    drawn = ("attention", "attention_distance", "position_similarity", "embedding_filters", "prefix_share",
             "token_norms")  # fmt: skip
    rendered_only(*drawn)  # the figures checked below; the methods' and the PCA's are not
    model = vit(4)
    images = torch.rand(2, 3, 16, 16)
    paths = write_report(model, images, tmp_path, layer=0)
    arrays = np.load(tmp_path / "arrays.npz")
    assert int(arrays["class_attention_layer"]) == 0
    expected = class_attention_by_softmax_hook(model, images, 0)  # image 0
    np.testing.assert_allclose(arrays["class_attention"][0].reshape(4, -1), expected.numpy(), rtol=1e-5, atol=1e-7)
    for name in drawn:
        assert paths[name] == tmp_path / f"{name}.png" and paths[name].read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="layer -3 out of range"):
        write_report(model, images, tmp_path / "other", layer=-3)
    assert not (tmp_path / "other").exists()  # refused before anything was written


def png_width(data: bytes) -> int:
    return Image.open(io.BytesIO(data)).size[0]


@pytest.mark.parametrize("heads, head", [(3, None), (3, 1), (12, None), (12, -1), (16, None)])
def test_show_attention_is_whole_at_its_default_size(heads, head):
    """At least 600 px wide as fig.savefig writes it (the figure's own dpi), every label inside the picture (the
    colour bar's too, under the one head's panel) and no two titles on top of each other."""
    fig = show_attention(vit(heads), torch.rand(3, 16, 16), head=head)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert png_width(buffer.getvalue()) == round(fig.get_figwidth() * fig.dpi) >= 600
    assert unreadable(fig) == []
    colorbar = next(ax for ax in fig.get_axes() if ax.get_label() == "<colorbar>")
    assert colorbar.get_ylabel() == "attention / panel maximum"


def test_every_figure_is_whole_at_its_default_size():
    """A 14x14 grid's DINO view (the report's attention.png) keeps its counts off the next panel's title; the
    filters' colour bar with one row of grey components keeps its label inside."""
    mask = torch.rand(1, 12, 14, 14) > 0.5  # one image: the titles that met were neighbours in a row
    figures = {
        "dino": plot_dino_view(torch.rand(1, 3, 56, 56), DinoView(torch.rand(1, 12, 14, 14) / 81, mask),
                               ["a.jpg"], layer=11, keep=0.6),  # fmt: skip
        "overlays": plot_attention_overlays(torch.rand(3, 3, 16, 16), torch.rand(3, 16, 4, 4), torch.rand(3, 4, 4),
                                            layer=11),  # fmt: skip
        "distance": plot_attention_distance(torch.rand(12, 16) * 100, uniform_distance=50.0),
        "similarity": plot_position_similarity(torch.rand(5, 5, 5, 5)),
        "small similarity": plot_position_similarity(torch.rand(2, 2, 2, 2)),
        "grey filters": plot_filters(torch.rand(3, 1, 4, 4), torch.tensor([0.5, 0.3, 0.2])),
        "rgb filters": plot_filters(torch.rand(12, 3, 16, 16), torch.rand(12)),
        "norms": plot_token_norms(torch.rand(12, 3, 21), TokenLayout(("cls", "reg1", "reg2", "reg3", "reg4"), (4, 4))),
        "share": plot_prefix_share(torch.rand(12, 3, 4, 2) / 2, TokenLayout(("cls", "dist"), (4, 4))),
    }
    assert {name: unreadable(fig) for name, fig in figures.items()} == {name: [] for name in figures}
    titles = [ax.get_title() for ax in figures["dino"].get_axes() if ax.get_title().startswith("layer 11 head 0")]
    assert len(titles) == 1 and all(re.fullmatch(r"layer 11 head 0\nmax \S+\nkeeps \d+/196", t) for t in titles)


def test_unreadable_sees_a_cut_label_and_overlapping_titles():
    """The measure the tests above rely on finds what it is for: a colour bar's label longer than a 2-inch figure
    is tall, and two titles wider than their panels."""
    from matplotlib.cm import ScalarMappable

    fig = Figure(figsize=(2, 2), layout="constrained")
    left, right = fig.subplots(1, 2)
    fig.colorbar(ScalarMappable(), ax=[left, right], label="a colour-bar label longer than the figure")
    left.set_title("a title wider than its panel")
    right.set_title("and its neighbour's")
    problems = unreadable(fig)
    assert any("ylabel='a colour-bar label longer than the figure'> reaches outside" in p for p in problems)
    assert "titles 'a title wider than its panel' and \"and its neighbour's\" overlap" in problems


def test_position_similarity_takes_the_similarity_not_the_model():
    model = vit()
    with pytest.raises(TypeError, match="similarity must be a torch.Tensor, got ViT"):
        plot_position_similarity(model)
    with pytest.raises(ValueError, match=r"takes similarity \(gh, gw, gh, gw\).* got shape \(4, 4, 16\)"):
        plot_position_similarity(model_position_similarity(model).flatten(2))
    similarity = model_position_similarity(model)  # (4, 4, 4, 4)
    [panel] = image_axes(plot_position_similarity(similarity))
    drawn = np.ma.filled(panel.get_images()[0].get_array(), np.nan)  # one picture of the 4x4 grid's tiles
    assert drawn.shape == (19, 19) and np.isnan(drawn[4::5]).all() and np.isnan(drawn[:, 4::5]).all()
    for r in range(4):
        for c in range(4):  # tile (r, c), between the blank separators, is that patch's similarity map
            np.testing.assert_array_equal(drawn[5 * r : 5 * r + 4, 5 * c : 5 * c + 4], similarity[r, c].float().numpy())


@pytest.mark.parametrize("inches, pixels", [(4.0, 600), (2.5, 600), (6.4, 768)])
def test_save_figure_writes_at_least_600_px(tmp_path, inches, pixels):
    """120 dpi, or more for a figure under 5 inches: the picture is 600 px wide or more; a dpi given is kept."""
    fig = Figure(figsize=(inches, 2), layout="constrained")
    fig.subplots().set_title("t")
    assert png_width(save_figure(fig, tmp_path / "f.png").read_bytes()) == pixels
    assert png_width(save_figure(fig, tmp_path / "g.png", dpi=50).read_bytes()) == round(inches * 50)


def test_save_figure_is_a_separate_atomic_step(tmp_path):
    fig = plot_attention_distance(torch.rand(3, 2))
    path = save_figure(fig, tmp_path / "d.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert [p.name for p in tmp_path.iterdir()] == ["d.png"]  # no temporary file left behind
    assert save_figure(fig, tmp_path / "again.png").read_bytes()[:8] == PNG_MAGIC  # the figure stays usable


def test_distance_figure_names_heads_whose_distance_is_undefined():
    """nan is a head attending only to the class token: drawn as a red cross at 0 on its layer, counted in the
    legend; the defined heads keep their dots."""
    distance = torch.tensor([[10.0, float("nan")], [float("nan"), float("nan")], [4.0, 6.0]])
    ax = plot_attention_distance(distance, layout=TokenLayout(("cls",), (2, 2))).axes[0]
    crosses = [c for c in ax.collections if c.get_label().startswith("n/a")]
    assert len(crosses) == 1 and crosses[0].get_label() == "n/a: attends only to the class token (3 heads)"
    assert crosses[0].get_offsets().tolist() == [[0, 0], [1, 0], [1, 0]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [crosses[0].get_label()]
    assert plot_attention_distance(torch.ones(3, 2)).axes[0].get_legend() is None  # no undefined head, no legend


def test_distance_figure_names_the_prefix_tokens_a_model_has():
    distance = torch.tensor([[float("nan"), 1.0]])
    ax = plot_attention_distance(distance, layout=TokenLayout(("cls", "reg1"), (2, 2))).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["n/a: attends only to prefix tokens (cls, reg1) (1 head)"]
    unnamed = plot_attention_distance(distance).axes[0].get_legend().get_texts()  # no layout: no names to give
    assert [t.get_text() for t in unnamed] == ["n/a: attends only to prefix tokens (1 head)"]


def test_token_norm_chart_marks_each_prefix_token_beside_the_patches():
    """The histogram holds every patch token of the chosen block, and each prefix token is a named line at its
    mean norm over the images; the right panel follows the patches' median and largest norm, block by block."""
    names = ("cls", "reg1", "reg2")
    norms = torch.rand(2, 4, 3 + 9) + 1
    norms[1, 0, 3 + 5] = 50.0  # one high-norm patch: the register paper's artifact
    hist, lines = plot_token_norms(norms, TokenLayout(names, (3, 3)), layer=1).axes
    assert sum(bar.get_height() for bar in hist.patches) == 4 * 9
    assert [t.get_text() for t in hist.get_legend().get_texts()] == ["patch tokens", *names]
    for p, line in enumerate(hist.get_lines()):
        assert line.get_xdata()[0] == pytest.approx(norms[1, :, p].mean().item())
    assert hist.get_xlim()[1] >= 50
    drawn = {line.get_label(): line.get_ydata() for line in lines.get_lines()}
    assert list(drawn) == ["patches: median", "patches: largest", *names]
    np.testing.assert_allclose(drawn["patches: largest"], norms[..., 3:].flatten(1).max(1).values.numpy(), rtol=1e-6)
    np.testing.assert_allclose(drawn["reg2"], norms[..., 2].mean(1).numpy(), rtol=1e-6)


def test_prefix_share_chart_draws_each_tokens_mean_and_the_patches_rest():
    share = torch.rand(3, 2, 4, 2) / 2  # (layers, images, heads, prefix tokens)
    ax = plot_prefix_share(share, TokenLayout(("cls", "dist"), (2, 2))).axes[0]
    drawn = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
    assert list(drawn) == ["cls", "dist", "patches"]
    np.testing.assert_allclose(drawn["dist"], share[..., 1].double().mean((1, 2)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(drawn["patches"], 1 - share.double().sum(-1).mean((1, 2)).numpy(), rtol=1e-6)


def test_dino_figure_counts_and_outlines_each_heads_kept_patches():
    attention = torch.rand(2, 3, 4, 4)
    mask = dino_mask(attention.flatten(-2)).unflatten(-1, (4, 4))
    mask[1, 2] = True  # a mask keeping every patch has no border to draw
    fig = plot_dino_view(torch.rand(2, 3, 16, 16), DinoView(attention, mask), ["a", "b"], layer=5, keep=0.6)
    heads = [ax for ax in image_axes(fig) if ax.get_title().startswith("layer")]
    assert len(heads) == 6
    for ax, (i, h) in zip(heads, [(i, h) for i in range(2) for h in range(3)], strict=True):
        name, _, kept = ax.get_title().split("\n")
        assert name == f"layer 5 head {h}"
        assert kept == f"keeps {int(mask[i, h].sum())}/16"
        assert len(ax.collections) == (0 if (i, h) == (1, 2) else 1)  # the outline's contour set
    suptitles = [sub._suptitle.get_text() for sub in fig.subfigs]
    assert suptitles == ["a\noutlined: 60% of the mass", "b\noutlined: 60% of the mass"]


@pytest.mark.parametrize("b", [1, 3])
def test_target_figure_panels_line_up_in_columns_and_its_colour_bar_says_relevance(b):
    """target.png, whatever the number of images: each image's input, relevance and similarity panels share one
    column (the colour bars sit in a column of their own, not beside one row), no blank column is left beside one
    image, and the relevance bar names what the map is."""
    from vit_einops.inspect.figures import plot_target_relevance

    images, grid = torch.rand(b, 3, 16, 16), torch.rand(b, 4, 4)
    fig = plot_target_relevance(images, grid, "patch (1, 1)", [f"img{i}.png" for i in range(b)],
                                similarity=grid * 2 - 1, patch=(1, 1))  # fmt: skip
    fig.draw_without_rendering()
    bars = [ax for ax in fig.axes if ax.get_ylabel()]
    panels = [ax for ax in fig.axes if ax.images and ax not in bars]
    columns = sorted({round(ax.get_position().x0, 3) for ax in panels})
    assert len(panels) == 3 * b and len(columns) == b  # three rows of panels in b columns, aligned
    assert [bar.get_ylabel() for bar in bars] == ["relevance / panel maximum", "cosine similarity"]
    assert min(bar.get_position().x0 for bar in bars) > max(ax.get_position().x1 for ax in panels)
    assert fig.get_figwidth() == pytest.approx(2.4 * b + 1.2)  # as wide as its panels: no empty column
    assert [ax.get_title() for ax in panels[:b]] == [f"img{i}.png" for i in range(b)]


def test_the_decomposition_figure_is_whole_with_a_grid_the_mlps_and_the_top_heads_source_maps():
    """decomposition.png's figure at ViT-B's 12 x 12 heads and at 2 x 4 on two images: whole at its default size,
    a grid and an MLP column per image, and the top heads' maps titled with their shares, largest first."""
    torch.manual_seed(0)
    for depth, heads, b in ((12, 12, 1), (2, 4, 2)):
        model = tiny_vit(TINY_RGB, image_size=16, patch_size=4, dim=4 * heads, depth=depth, heads=heads).eval()
        images = torch.rand(b, 3, 16, 16)
        d = decompose(model, images, by_source=True, preprocessed=True)
        fig = plot_decomposition(images, d.heads, d.mlps, d.total, d.by_source, d.layout, ["a.jpg\npredicted 3"] * b)
        assert unreadable(fig) == []
        assert len(image_axes(fig)) == b * (2 + 3)
        shares = d.heads[0].flatten()
        top = shares.abs().argsort(descending=True)[:3].tolist()
        expected = [f"layer {i // heads} head {i % heads}\nshare {float(shares[i]):.3g}" for i in top]
        assert [ax.get_title() for ax in fig.get_axes()[2:5]] == expected
    with pytest.raises(ValueError, match="top must be a positive int, got 0"):
        plot_decomposition(images, d.heads, d.mlps, d.total, d.by_source, d.layout, top=0)


def test_write_report_draws_decomposition_png_and_saves_decomposes_numbers(tmp_path, rendered_only):
    """A classifier's report: decomposition.png written whole, and its arrays are decompose's and logit_lens's
    numbers for the predicted class; a tower without a target has neither (nothing to decompose)."""
    rendered_only("decomposition")
    torch.manual_seed(0)
    model, images = vit(), torch.rand(2, 3, 16, 16)
    paths = write_report(model, images, tmp_path / "r")
    data = paths["decomposition"].read_bytes()
    assert paths["decomposition"] == tmp_path / "r" / "decomposition.png" and data.startswith(PNG_MAGIC)
    Image.open(io.BytesIO(data)).verify()  # whole: a truncated PNG fails here
    d = decompose(model, images, by_source=True, preprocessed=True)
    with np.load(paths["arrays"]) as arrays:
        for name in ("total", "heads", "mlps", "rest"):
            np.testing.assert_array_equal(arrays[f"decomposition_{name}"], getattr(d, name).numpy())
        np.testing.assert_array_equal(arrays["decomposition_sources"], d.by_source.numpy())
        assert list(arrays["decomposition_part_names"]) == list(d.parts)
        np.testing.assert_array_equal(arrays["decomposition_parts"], torch.stack(list(d.parts.values())).numpy())
        np.testing.assert_array_equal(arrays["logit_lens"], logit_lens(model, images, preprocessed=True).numpy())
    tower = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=0).eval()
    paths = write_report(tower, images, tmp_path / "t")
    assert "decomposition" not in paths and not (tmp_path / "t" / "decomposition.png").exists()
    with np.load(paths["arrays"]) as arrays:
        assert not [name for name in arrays.files if "decomposition" in name or name == "logit_lens"]
