"""Images in any form -> the batch a model takes: the one input contract of predict, the inspect tools and the
explorer.

An image is a path (str or PathLike, opened by :func:`vit_einops.images.open_image`), a PIL image, a uint8
tensor (C, H, W) or batch (B, C, H, W) of raw pixels 0..255, or a float tensor; ``images`` is one of these or a
list of them. Everything but a preprocessed float tensor goes through the model's own preprocessing
(``model.transforms()``), so a path, the PIL image it holds and its pixels as a tensor give the same input.

A float tensor can be either of two things, and which is said by ``preprocessed``:

- ``preprocessed=False``: raw pixels in [0, 1], as torchvision's ``ToTensor()`` gives them. They are resized,
  cropped and normalised as the model's preprocessing does a file: as the 8-bit image they encode
  (``round(255 x)``, exact for ``ToTensor()`` output), or without rounding where the preprocessing keeps their size.
- ``preprocessed=True``: already the model's input (``model.transforms()`` output); it goes in as it is.
- ``preprocessed=None`` (the default): taken only where both readings give the same input (the model records no
  preprocessing, so a tensor can only be its input; or its preprocessing leaves this tensor as it is: no resize,
  no normalisation, values in [0, 1]). Anywhere else it is a ValueError naming both options: a float tensor is never
  silently taken the wrong way.

A tensor holds its values densely: a sparse, MKL-DNN, nested or meta tensor is refused where it enters, as is an
image with a side of 0 pixels (:func:`vit_einops.images.to_model_mode`). The model's preprocessing must make its
input size and channels (``model.transforms()`` checks it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .base.checks import check_dense_tensor
from .images import open_image, to_display, to_uint8

ACCEPTED = "a path, a PIL image, a uint8 or float tensor (C, H, W) or (B, C, H, W), or a non-empty list of them"


class _Item(NamedTuple):
    """One image on its way in. kind: "pil" (a PIL image to preprocess), "raw" (float pixels in [0, 1] the
    preprocessing keeps the size of: only normalised) or "input" (already the model's input)."""

    kind: str
    value: Any


def model_inputs(model: Any, images: Any, *, preprocessed: bool | None = None, name: str = "images") -> torch.Tensor:
    """(b, C, H, W): ``images`` (see the module docstring) as ``model`` takes them, checked by
    ``model.check_input`` where it has one.

    One float tensor with ``preprocessed`` true (or taken as the model's input) comes back as it is; everything
    else is stacked on the model's device, in its dtype. A module that takes no images (one without
    ``check_input``, such as ``model.blocks``) gets a tensor as it is. ``name`` names the argument in error
    messages.
    """
    return _batch(model, images, _checked_keyword(preprocessed), name)


def model_inputs_and_pictures(
    model: Any, images: Any, *, preprocessed: bool | None = None, name: str = "images"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`model_inputs`, the same images as the model saw them, (b, C, H, W) float32 in [0, 1] on the CPU):
    resized and cropped by its preprocessing but not normalised, for figures and the explorer. A preprocessed
    input is drawn by :func:`vit_einops.images.to_display` (min-max scaled where it leaves [0, 1])."""
    preprocessed = _checked_keyword(preprocessed)
    items = _read(model, images, preprocessed, name)
    return _batch(model, images, preprocessed, name, items), torch.stack([_picture(model, item) for item in items])


def _batch(
    model: Any, images: Any, preprocessed: bool | None, name: str, items: list[_Item] | None = None
) -> torch.Tensor:
    """The checked (b, C, H, W) batch of ``images``; ``items``: the images already read, if they are."""
    if not hasattr(model, "check_input") and isinstance(images, torch.Tensor) and preprocessed is not False:
        return images  # a module that takes no images (blocks on tokens): its input, whatever its shape
    if _is_one_input(model, images, preprocessed, name):
        batch = images if images.ndim == 4 else images[None]
    else:
        items = _read(model, images, preprocessed, name) if items is None else items
        batch = _stack(model, [_input(model, item) for item in items])
    return _checked(model, batch)


def _checked_keyword(preprocessed: Any) -> bool | None:
    if preprocessed is not None and not isinstance(preprocessed, bool):
        raise TypeError(f"preprocessed must be True, False or None, got {preprocessed!r}")
    return preprocessed


def _is_one_input(model: Any, images: Any, preprocessed: bool | None, name: str) -> bool:
    return (
        isinstance(images, torch.Tensor)
        and images.is_floating_point()
        and _check_shape(images, name)
        and _float_kind(model, images, preprocessed, name) == "input"
    )


def _check_shape(x: torch.Tensor, label: str) -> bool:
    check_dense_tensor(label, x)  # a sparse or meta tensor has no pixel values to read or check
    if x.ndim not in (3, 4):
        raise ValueError(f"{label} must be an image (C, H, W) or a batch (B, C, H, W), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{label} holds no image: shape {tuple(x.shape)}")
    return True


def _checked(model: Any, batch: torch.Tensor) -> torch.Tensor:
    check = getattr(model, "check_input", None)
    if check is not None:
        check(batch)
    return batch


def _stack(model: Any, inputs: list[torch.Tensor]) -> torch.Tensor:
    param = next(model.parameters(), None)
    if param is None:
        return torch.stack(inputs)
    return torch.stack([x.to(param.device, param.dtype) for x in inputs])


def _read(model: Any, images: Any, preprocessed: bool | None, name: str) -> list[_Item]:
    """``images`` -> one item per image: files opened, tensors split and sorted by how they are taken."""
    from PIL import Image

    if isinstance(images, (str, os.PathLike, Image.Image, torch.Tensor)):
        images = [images]
    elif not isinstance(images, Sequence) or isinstance(images, (bytes, bytearray)):
        # bytes are a Sequence: read as one, a bytes path failed on its first byte, "images[0] ... got int"
        raise TypeError(f"{name} must be {ACCEPTED}; got {_describe(images)}")
    elif not images:
        raise ValueError(f"{name} is an empty {type(images).__name__}; expected {ACCEPTED}")
    items = []
    for i, image in enumerate(images):
        label = f"{name}[{i}]" if len(images) > 1 else name
        if isinstance(image, (str, os.PathLike)):
            items.append(_Item("pil", open_image(image)))
        elif isinstance(image, Image.Image):
            items.append(_Item("pil", image))
        elif isinstance(image, torch.Tensor):
            items.extend(_tensor_items(model, image, preprocessed, label))
        else:
            raise TypeError(f"{label} must be {ACCEPTED}; got {_describe(image)}")
    return items


def _describe(value: Any) -> str:
    return f"{type(value).__name__} of shape {tuple(value.shape)}" if hasattr(value, "shape") else type(value).__name__


def _tensor_items(model: Any, x: torch.Tensor, preprocessed: bool | None, label: str) -> list[_Item]:
    _check_shape(x, label)
    images = list(x) if x.ndim == 4 else [x]
    if x.dtype == torch.uint8:
        return [_Item("pil", _pil(image, label)) for image in images]
    if not x.is_floating_point():
        raise TypeError(
            f"{label} is a {x.dtype} tensor; images are uint8 (raw pixels 0..255) or float (raw pixels in [0, 1] "
            f"with preprocessed=False, or the model's input with preprocessed=True)"
        )
    kind = _float_kind(model, x, preprocessed, label)
    if kind == "input":
        return [_Item("input", image) for image in images]
    prep = _transforms(model)
    keeps = x.shape[-3] == prep.channels and not prep.resizes(*x.shape[-2:])
    return [_Item("raw", image) if keeps else _Item("pil", _pil(image, label)) for image in images]


def _float_kind(model: Any, x: torch.Tensor, preprocessed: bool | None, label: str) -> str:
    """"input" or "raw" for a float tensor, by ``preprocessed``, or where that is None by the rule of the module
    docstring; a ValueError where the two readings differ, or raw pixels leave [0, 1]."""
    if not torch.isfinite(x).all():
        # Checked however the tensor is taken: a nan input gives nan attention maps and relevance, drawn as if real.
        raise ValueError(f"{label} holds non-finite values (nan or inf)")
    if preprocessed:
        return "input"
    prep = getattr(model, "preprocessing", None)
    if preprocessed is None and prep is None:
        return "input"  # nothing to preprocess with: the tensor can only be the model's input
    lo, hi = x.min().item(), x.max().item()
    in_range = 0 <= lo and hi <= 1
    if preprocessed is None:
        unchanged = (
            in_range
            and x.shape[-3] == prep.channels
            and not prep.resizes(*x.shape[-2:])
            and all(m == 0 for m in prep.mean)
            and all(s == 1 for s in prep.std)
        )
        if unchanged:
            return "input"  # preprocessing would leave it as it is: both readings are the same input
        raise ValueError(
            f"{label} is a float tensor of shape {tuple(x.shape)} with values in [{lo:.4g}, {hi:.4g}]: say how to "
            "take it. Raw pixels in [0, 1] (what torchvision's ToTensor() gives) need the model's preprocessing: "
            "pass preprocessed=False. A tensor already preprocessed for this model (what model.transforms() "
            "gives) goes in as it is: pass preprocessed=True."
        )
    if not in_range:
        raise ValueError(
            f"{label} holds values in [{lo:.4g}, {hi:.4g}], but raw pixels (preprocessed=False) are in [0, 1]: "
            "divide 0..255 floats by 255 (or pass a uint8 tensor), or pass preprocessed=True for the model's input"
        )
    _transforms(model)  # a model with no preprocessing says here what to set
    return "raw"


def _transforms(model: Any) -> Any:
    """The model's preprocessing (``model.transforms()``: its ValueError says what to set where none is recorded)."""
    if not callable(getattr(model, "transforms", None)):
        raise TypeError(
            f"a {type(model).__name__} has no preprocessing (model.transforms()) to read images with; pass the "
            "model's input as a float tensor with preprocessed=True"
        )
    return model.transforms()


def _pil(x: torch.Tensor, label: str) -> Any:
    """(C, H, W), C 1 or 3, of uint8 pixels or float pixels in [0, 1] -> the 8-bit PIL "L" or "RGB" image they
    encode (float pixels rounded to the nearest of 256 levels: exact for ToTensor() output, k / 255)."""
    from PIL import Image

    if x.shape[0] not in (1, 3):
        hint = " (channels last? use x.permute(2, 0, 1))" if x.shape[-1] in (1, 3) else ""
        raise ValueError(f"{label} has {x.shape[0]} channels in (C, H, W) {tuple(x.shape)}; expected 1 or 3{hint}")
    return Image.fromarray(to_uint8(x.float() / 255 if x.dtype == torch.uint8 else x))


def _input(model: Any, item: _Item) -> torch.Tensor:
    if item.kind == "pil":
        return _transforms(model)(item.value)
    if item.kind == "raw":
        return _transforms(model).normalise(item.value)
    return item.value


def _picture(model: Any, item: _Item) -> torch.Tensor:
    if item.kind == "pil":
        prep = _transforms(model)
        return dataclasses.replace(prep, mean=(0.0,) * prep.channels, std=(1.0,) * prep.channels)(item.value)
    if item.kind == "raw":
        return item.value.detach().float().cpu()
    return to_display(item.value)
