"""DINOv2's PCA of patch features: the projections against a PCA written here with numpy's SVD on the tokens
forward_features (or a forward hook on a block) gives, and against scikit-learn's PCA; the sign rule under a
permutation of the images, a re-run and negated tokens; the two-stage foreground recipe on tokens whose answer is
known; the figure's pixels at patch centres; hostile arguments with their messages.

Tolerance: 1e-5 of the largest projection (float64 both sides; measured about 1e-14 on these models)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from PIL import Image

from vit_einops.base.plot import save_figure
from vit_einops.inspect import PatchPCA, fit_patch_pca, patch_feature_pca, plot_patch_pca, write_report

RTOL = 1e-5
R = 3  # registers: not 1 or 4, so that an off-by-one or a hard-coded 4 shows
DPI = 120  # save_figure's default

FAMILIES = {
    "deit": ({"distill_token": True}, ("cls", "dist")),
    "dinov2_reg": (
        {"register_tokens": R, "layer_scale": 1e-5, "pos_embed_prefix": False, "image_size": (16, 24)},  # a 4x6 grid
        ("cls", "reg1", "reg2", "reg3"),
    ),
    "siglip": ({"class_token": False, "pool": "map"}, ()),
}


def family(name: str):
    options, prefix = FAMILIES[name]
    torch.manual_seed(0)
    return tiny_vit(TINY_RGB16, **options), prefix


def images_for(model, b: int = 3) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(b, 3, *model.config.image_size)


def reference_pca(tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(projections (m, k), components (k, d), explained variance ratio (k,)) by numpy's SVD of the centred tokens,
    each component's largest-magnitude loading made positive (the first, if tied)."""
    centred = tokens - tokens.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    vt = vt[:k]
    vt = vt * np.sign(vt[np.arange(k), np.abs(vt).argmax(axis=1)])[:, None]
    return centred @ vt.T, vt, (s**2 / (s**2).sum())[:k]


def assert_close(actual, expected) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    assert np.abs(actual - expected).max() <= RTOL * np.abs(expected).max()


def final_patch_tokens(model, x: torch.Tensor, num_prefix: int) -> np.ndarray:
    """forward_features' tokens with the first ``num_prefix`` dropped: (b * gh * gw, D) float64, row-major grid."""
    with torch.no_grad():
        tokens = model.forward_features(x)[:, num_prefix:]
    return tokens.reshape(-1, tokens.shape[-1]).double().numpy()


