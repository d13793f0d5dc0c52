"""PCA of patch features, DINOv2's picture (Oquab et al. 2024, "DINOv2: Learning Robust Visual Features without
Supervision", Fig. 1 and the section "PCA of patch features"): one PCA fitted jointly over the patch tokens of all
the images, its first three components drawn as the red, green and blue of each patch, so that patches the model
sees alike share a colour across images.

Axes: b images, gh gw the patch grid, d the token width D, k components, m the patches fitted on.

The PCA is scikit-learn's ``PCA(n_components=k)`` (full solver): the tokens X (m, d) are centred on their mean mu;
the components are the k leading eigenvectors of the covariance ``(X - mu)^T (X - mu)`` (the right singular
vectors of ``X - mu``), the projections ``(X - mu) V_k^T``, and the explained variance ratio is each component's
eigenvalue over the total variance. It runs in float64 on the (d, d) covariance, so its memory is O(D^2) however
many patches there are.

Signs. A component is defined only up to its sign. The rule here is scikit-learn's (``svd_flip`` with
``u_based_decision=False``, what its PCA does): each component's loading of largest magnitude is positive (the first
of them, if several tie). The rule reads the components alone, so the result does not depend on the order of the
images or on re-running, and negating every token leaves the components as they are and negates the projections.

Foreground (``foreground=t``), the paper's two-stage recipe: a first PCA over all the patches; the patches whose
first component is above t are the foreground (the paper keeps "patches with a positive value", t = 0); a second
PCA, fitted on the foreground patches alone, gives the projections, and the background is drawn black. Which side
of the first component holds the object is the model's, not the recipe's: the sign rule makes it reproducible, and
another t (or a look at ``foreground``) says whether it is the side wanted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from einops import rearrange

from ..base.checks import check_dense_tensor, check_index, check_positive_int, check_real
from ..base.plot import new_figure
from ..base.text import printable_lines
from ..images import to_display
from ..inputs import model_inputs
from ..network.patch_embed import TokenLayout
from ..network.sizes import check_model_forward
from .figures import MIN_WIDTH_INCHES

PCA_PANEL_INCHES = 2.5  # one image or PCA panel


class PatchPCA(NamedTuple):
    """What :func:`patch_feature_pca` returns (float64 on the CPU):

    - ``projections`` (b, gh, gw, k): each patch's coordinates on the components; 0 (the foreground's mean) on the
      background when there is a ``foreground``;
    - ``components`` (k, D), unit rows, signs by the module's rule; ``mean`` (D,), the mean token fitted on;
    - ``explained_variance_ratio`` (k,): each component's share of the variance of the tokens fitted on (0 where
      they are all equal: no variance);
    - ``layout``: the input's :class:`~vit_einops.network.patch_embed.TokenLayout` (its prefix tokens were dropped);
    - ``foreground`` (b, gh, gw) bool, the patches the second PCA was fitted on, or None without a threshold.
    """

    projections: torch.Tensor
    components: torch.Tensor
    mean: torch.Tensor
    explained_variance_ratio: torch.Tensor
    layout: TokenLayout
    foreground: torch.Tensor | None = None

    @property
    def rgb(self) -> torch.Tensor:
        """(b, gh, gw, 3) colours in [0, 1]: the first three components as red, green and blue, each min-max scaled
        over all the images (over the foreground, when there is one; the background black). A constant component,
        or a missing one (k < 3), is 0."""
        shown = self.projections[..., :3]
        inside = self.foreground if self.foreground is not None else torch.ones(shown.shape[:-1], dtype=torch.bool)
        values = shown[inside]  # (m, <=3)
        low, high = values.min(dim=0).values, values.max(dim=0).values
        span = high - low
        colours = torch.where(span > 0, (shown - low) / torch.where(span > 0, span, 1.0), 0.0) * inside[..., None]
        return torch.cat([colours, colours.new_zeros(*colours.shape[:-1], 3 - colours.shape[-1])], dim=-1)


def _pca(tokens: torch.Tensor, n_components: int, what: str) -> tuple[torch.Tensor, ...]:
    """(mean (d,), components (k, d), projections (m, k), explained variance ratio (k,)) of tokens (m, d) float64,
    signs by the module's rule. ``what`` names the tokens in errors."""
    m = tokens.shape[0]
    if n_components > m:
        raise ValueError(f"n_components {n_components} exceeds the {m} {what} to fit on")
    mean = tokens.mean(dim=0)
    centred = tokens - mean
    covariance = centred.T @ centred
    total = covariance.trace()
    values, vectors = torch.linalg.eigh(covariance)  # ascending
    values, components = values.flip(0)[:n_components], vectors.flip(1)[:, :n_components].T  # (k,), (k, d)
    largest = components.abs().argmax(dim=1, keepdim=True)  # the first of tied maxima
    components = components * components.gather(1, largest).sign()
    # Tokens all equal have no variance to explain: every projection is 0, and so is each ratio (not 0 / 0).
    return mean, components, centred @ components.T, values / total if total > 0 else torch.zeros_like(values)


