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
from ..images import to_display, to_uint8
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


def render_page(payload: dict[str, Any], title: str) -> str:
    """The page as text. The JSON goes inside a <script> element, so "</" is written "<\\/" (the same JSON)."""
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return Template(_asset("explorer.html")).substitute(
        title=html.escape(title), css=_asset("explorer.css"), js=_asset("explorer.js"), data=data
    )


def write_explorer(
    model: torch.nn.Module,
    images: torch.Tensor,
    path: str | Path,
    *,
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
        images: (b, C, H, W), the model's inputs (already preprocessed).
        titles: one label per image (default "image 0", ...).
        class_names: names of the model's outputs (default ``model.class_names``); unnamed ones are "class i".
        pictures: what to show for each image, PIL images or uint8 arrays (e.g. the photo before normalising);
            default: each input as :func:`vit_einops.images.to_display` draws it.
        top_k: how many top classes get a prediction line and a relevance map.
        bits: bits per stored attention weight, 2..8; each weight is within 1 / (2 (2^bits - 1)) of its row's
            maximum of the recorded A (the page states it).
        overwrite: replace an existing regular file at ``path`` (keeping its permissions); otherwise an existing
            file is a FileExistsError, also one that appears while the page is built.

    The page holds A of every layer and head for every image (quantised: see
    :mod:`vit_einops.explore.payload`), so keep to a handful of images: ViT-B/16 costs a few MB per image.
    """
    path = Path(path)
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or len(images) == 0:
        raise ValueError(f"images must be a (b, C, H, W) tensor with b >= 1, got {getattr(images, 'shape', images)!r}")
    if not torch.isfinite(images).all():
        raise ValueError("images contain non-finite values (nan or inf); the explorer needs real inputs")
    if not hasattr(model, "config") or not hasattr(model, "blocks"):
        raise TypeError(f"write_explorer needs a vit-einops ViT, got {type(model).__name__}")
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
    if pictures is None:
        shown = [to_uint8(to_display(image)) for image in images]
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
