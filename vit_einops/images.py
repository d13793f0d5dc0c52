"""Images in and out: every command and tool opens and draws images here.

- :func:`open_image` reads a file into a PIL image, safely (regular files only, a size and a pixel cap);
  :func:`to_model_mode` turns a PIL image of any mode into 8-bit grey or RGB (16-bit images scaled, not clipped).
- :func:`sample_images`: scikit-learn's two photos, for a model that is shown no files.
- :func:`to_display` and :func:`to_uint8` draw one model input. Images in any form become a model's batch in
  :mod:`vit_einops.inputs`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import torch

from .base.budget import MAX_PIXELS

# An image larger than MAX_PIXELS is refused before it is decoded (and a resize to more, in preprocess.py). PIL's
# own guard (MAX_IMAGE_PIXELS, ~89M, an error at twice that) is global state we must not change; ours is a
# per-call limit with a clear error.
MAX_FILE_BYTES = 1 << 30  # 1 GiB: no image a ViT is shown needs more
# The formats Pillow may decode, whatever a file's name or first bytes claim. Never EPS/PS: Pillow hands those to
# Ghostscript, a PostScript interpreter, so an untrusted ".png" would run as a program where Ghostscript is installed.
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM")


def open_image(path: str | os.PathLike) -> Any:
    """Read an image file into a PIL image (decoded, file closed), refusing what is not a sane image file.

    Raises ValueError naming the file: a missing path, a directory, a FIFO or device (opening one would block or
    never end), a file over 1 GiB, a format not in :data:`FORMATS` (whatever its suffix), or more than
    :data:`MAX_PIXELS` pixels (checked from the header, before decoding). The image keeps its mode; the model's
    preprocessing converts it (:func:`to_model_mode`).
    """
    import warnings

    from PIL import Image, UnidentifiedImageError

    if os.fspath(path) == "":  # Path("") is ".": the error would name the current directory
        raise ValueError("cannot read image '': the path is an empty string")
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
            with Image.open(path, formats=FORMATS) as img:
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
    except UnidentifiedImageError as err:
        raise ValueError(
            f"cannot read image {str(path)!r}: not an image of a format vit-einops reads ({', '.join(FORMATS)})"
        ) from err
    except (OSError, SyntaxError) as err:
        raise ValueError(f"cannot read image {str(path)!r}: not an image PIL can decode ({err})") from err


def to_model_mode(image: Any, channels: int) -> Any:
    """An 8-bit "L" (channels 1) or "RGB" (channels 3) copy of a PIL image of any mode.

    Transparency is dropped, not composited (``convert("RGB")``, as torchvision's and timm's loaders do); palette
    images are expanded; float and 16/32-bit integer images ("F", "I;16", "I") are scaled by their value range to
    0..255 (:func:`_eight_bit` states the rule) rather than clipped (which would turn a float image black and every
    16-bit pixel above 255 white). An image with a side of 0 pixels is a ValueError.
    """
    if channels not in (1, 3):
        raise ValueError(f"images are read as grey (1 channel) or RGB (3 channels), not {channels} channels")
    if image.width == 0 or image.height == 0:  # resized, it would be a constant image the model is sure about
        raise ValueError(f"the image is {image.width}x{image.height} pixels: an image with a side of 0 shows nothing")
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
    """A float ("F") or integer ("I", "I;16"...) grey image as 8-bit "L", scaled by its value range, never clipped.

    The rule: a float image within [0, 1] is scaled by 255; an integer image within [0, 65535] (16-bit PNG and TIFF,
    whichever mode Pillow reads them as) by 255/65535 (65535 becomes 255); any other image (a float TIFF in
    [0, 255] or in physical units, a 32-bit image with negative values) is min-max scaled to [0, 255]. A constant
    image outside those ranges has no range to scale by: it becomes its value clipped to [0, 255].
    """
    import numpy as np
    from PIL import Image

    array = np.asarray(image, dtype=np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"a {image.mode} image holds non-finite pixels (nan or inf)")
    full = 1.0 if image.mode == "F" else 65535.0
    lo, hi = float(array.min()), float(array.max())
    if 0.0 <= lo and hi <= full:
        scaled = array * (255.0 / full)
    elif hi > lo:
        scaled = (array - lo) * (255.0 / (hi - lo))
    else:
        scaled = np.clip(array, 0.0, 255.0)
    return Image.fromarray(np.rint(scaled).astype(np.uint8), mode="L")


def sample_images() -> tuple[list[Any], list[str]]:
    """scikit-learn's two sample photos (bundled, no download) as RGB PIL images, and their file names."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    sample = load_sample_images()
    return [Image.fromarray(a) for a in sample.images], [Path(f).name for f in sample.filenames]


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