@torch.no_grad()
def _patch_features(model: Any, images: Any, layer: int, preprocessed: bool | None) -> tuple[torch.Tensor, TokenLayout]:
    """((b, gh, gw, D) patch tokens of block ``layer`` as :func:`patch_feature_pca` reads them, the input's layout),
    the model run in eval mode and given back in its mode."""
    depth = len(model.blocks)
    layer = check_index("layer", layer, depth, f"a ViT of depth {depth}")
    x = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, x)
    was_training = model.training
    model.eval()
    try:
        (tokens,) = model.forward_intermediates(
            x, [layer], norm=model.head.token_norm, stop_early=True, intermediates_only=True
        )
    finally:
        model.train(was_training)
    return rearrange(tokens, "b d gh gw -> b gh gw d"), model.patch_embed.layout(x.shape[-2:])


def patch_feature_pca(
    model: Any,
    images: Any,
    n_components: int = 3,
    layer: int = -1,
    *,
    foreground: float | None = None,
    preprocessed: bool | None = None,
) -> PatchPCA:
    """One PCA over the patch tokens of all ``images`` together (the module docstring says how, and the sign rule).

    Args:
        model: a ViT; its prefix tokens (class, distillation, registers) are dropped by the input's token layout.
        images: as every inspect function takes them (:func:`vit_einops.inputs.model_inputs`); ``preprocessed``
            says how a float tensor is taken.
        n_components: k, 1..D (and at most the number of patches fitted on).
        layer: the block whose patch tokens are analysed (0 is the first, -1 the last), through the final
            LayerNorm as :meth:`~vit_einops.network.model.ViT.forward_features` returns them (a model with
            ``fc_norm``, which norms after pooling, un-normed as ``forward_features`` gives them): -1, the default,
            is ``forward_features`` with the prefix tokens dropped.
        foreground: None, or the threshold on the first component of the DINOv2 recipe (module docstring): the
            second PCA is fitted on the patches above it.

    Returns a :class:`PatchPCA`; its ``rgb`` is the picture :func:`plot_patch_pca` draws.
    """
    features, layout = _patch_features(model, images, layer, preprocessed)
    return _fit(features, layout, n_components, foreground, f"the patch features of layer {layer}")


def fit_patch_pca(
    features: torch.Tensor, layout: TokenLayout, n_components: int = 3, *, foreground: float | None = None
) -> PatchPCA:
    """:func:`patch_feature_pca` on tokens already computed: ``features`` (b, n, D), a pass's tokens in the order
    of ``layout`` (``forward_features``' for the default layer: the prefix tokens are dropped here), or the patch
    tokens alone on the grid (b, gh, gw, D); float and finite."""
    return _fit(features, layout, n_components, foreground, "the features")


