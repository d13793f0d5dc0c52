"""Write the explorer page: the HTML template, its CSS and JS (files beside this module, kept readable for
study) and the JSON payload, in one file that needs no network."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import numpy as np
import torch

from .._io import check_file_output, write_file
from ..images import to_uint8
from ..inputs import model_inputs, model_inputs_and_pictures
from .payload import DEFAULT_BITS, build_payload, check_bits


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
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


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
    return text.translate(_SCRIPT_SAFE)


def render_page(payload: dict[str, Any], title: str) -> str:
    """The page as text: the template with its CSS, JS and the payload (:func:`embed_json`); ``title`` is escaped
    for HTML."""
    return Template(_asset("explorer.html")).substitute(
        title=html.escape(title), css=_asset("explorer.css"), js=_asset("explorer.js"), data=embed_json(payload)
    )


def write_explorer(
    model: torch.nn.Module,
    images: Any,
    path: str | Path,
    *,
    preprocessed: bool | None = None,
    titles: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    pictures: Sequence[Any] | None = None,
    top_k: int = 5,
    bits: int = DEFAULT_BITS,
    overwrite: bool = False,
) -> Path:
    """Write the attention explorer for ``model`` on ``images`` to ``path`` (one HTML file); returns the path.

    Args:
        model: a vit-einops ViT (any attention impl); run in eval mode, its mode is restored afterwards.
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them.
        preprocessed: how a float tensor is taken: False for raw pixels in [0, 1], True for the model's input
            (see :mod:`vit_einops.inputs`).
        titles: one label per image (default "image 0", ...).
        class_names: names of the model's outputs (default ``model.class_names``); unnamed ones are "class i".
        pictures: what to show for each image, PIL images or uint8 arrays; default: each image as the model saw
            it (resized and cropped, not normalised; a preprocessed input as :func:`vit_einops.images.to_display`
            draws it).
        top_k: how many top classes get a prediction line and a relevance map.
        bits: bits per stored attention weight, 2..8; each weight is within 1 / (2 (2^bits - 1)) of its row's
            maximum of the recorded A (the page states it).
        overwrite: replace an existing regular file at ``path`` (keeping its permissions); otherwise an existing
            file is a FileExistsError, also one that appears while the page is built.

    The page holds A of every layer and head for every image (quantised: see
    :mod:`vit_einops.explore.payload`), so keep to a handful of images: ViT-B/16 costs a few MB per image.
    """
    path = Path(path)
    if not hasattr(model, "config") or not hasattr(model, "blocks"):
        raise TypeError(f"write_explorer needs a vit-einops ViT, got {type(model).__name__}")
    if pictures is None:
        images, seen = model_inputs_and_pictures(model, images, preprocessed=preprocessed)
    else:
        images, seen = model_inputs(model, images, preprocessed=preprocessed), None
    if not torch.isfinite(images).all():
        raise ValueError("images contain non-finite values (nan or inf); the explorer needs real inputs")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    check_bits(bits)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give the explorer a file name such as explore.html")
    check_file_output(path, overwrite, "pass overwrite=True (vit-einops explore --force) to replace it")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"the directory {path.parent} does not exist")
    b = len(images)
    titles = list(titles) if titles is not None else [f"image {i}" for i in range(b)]
    if len(titles) != b:
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
        payload = build_payload(
            model, images, titles=titles, class_names=class_names, pictures=shown, top_k=top_k, bits=bits
        )
    finally:
        model.train(was_training)
    write_file(path, render_page(payload, "Attention explorer").encode("utf-8"), replace=overwrite)
    return path
