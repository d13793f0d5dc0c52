"""Write the explorer page: the HTML template, its CSS and JS (files beside this module, kept readable for
study) and the JSON payload, in one file that needs no network."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import numpy as np
import torch

from ..base.budget import check_peak_memory
from ..base.checks import check_positive_int
from ..base.io import check_file_output, write_file
from ..images import to_uint8
from ..inputs import model_inputs, model_inputs_and_pictures
from .payload import DEFAULT_ATTENTION_BUDGET, DEFAULT_BITS, build_payload, check_bits, page_payload, pane_memory


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _picture(picture: Any, index: int) -> np.ndarray:
    """A PIL image or an (H, W) / (H, W, 3) uint8 array -> that uint8 array."""
    array = np.asarray(picture.convert("RGB") if hasattr(picture, "convert") else picture)
    if array.dtype != np.uint8 or array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(
            f"pictures[{index}] must be a PIL image or an (H, W) / (H, W, 3) uint8 array, "
            f"got {array.dtype} {array.shape}"
        )
    return array


# Characters that mean something to the HTML parser inside a <script> element ("</script", "<!--" with "<script",
# which switch it into states where the element no longer ends where the JSON does), or to a JavaScript parser
# that is not JSON's (U+2028, U+2029), written as the JSON escapes that stand for the same characters.
_SCRIPT_SAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(payload: dict[str, Any]) -> str:
    """``payload`` as JSON text that can sit inside a <script> element: the same JSON, whatever strings it holds.

    Outside strings, JSON has none of the escaped characters; inside them, ``\\u003c`` is ``<`` to any JSON
    parser. A non-finite number is a ValueError naming it (the payload marks undefined values as null)."""
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except ValueError as err:
        raise ValueError(
            f"the explorer's data hold a non-finite number (nan or inf) where a value was expected: {err}"
        ) from err
    for char, escape in _SCRIPT_SAFE.items():  # str.replace runs in C: translate() takes seconds on a 100 MB page
        text = text.replace(char, escape)
    return text


def render_page(payload: dict[str, Any], title: str) -> str:
    """The page as text: the template with its CSS, JS and the payload (:func:`embed_json`); ``title`` is escaped
    for HTML."""
    return Template(_asset("explorer.html")).substitute(
        title=html.escape(title), css=_asset("explorer.css"), js=_asset("explorer.js"), data=embed_json(payload)
    )


def check_explorer_memory(
    panes: Sequence[tuple[torch.nn.Module, int, tuple[int, int]]], *, top_k: int, target: Any, budget: int
) -> float:
    """Refuse, before any pane is built, a page whose process would peak over the memory limit
    (:func:`~vit_einops.base.budget.check_peak_memory`); ``panes`` gives each model with its number of images and
    their size. The panes are built one after the other: the peak is the largest pane's working memory
    (:func:`~vit_einops.explore.payload.pane_memory`) beside the panes kept before it, or the page's assembly,
    four copies of its text (the JSON, its escaping, the HTML, its bytes). Returns the estimated peak."""
    kept = work = 0
    for model, b, size in panes:
        config = replace(model.config, image_size=tuple(size))
        classes = min(top_k, model.num_classes) if model.has_classifier else 0
        pane_work, pane_kept = pane_memory(config, b, classes=classes, target=target is not None, budget=budget)
        work = max(work, kept + pane_work)
        kept += pane_kept
    b = panes[0][1]
    tokens = " and ".join(f"{replace(m.config, image_size=tuple(size)).num_tokens:,}" for m, _, size in panes)
    models = f"{len(panes)} model{'s' * (len(panes) > 1)}"
    what = f"an explorer page of {models} on {b} image{'s' * (b > 1)} at {tokens} tokens"
    return check_peak_memory(max(work, 4 * kept), what)


def check_page_path(path: str | Path, overwrite: bool) -> Path:
    """``path`` as a Path, where the page may be written: not a directory, not an existing file unless
    ``overwrite``, in a directory that exists (checked again when the file is committed)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give the explorer a file name such as explore.html")
    check_file_output(path, overwrite, "pass overwrite=True (vit-einops explore --force) to replace it")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"the directory {path.parent} does not exist")
    return path