@pytest.mark.parametrize("name", FAMILIES)
def test_projections_on_the_grid_equal_an_svd_of_the_patch_tokens(name):
    model, prefix = family(name)
    x = images_for(model)
    result = patch_feature_pca(model, x, preprocessed=True)
    gh, gw = (side // 4 for side in model.config.image_size)
    assert isinstance(result, PatchPCA) and result.layout.prefix == prefix and result.layout.grid == (gh, gw)
    assert result.projections.shape == (3, gh, gw, 3) and result.foreground is None
    assert result.components.shape == (3, 32) and result.mean.shape == (32,)
    tokens = final_patch_tokens(model, x, len(prefix))
    assert tokens.shape == (3 * gh * gw, 32)  # the prefix tokens are not among the rows fitted on
    projections, components, ratio = reference_pca(tokens, 3)
    assert_close(result.projections.reshape(-1, 3), projections)
    assert_close(result.components, components)
    assert_close(result.mean, tokens.mean(axis=0))
    assert_close(result.explained_variance_ratio, ratio)


@pytest.mark.parametrize("layer", [0, -2])
def test_an_earlier_layer_reads_that_blocks_tokens_through_the_final_norm(layer):
    model, prefix = family("dinov2_reg")
    x = images_for(model, 2)
    outputs = []
    handle = model.blocks[layer].register_forward_hook(lambda _m, _a, out: outputs.append(out))
    with torch.no_grad():
        model(x)
    handle.remove()
    tokens = model.head.norm(outputs[0])[:, len(prefix) :].detach().flatten(0, 1).double().numpy()
    result = patch_feature_pca(model, x, 4, layer=layer, preprocessed=True)
    assert_close(result.projections.reshape(-1, 4), reference_pca(tokens, 4)[0])
    assert not np.allclose(tokens, final_patch_tokens(model, x, len(prefix)))  # depth 2: block 0 is not the last


def test_equal_to_scikit_learn_pca_with_and_without_the_foreground():
    decomposition = pytest.importorskip("sklearn.decomposition", reason="scikit-learn (the [train] extra) is absent")
    model, prefix = family("dinov2_reg")
    x = images_for(model, 4)
    tokens = final_patch_tokens(model, x, len(prefix))
    theirs = decomposition.PCA(n_components=5, svd_solver="full").fit(tokens)
    ours = patch_feature_pca(model, x, 5, preprocessed=True)
    assert_close(ours.projections.reshape(-1, 5), theirs.transform(tokens))
    assert_close(ours.components, theirs.components_)
    assert_close(ours.explained_variance_ratio, theirs.explained_variance_ratio_)

    first = decomposition.PCA(n_components=1, svd_solver="full").fit_transform(tokens)[:, 0]
    kept = tokens[first > 0]
    assert 0 < len(kept) < len(tokens)  # a real split, not everything or nothing
    second = decomposition.PCA(n_components=3, svd_solver="full").fit(kept)
    staged = patch_feature_pca(model, x, foreground=0.0, preprocessed=True)
    assert staged.foreground.reshape(-1).tolist() == (first > 0).tolist()
    assert_close(staged.projections.reshape(-1, 3)[first > 0], second.transform(kept))
    assert_close(staged.components, second.components_)
    assert (staged.projections.reshape(-1, 3)[first <= 0] == 0).all()


def test_signs_follow_the_largest_loading_and_not_the_order_the_run_or_the_sign_of_the_tokens():
    model, _ = family("deit")
    x = images_for(model, 4)
    result = patch_feature_pca(model, x, 4, preprocessed=True)
    largest = result.components.abs().argmax(dim=1)
    assert (result.components[torch.arange(4), largest] > 0).all()

    again = patch_feature_pca(model, x, 4, preprocessed=True)
    assert torch.equal(again.projections, result.projections) and torch.equal(again.components, result.components)

    order = torch.tensor([2, 0, 3, 1])
    permuted = patch_feature_pca(model, x[order], 4, preprocessed=True)
    assert_close(permuted.components, result.components)
    assert_close(permuted.projections, result.projections[order])

    # LayerNorm with its weight and bias negated gives exactly the negated tokens: the same components, negated
    # projections.
    with torch.no_grad():
        model.head.norm.weight.neg_()
        model.head.norm.bias.neg_()
    negated = patch_feature_pca(model, x, 4, preprocessed=True)
    assert torch.equal(negated.components, result.components)
    assert torch.equal(negated.projections, -result.projections)


def planted_tokens(gh: int, gw: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images of tokens (2, dim, gh, gw), as forward_intermediates gives them, and the object (2, gh, gw): a
    block of patches at +c, the rest at -c, plus small noise. c's largest loading is positive, so the sign rule
    puts the object on the positive side of the first component."""
    generator = torch.Generator().manual_seed(0)
    c = torch.zeros(dim)
    c[3], c[5] = 10.0, -4.0
    obj = torch.zeros(2, gh, gw, dtype=torch.bool)
    obj[0, 1:3, 1:4] = True
    obj[1, 0:2, 2:5] = True
    tokens = torch.where(obj[..., None], c, -c) + 0.1 * torch.randn(2, gh, gw, dim, generator=generator)
    return tokens.permute(0, 3, 1, 2), obj


def test_the_foreground_recipe_separates_planted_objects_and_fits_the_second_pca_on_them(monkeypatch):
    model, _ = family("dinov2_reg")
    tokens, obj = planted_tokens(4, 6, 32)
    monkeypatch.setattr(model, "forward_intermediates", lambda *args, **kwargs: [tokens])
    x = images_for(model, 2)
    result = patch_feature_pca(model, x, foreground=0.0, preprocessed=True)
    assert torch.equal(result.foreground, obj)
    flat = tokens.permute(0, 2, 3, 1).double()  # (b, gh, gw, d)
    projections, components, ratio = reference_pca(flat[obj].numpy(), 3)
    assert_close(result.projections[obj], projections)
    assert_close(result.components, components)
    assert_close(result.explained_variance_ratio, ratio)
    assert (result.projections[~obj] == 0).all() and (result.rgb[~obj] == 0).all()  # the background is black
    # The object's colours span [0, 1] per component over the object alone.
    assert torch.allclose(result.rgb[obj].amin(0), torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(result.rgb[obj].amax(0), torch.ones(3, dtype=torch.float64))
    # Without the threshold, the first component is the object against the rest, the object positive.
    plain = patch_feature_pca(model, x, preprocessed=True)
    assert torch.equal(plain.projections[..., 0] > 0, obj) and plain.explained_variance_ratio[0] > 0.99

    with pytest.raises(ValueError, match=r"foreground 1000.0 keeps 0 of 48 patches .*n_components 3 needs"):
        patch_feature_pca(model, x, foreground=1000.0, preprocessed=True)


def expected_colours(projections: np.ndarray) -> np.ndarray:
    """The first three components min-max scaled each over every patch of every image: (b, gh, gw, 3)."""
    shown = projections[..., :3]
    low, high = shown.min(axis=(0, 1, 2)), shown.max(axis=(0, 1, 2))
    return (shown - low) / (high - low)


def pixels_at_patch_centres(fig, png: bytes, b: int, grid: tuple[int, int]) -> np.ndarray:
    """(b, gh, gw, 3) pixels of the saved figure at each patch's centre in the PCA row (the last row of axes): the
    axes' box cut into gh x gw cells, row 0 at the top."""
    picture = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    scale = DPI / fig.dpi  # the axes' boxes are in pixels at the figure's own dpi
    gh, gw = grid
    out = np.zeros((b, gh, gw, 3))
    for i, ax in enumerate(fig.axes[-b:]):
        box = ax.get_window_extent()
        for r in range(gh):
            for c in range(gw):
                x = (box.x0 + (c + 0.5) / gw * box.width) * scale
                y = (box.y1 - (r + 0.5) / gh * box.height) * scale  # from the bottom
                out[i, r, c] = picture[int(picture.shape[0] - y), int(x)]
    return out / 255


def test_the_figure_draws_the_scaled_components_as_rgb_at_every_patch(tmp_path):
    model, _ = family("dinov2_reg")
    x = images_for(model, 2)
    result = patch_feature_pca(model, x, preprocessed=True)
    fig = plot_patch_pca(result, x)
    png = save_figure(fig, tmp_path / "pca.png").read_bytes()
    width, height = Image.open(io.BytesIO(png)).size
    assert (width, height) == tuple(round(side * DPI) for side in fig.get_size_inches())
    assert width >= 600  # labels are whole at this width
    colours = expected_colours(result.projections.numpy())
    assert np.abs(pixels_at_patch_centres(fig, png, 2, (4, 6)) - colours).max() <= 1.5 / 255
    assert np.allclose(result.rgb.numpy(), colours)


def test_bad_arguments_are_refused_by_name():
    model, _ = family("siglip")
    x = images_for(model, 1)
    for bad, error, message in [
        (0, ValueError, "n_components must be a positive int, got 0"),
        (33, ValueError, "n_components 33 exceeds the token width D = 32"),
        (17, ValueError, "n_components 17 exceeds the 16 patches to fit on"),
        (2.0, TypeError, "n_components must be an int, got 2.0 of type float"),
        (True, TypeError, "n_components must be an int, got True of type bool"),
    ]:
        with pytest.raises(error, match=message):
            patch_feature_pca(model, x, bad, preprocessed=True)
    with pytest.raises(ValueError, match=r"layer 2 out of range for a ViT of depth 2 \(valid: -2..1\)"):
        patch_feature_pca(model, x, layer=2, preprocessed=True)
    with pytest.raises(TypeError, match="foreground must be a float threshold"):
        patch_feature_pca(model, x, foreground="0.5", preprocessed=True)
    with pytest.raises(ValueError, match="foreground must be a float threshold.*nan"):
        patch_feature_pca(model, x, foreground=float("nan"), preprocessed=True)
    with pytest.raises(TypeError, match="result must be the PatchPCA of patch_feature_pca, got tuple"):
        plot_patch_pca((1, 2))
    with pytest.raises(ValueError, match=r"images must be the 1 images of the result .* got \(2, 3, 16, 16\)"):
        plot_patch_pca(patch_feature_pca(model, x, preprocessed=True), images_for(model, 2))
    with torch.no_grad():
        model.head.norm.bias[0] = float("nan")
    with pytest.raises(ValueError, match="the patch features of layer -1 hold non-finite values"):
        patch_feature_pca(model, x, preprocessed=True)



SHAPES = "the features must be tokens (b, n, D) in the order of the layout or patch tokens on the grid (b, gh, gw, D)"


@pytest.mark.parametrize(
    "features, error, message",
    [
        (torch.rand(17, 32), ValueError, f"{SHAPES}, got shape (17, 32)"),
        (torch.rand(32), ValueError, f"{SHAPES}, got shape (32,)"),
        (torch.rand(1, 1, 4, 4, 32), ValueError, f"{SHAPES}, got shape (1, 1, 4, 4, 32)"),
        (torch.full((2, 17, 32), float("nan")), ValueError, "the features hold non-finite values (nan or inf)"),
        (torch.rand(2, 4, 4, 32).index_put((torch.tensor(1),), torch.tensor(float("inf"))), ValueError,
         "the features hold non-finite values (nan or inf)"),
        (torch.ones(2, 17, 32, dtype=torch.long), TypeError, "the features must be floating point tokens, got dtype "
         "torch.int64"),
        ([[0.0] * 32] * 17, TypeError, "the features must be a torch.Tensor, got list"),
    ],
)  # fmt: skip
def test_fit_patch_pca_refuses_features_of_another_rank_or_not_finite(features, error, message):
    """A 2-D input ended in an IndexError, nan tokens in linalg's failure to converge."""
    layout = tiny_vit(TINY_RGB16).patch_embed.layout((16, 16))  # a class token and a 4x4 grid: 17 tokens
    with pytest.raises(error) as refused:
        fit_patch_pca(features, layout)
    assert str(refused.value) == message


def test_tokens_all_equal_have_zero_projections_and_ratios_not_nan(monkeypatch):
    model, _ = family("siglip")
    monkeypatch.setattr(model, "forward_intermediates", lambda *args, **kwargs: [torch.ones(2, 32, 4, 4)])
    result = patch_feature_pca(model, images_for(model, 2), preprocessed=True)
    assert (result.projections == 0).all() and (result.explained_variance_ratio == 0).all()
    assert (result.rgb == 0).all()


def test_inspect_report_draws_the_pca_of_its_images(tmp_path, rendered_only):
    rendered_only("patch_pca")
    model, prefix = family("deit")
    x = images_for(model, 2)
    paths = write_report(model, x, tmp_path / "r")
    arrays = np.load(paths["arrays"])
    projections, components, _ = reference_pca(final_patch_tokens(model, x, len(prefix)), 3)
    assert_close(arrays["patch_pca"].reshape(-1, 3), projections)
    assert_close(arrays["patch_pca_components"], components)
    png = paths["patch_pca"].read_bytes()
    # The same figure drawn again gives the panels' places; the colours come from the arrays alone.
    fig = plot_patch_pca(patch_feature_pca(model, x, preprocessed=True), x)
    assert Image.open(io.BytesIO(png)).size == tuple(round(side * DPI) for side in fig.get_size_inches())
    save_figure(fig, tmp_path / "again.png")  # drawn at the report's dpi, so that its layout is the report's
    drawn = pixels_at_patch_centres(fig, png, 2, (4, 4))
    assert np.abs(drawn - expected_colours(arrays["patch_pca"])).max() <= 1.5 / 255
