"""Images in and out: every command and tool opens, batches and draws images here.

- :func:`open_image` reads a file into a PIL image, safely (regular files only, a size and a pixel cap);
  :func:`to_model_mode` turns a PIL image of any mode into 8-bit grey or RGB (16-bit images scaled, not clipped).
- :func:`sample_images`: scikit-learn's two photos, for a model that is shown no files.
- :func:`load_images`: paths, PIL images or tensors -> the (b, C, H, W) batch a model takes, through its own
  preprocessing (``model.transforms()``).
- :func:`display_images`: the same images as the model saw them (resized and cropped, not normalised), in [0, 1],
  for figures and the explorer; :func:`to_display` and :func:`to_uint8` draw one model input.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ._budget import MAX_PIXELS

# An image larger than MAX_PIXELS is refused before it is decoded (and a resize to more, in preprocess.py). PIL's
# own guard (MAX_IMAGE_PIXELS, ~89M, an error at twice that) is global state we must not change; ours is a
# per-call limit with a clear error.
MAX_FILE_BYTES = 1 << 30  # 1 GiB: no image a ViT is shown needs more


def open_image(path: str | os.PathLike) -> Any:
    """Read an image file into a PIL image (decoded, file closed), refusing what is not a sane image file.

    Raises ValueError naming the file: a missing path, a directory, a FIFO or device (opening one would block or
    never end), a file over 1 GiB, a format PIL cannot read, or more than :data:`MAX_PIXELS` pixels (checked from
    the header, before decoding). The image keeps its mode; the model's preprocessing converts it
    (:func:`to_model_mode`).
    """
    import warnings

    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as err:
        raise ValueError(f"cannot read image {str(path)!r}: {err.strerror or err}") from err
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"cannot read image {str(path)!r}: not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise ValueError(f"cannot read image {str(path)!r}: {st.st_size} bytes, over the limit of {MAX_FILE_BYTES}")
    try:
        with warnings.catch_warnings():
            # PIL warns above its own pixel guard; ours below is the check that counts, with a clear message.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                pixels = img.width * img.height
                if pixels > MAX_PIXELS:
                    raise ValueError(
                        f"cannot read image {str(path)!r}: {img.width}x{img.height} = {pixels} pixels, "
                        f"over the limit of {MAX_PIXELS}"
                    )
                img.load()
                return img.copy()
    except Image.DecompressionBombError as err:
        raise ValueError(f"cannot read image {str(path)!r}: {err}") from err
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"cannot read image {str(path)!r}: not an image PIL can decode ({err})") from err


def to_model_mode(image: Any, channels: int) -> Any:
    """An 8-bit "L" (channels 1) or "RGB" (channels 3) copy of a PIL image of any mode.

    Transparency is dropped, not composited (``convert("RGB")``, as torchvision's and timm's loaders do); palette
    images are expanded; 16-bit and 32-bit integer images ("I;16", "I") are scaled from 0..65535 to 0..255 rather than
    clipped at 255 (which would turn every pixel above 255 white).
    """
    if channels not in (1, 3):
        raise ValueError(f"images are read as grey (1 channel) or RGB (3 channels), not {channels} channels")
    target = "L" if channels == 1 else "RGB"
    if image.mode.startswith("I") or image.mode == "F":
        image = _eight_bit(image)
    if image.mode == target:
        return image
    if image.mode in ("P", "PA") and target == "L":
        image = image.convert("RGBA")
    try:
        return image.convert(target)
    except ValueError as err:
        raise ValueError(f"cannot convert a {image.mode} image to {target}: {err}") from err


def _eight_bit(image: Any) -> Any:
    import numpy as np
    from PIL import Image

    array = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        if not np.isfinite(array).all():
            raise ValueError("a floating-point image holds non-finite pixels (nan or inf)")
        full = 1.0 if array.size and array.max() <= 1.0 and array.min() >= 0.0 else 65535.0
    else:
        full = 65535.0  # 16-bit PNG/TIFF, whichever integer mode Pillow reads it as
    return Image.fromarray(np.clip(np.rint(array * (255.0 / full)), 0, 255).astype(np.uint8), mode="L")


def sample_images() -> tuple[list[Any], list[str]]:
    """scikit-learn's two sample photos (bundled, no download) as RGB PIL images, and their file names."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    sample = load_sample_images()
    return [Image.fromarray(a) for a in sample.images], [Path(f).name for f in sample.filenames]


def _items(images: Any) -> list[Any]:
    """One or a list of paths, PIL images and (C, H, W) tensors -> a list of PIL images (files opened) and tensors."""
    from PIL import Image

    if isinstance(images, (str, os.PathLike, Image.Image, torch.Tensor)):
        images = [images]
    if not isinstance(images, Sequence) or not images:
        raise TypeError(
            f"images must be a path, a PIL image, a tensor, or a non-empty list of them; got {type(images).__name__}"
        )
    items = []
    for item in images:
        if isinstance(item, (str, os.PathLike)):
            item = open_image(item)
        if not isinstance(item, Image.Image) and not (isinstance(item, torch.Tensor) and item.ndim == 3):
            raise TypeError(f"each image must be a path, a PIL image or a (C, H, W) tensor, got {type(item).__name__}")
        items.append(item)
    return items


def load_images(model: Any, images: Any) -> torch.Tensor:
    """(b, C, H, W) float32 model inputs for ``images``: one or a list of paths, PIL images or preprocessed
    (C, H, W) tensors, or a (b, C, H, W) batch. Paths and PIL images go through ``model.transforms()``; the batch
    is checked against the model's input size (``model.check_input``)."""
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        batch = images
    else:
        batch = torch.stack([x if isinstance(x, torch.Tensor) else model.transforms()(x) for x in _items(images)])
    model.check_input(batch)
    return batch


def display_images(model: Any, images: Any) -> torch.Tensor:
    """(b, C, H, W) in [0, 1]: ``images`` (as :func:`load_images` takes them) as the model saw them. Paths and PIL
    images are resized and cropped by the model's preprocessing but not normalised; tensors, already model inputs,
    go through :func:`to_display`."""
    items = list(images) if isinstance(images, torch.Tensor) and images.ndim == 4 else _items(images)
    return torch.stack([to_display(x) if isinstance(x, torch.Tensor) else _unnormalised(model)(x) for x in items])


def _unnormalised(model: Any) -> Any:
    """The model's preprocessing without its mean and std: resize and crop, pixels scaled to [0, 1]."""
    prep = model.transforms()
    return dataclasses.replace(prep, mean=(0.0,) * prep.channels, std=(1.0,) * prep.channels)


def to_display(image: torch.Tensor) -> torch.Tensor:
    """A model input (C, H, W) -> float32 in [0, 1] to draw: as it is when already in [0, 1], else min-max scaled
    over the whole image (a normalised input: one scale for every channel keeps their balance)."""
    image = image.detach().float().cpu()
    lo, hi = image.min(), image.max()
    if lo < 0 or hi > 1:
        image = (image - lo) / (hi - lo).clamp_min(1e-12)
    return image


def to_uint8(image: torch.Tensor) -> Any:
    """(C, H, W) in [0, 1] -> an 8-bit picture as a numpy array: (H, W) for grey, (H, W, 3) for RGB."""
    pixels = image.detach().float().cpu().clamp(0, 1).mul(255).round().to(torch.uint8)
    return pixels[0].numpy() if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).numpy()  # (C, H, W) -> (H, W, C)