def _check_model(model: Any) -> None:
    if not hasattr(model, "config") or not hasattr(model, "blocks"):
        raise TypeError(f"write_explorer needs a vit-einops ViT, got {type(model).__name__}")


def _check_top_k(top_k: Any) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")


def explorer_pane(
    model: torch.nn.Module,
    images: Any,
    *,
    name: str,
    preprocessed: bool | None = None,
    titles: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    pictures: Sequence[Any] | None = None,
    top_k: int = 5,
    bits: int = DEFAULT_BITS,
    target: Any = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    attention_budget: int = DEFAULT_ATTENTION_BUDGET,
) -> dict[str, Any]:
    """One model's pane of the page (:func:`~vit_einops.explore.payload.build_payload`), its arguments as
    :func:`write_explorer` takes them; ``titles`` only count the images."""
    _check_model(model)
    if not isinstance(name, str):
        raise TypeError(f"a model's name must be a str, got {type(name).__name__}")
    if pictures is None:
        images, seen = model_inputs_and_pictures(model, images, preprocessed=preprocessed)
    else:
        images, seen = model_inputs(model, images, preprocessed=preprocessed), None
    if not torch.isfinite(images).all():
        raise ValueError("images contain non-finite values (nan or inf); the explorer needs real inputs")
    _check_top_k(top_k)
    check_bits(bits)
    attention_budget = check_positive_int("attention_budget", attention_budget)
    b = len(images)
    if titles is not None and len(titles) != b:
        raise ValueError(f"got {len(titles)} titles for {b} images")
    if seen is not None:
        shown = [to_uint8(picture) for picture in seen]
    else:
        if len(pictures) != b:
            raise ValueError(f"got {len(pictures)} pictures for {b} images")
        shown = [_picture(p, i) for i, p in enumerate(pictures)]
    if class_names is None:
        class_names = getattr(model, "class_names", None)
    was_training = model.training
    model.eval()
    try:
        return build_payload(
            model,
            images,
            name=name,
            class_names=class_names,
            pictures=shown,
            top_k=top_k,
            bits=bits,
            target=target,
            attention_budget=attention_budget,
            method_params=method_params,
        )
    finally:
        model.train(was_training)


def write_panes(
    panes: Sequence[dict[str, Any]], path: str | Path, *, titles: Sequence[str], bits: int, overwrite: bool = False
) -> Path:
    """Write the page of one or two :func:`explorer_pane` panes of the same ``titles`` images to ``path``."""
    if not 1 <= len(panes) <= 2:
        raise ValueError(f"the explorer shows one model or two side by side, got {len(panes)}")
    counts = [len(pane["images"]) for pane in panes]
    if any(count != len(titles) for count in counts):
        raise ValueError(f"got {len(titles)} titles for panes of {counts} images")
    path = check_page_path(path, overwrite)
    payload = page_payload(panes, titles, bits)
    write_file(path, render_page(payload, "Attention explorer").encode("utf-8"), replace=overwrite)
    return path