def _fit(
    features: torch.Tensor, layout: TokenLayout, n_components: int, foreground: float | None, what: str
) -> PatchPCA:
    """:func:`fit_patch_pca`, ``what`` naming the features in its refusals."""
    check_dense_tensor(what, features)
    if features.ndim not in (3, 4):
        raise ValueError(f"{what} must be tokens (b, n, D) in the order of the layout or patch tokens on the grid "
                         f"(b, gh, gw, D), got shape {tuple(features.shape)}")
    if not features.is_floating_point():
        raise TypeError(f"{what} must be floating point tokens, got dtype {features.dtype}")
    if not torch.isfinite(features).all():
        raise ValueError(f"{what} hold non-finite values (nan or inf)")
    n_components = check_positive_int("n_components", n_components)
    if n_components > features.shape[-1]:
        raise ValueError(f"n_components {n_components} exceeds the token width D = {features.shape[-1]}")
    if foreground is not None:
        foreground = check_real("foreground", foreground, "a float threshold on the first component")
    if features.ndim == 3:
        features = layout.split(features, dim=-2)[1]  # (b, gh, gw, D)
    tokens = features.detach().cpu().double().flatten(0, 2)  # (b gh gw, d)
    grid = features.shape[:3]
    if foreground is None:
        mean, components, projections, ratio = _pca(tokens, n_components, "patches")
        return PatchPCA(projections.reshape(*grid, -1), components, mean, ratio, layout)
    first = _pca(tokens, 1, "patches")[2][:, 0]
    mask = first > foreground
    kept = int(mask.sum())
    if kept < n_components:
        raise ValueError(
            f"foreground {foreground} keeps {kept} of {len(mask)} patches (first component in "
            f"[{first.min().item():.4g}, {first.max().item():.4g}]); n_components {n_components} needs at least "
            f"{n_components}"
        )
    mean, components, fitted, ratio = _pca(tokens[mask], n_components, "foreground patches")
    projections = fitted.new_zeros(len(mask), n_components)
    projections[mask] = fitted
    return PatchPCA(projections.reshape(*grid, -1), components, mean, ratio, layout, mask.reshape(grid))


def plot_patch_pca(result: PatchPCA, images: torch.Tensor | None = None, titles: Sequence[str] | None = None):
    """DINOv2's Fig. 1: each image's patches coloured by ``result.rgb`` (the first three components as red, green
    and blue), drawn patch by patch (no smoothing), under the image itself when ``images`` (b, C, H, W) are given
    (drawn as :func:`vit_einops.images.to_display` shows them), titled ``titles[i]`` (e.g. the file's name; default
    "image i"). Returns a Figure."""
    if not isinstance(result, PatchPCA):
        raise TypeError(f"result must be the PatchPCA of patch_feature_pca, got {type(result).__name__}")
    rgb = result.rgb
    b = len(rgb)
    if images is not None and (not isinstance(images, torch.Tensor) or images.ndim != 4 or len(images) != b):
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be the {b} images of the result as a (b, C, H, W) tensor, got {got}")
    if titles is not None and len(titles) != b:
        raise ValueError(f"titles must be one per image of the result ({b}), got {len(titles)}")
    rows = 1 if images is None else 2
    fig = new_figure(figsize=(max(MIN_WIDTH_INCHES, b * PCA_PANEL_INCHES), rows * PCA_PANEL_INCHES + 0.4))
    axes = fig.subplots(rows, b, squeeze=False)
    k = result.components.shape[0]
    ratio = ", ".join(f"{100 * r:.0f}%" for r in result.explained_variance_ratio[:3].tolist())
    where = "foreground patches (background black)" if result.foreground is not None else "patches"
    fig.suptitle(f"PCA of {where}: components 0..{min(k, 3) - 1} as RGB ({ratio} of the variance)", fontsize=9)
    for i in range(b):
        if images is not None:
            picture = to_display(images[i])
            picture = picture.expand(3, -1, -1) if picture.shape[0] == 1 else picture
            axes[0, i].imshow(picture.permute(1, 2, 0).clamp(0, 1).numpy())
            # A file's name is literal text: "$" a dollar sign, not mathtext; control characters escaped.
            axes[0, i].set_title(printable_lines(titles[i] if titles else f"image {i}"), fontsize=9, parse_math=False)
        axes[-1, i].imshow(rgb[i].float().numpy(), interpolation="nearest")
        for ax in axes[:, i]:
            ax.set_xticks([])
            ax.set_yticks([])
    return fig