def write_explorer(
    model: torch.nn.Module | Sequence[torch.nn.Module],
    images: Any,
    path: str | Path,
    *,
    names: Sequence[str] | None = None,
    preprocessed: bool | None = None,
    titles: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    pictures: Sequence[Any] | None = None,
    top_k: int = 5,
    bits: int = DEFAULT_BITS,
    target: Any = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    attention_budget: int = DEFAULT_ATTENTION_BUDGET,
    overwrite: bool = False,
) -> Path:
    """Write the attention explorer for ``model`` on ``images`` to ``path`` (one HTML file); returns the path.

    Args:
        model: a vit-einops ViT (any attention impl), or a list of two, shown side by side on the same images
            (layer by layer, one layer and head selector for both); each runs in eval mode, its mode restored
            afterwards.
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them; each model takes them through its own preprocessing.
        names: one name per model, shown above its pane (default "model", or "model A" and "model B").
        preprocessed: how a float tensor is taken: False for raw pixels in [0, 1], True for the model's input
            (see :mod:`vit_einops.inputs`).
        titles: one label per image (default "image 0", ...).
        class_names: names of the model's outputs (default ``model.class_names``); unnamed ones are "class i".
            With two models, each model's own ``class_names``; this argument is then refused.
        pictures: what to show for each image, PIL images or uint8 arrays; default: each image as the model saw
            it (resized and cropped, not normalised; a preprocessed input as :func:`vit_einops.images.to_display`
            draws it).
        top_k: how many top classes get a prediction line and a relevance map (a model without a classifier,
            ``num_classes`` 0, lists no classes).
        target: a backbone target (:class:`~vit_einops.inspect.EmbeddingTarget`, ``ImageTarget``, ``PatchTarget``)
            whose relevance the page also holds, the only relevance of a model without a classifier.
        method_params: the explanation methods' parameters by method name (:data:`~vit_einops.inspect.METHODS`;
            the others take their defaults), e.g. ``{"rollout": {"head_fusion": "max", "discard_ratio": 0.9}}``:
            every method is a view of the page, labelled with them; the rollout and relevance views use the
            "rollout" and "relevance" methods' parameters.
        bits: bits per stored attention weight, 2..8; each weight is within 1 / (2 (2^bits - 1)) of its row's
            maximum of the recorded A (the page states it).
        attention_budget: the bytes of attention codes each model's pane may hold (one byte per stored weight,
            before compression). Where every row of every head does not fit (ViT-S/14 at 518 px: 136 million
            weights per image), the pane keeps the mean of the heads for every query and each head's rows of the
            prefix tokens, or those rows alone (:func:`~vit_einops.explore.payload.attention_rows`), and the page
            says what it left out.
        overwrite: replace an existing regular file at ``path`` (keeping its permissions); otherwise an existing
            file is a FileExistsError, also one that appears while the page is built.

    The page holds A of every layer and head for every image where the budget allows (quantised: see
    :mod:`vit_einops.explore.payload`), so keep to a handful of images: ViT-B/16 costs a few MB per image.
    """
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not 1 <= len(models) <= 2:
        raise ValueError(f"the explorer shows one model or two side by side, got {len(models)}")
    if names is None:
        names = ["model"] if len(models) == 1 else ["model A", "model B"]
    names = list(names)
    if len(names) != len(models):
        raise ValueError(f"got {len(names)} names for {len(models)} models")
    if class_names is not None and len(models) > 1:
        raise ValueError("with two models, each names its classes itself (model.class_names); class_names is for one")
    path = check_page_path(path, overwrite)
    for m in models:
        _check_model(m)
    _check_top_k(top_k)
    attention_budget = check_positive_int("attention_budget", attention_budget)
    shapes = [model_inputs(m, images, preprocessed=preprocessed).shape for m in models]  # before any pane's work
    check_explorer_memory(
        [(m, shape[0], shape[-2:]) for m, shape in zip(models, shapes, strict=True)],
        top_k=top_k,
        target=target,
        budget=attention_budget,
    )
    panes = [
        explorer_pane(
            m,
            images,
            name=name,
            preprocessed=preprocessed,
            titles=titles,
            class_names=class_names,
            pictures=pictures,
            top_k=top_k,
            bits=bits,
            target=target,
            method_params=method_params,
            attention_budget=attention_budget,
        )
        for m, name in zip(models, names, strict=True)
    ]
    b = len(panes[0]["images"])
    titles = list(titles) if titles is not None else [f"image {i}" for i in range(b)]
    return write_panes(panes, path, titles=titles, bits=bits, overwrite=overwrite)
