"""Preprocessing that travels with the weights: image file -> the (C, H, W) float tensor a model expects.

Pretrained weights only give their numbers on the inputs they were trained with, and the three libraries users
bring weights from disagree on those inputs:

- torchvision (``ViT_B_16_Weights.IMAGENET1K_V1.transforms()``): resize the shorter side to 256 (bilinear, PIL),
  centre-crop 224, scale to [0, 1], normalise with the ImageNet mean (0.485, 0.456, 0.406) and std
  (0.229, 0.224, 0.225).
- timm (``create_transform(**resolve_data_config({}, model=m))``, e.g. the augreg ViTs): resize the shorter side to
  ``floor(224 / crop_pct)`` = 248 for crop_pct 0.9 (bicubic, PIL), centre-crop 224, normalise with mean = std = 0.5.
- Hugging Face (``ViTImageProcessor`` from ``preprocessor_config.json``): resize to exactly 224 x 224 (bilinear, on a
  uint8 tensor with antialiasing: transformers 5 resizes with torch, not PIL), no crop, scale by 1/255, normalise
  (mean = std = 0.5 for google/vit-*). Reading its ``preprocessor_config.json`` is
  :func:`vit_einops.interop.hf.preprocessing_from_hf`.

:class:`Preprocessing` records one such recipe; ``model.transforms()`` returns it, and it is a callable from a PIL
image to a tensor. Only PIL and torch are used: each step reproduces the library's own to float32 rounding.
:data:`CONVENTIONS` names the recipes (``Preprocessing.convention(name, image_size)``); torch is imported only
when an image is transformed, so the command line's ``--help`` can list them. Files are opened by
:func:`vit_einops.images.open_image`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .base.budget import MAX_PIXELS
from .base.checks import check_choice, check_positive_int, to_pair

if TYPE_CHECKING:
    import torch

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
BACKENDS = ("pil", "torch")  # who resizes: PIL (torchvision and timm on PIL images) or torch (HF's processors)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision's and timm's IMAGENET_DEFAULT_MEAN
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)  # timm's augreg ViTs and google/vit-* on the hub
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI's CLIP normalisation, which timm's CLIP ViTs keep
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CONVENTIONS = ("torchvision", "timm", "hf", "plain")  # the recipes by name: Preprocessing.convention
FLOAT32_SMALLEST_NORMAL = 2.0**-126  # torch.finfo(torch.float32).tiny, without importing torch


@dataclass(frozen=True)
class Preprocessing:
    """Resize, optional centre crop, scale to [0, 1], normalise: ``(x / 255 - mean) / std`` per channel.

    Args:
        resize: an int resizes the shorter side to it, keeping the aspect ratio (torchvision, timm); an (H, W) pair
            resizes to exactly that size (Hugging Face, and models trained here).
        crop: (H, W) of the centre crop, or None for none. The crop is the model's input size, and fits inside
            every resized image: no side larger than ``resize``'s (a crop past the image would pad it with black).
        interpolation: "bilinear", "bicubic" or "nearest".
        mean, std: per-channel normalisation, one value per input channel (1 for grey, 3 for RGB).
        backend: "pil" resizes with PIL and centre-crops as torchvision and timm do on PIL images; "torch" resizes
            a uint8 tensor with ``torch.nn.functional.interpolate(antialias=True)`` and centre-crops as transformers
            5's image processors do (an odd margin's extra pixel below and right).
    """

    resize: int | tuple[int, int]
    crop: tuple[int, int] | None = None
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    backend: str = "pil"

    def __post_init__(self) -> None:
        if isinstance(self.resize, (list, tuple)):
            object.__setattr__(self, "resize", to_pair("resize", tuple(self.resize)))
        else:
            check_positive_int("resize", self.resize)
        if self.crop is not None:
            object.__setattr__(self, "crop", to_pair("crop", self.crop))
        self._check_pixels()
        self._check_crop()
        check_choice("interpolation", self.interpolation, INTERPOLATIONS)
        check_choice("backend", self.backend, BACKENDS)
        mean, std = _floats("mean", self.mean), _floats("std", self.std)
        if len(mean) != len(std):
            raise ValueError(f"mean has {len(mean)} values and std {len(std)}; expected one of each per channel")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be positive, got {std}")
        if any(s < FLOAT32_SMALLEST_NORMAL for s in std):
            # x / std runs in float32: a std below its smallest normal number sends pixels to inf (1e-320 is 0 there).
            least = FLOAT32_SMALLEST_NORMAL
            raise ValueError(f"std must be at least {least:.3g} (the smallest normal float32), got {std}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def _check_pixels(self) -> None:
        """A resize or crop that alone has more pixels than :data:`vit_einops.base.budget.MAX_PIXELS` is refused here,
        before any image is resized to it (PIL cannot hold a side past a C long; memory gives out long before)."""
        for name, size in (("resize", self.resize), ("crop", self.crop)):
            if size is None:
                continue
            h, w = size if isinstance(size, tuple) else (size, size)  # a shorter side N: at least N x N pixels
            if h * w > MAX_PIXELS:
                raise ValueError(
                    f"{name} {_short(h)}x{_short(w)} makes images of at least {_short(h * w)} pixels, over the limit "
                    f"of {MAX_PIXELS:,}"
                )

    def _check_crop(self) -> None:
        if self.crop is None:
            return
        # A shorter side resized to N leaves the longer one at N or more: a crop up to N x N fits every image.
        fits = self.resize if isinstance(self.resize, tuple) else (self.resize, self.resize)
        if self.crop[0] > fits[0] or self.crop[1] > fits[1]:
            resized = f"{fits[0]}x{fits[1]}" if isinstance(self.resize, tuple) else f"{self.resize} (the shorter side)"
            raise ValueError(
                f"crop {self.crop[0]}x{self.crop[1]} is larger than the resize to {resized}: images would be padded "
                f"with black to fill it; resize to at least the crop"
            )

    def check_fits(self, image_size: tuple[int, int], channels: int) -> None:
        """ValueError unless the images this preprocessing makes are what a model of ``image_size`` (H, W) and
        ``channels`` takes: its output size (where fixed) and its channels. A model that resamples E_pos for other
        sizes (``dynamic_size``) would take other sizes, and silently answer for an image it sees at the wrong
        scale."""
        size = tuple(image_size)
        if self.output_size not in (None, size):
            raise ValueError(f"preprocessing produces {self.output_size} images; the model takes {size}")
        if self.channels != channels:
            raise ValueError(
                f"preprocessing produces {self.channels}-channel images (its mean and std); the model takes {channels}"
            )

    # --- the conventions ------------------------------------------------------------------------------------

    @classmethod
    def torchvision(
        cls, crop: int | tuple[int, int] = 224, resize: int | None = None, interpolation: str = "bilinear"
    ) -> "Preprocessing":
        """torchvision's ``ImageClassification`` preset, as ``ViT_B_16_Weights.IMAGENET1K_V1.transforms()``: the
        shorter side to ``resize`` (default floor(256/224 of the crop's longer side: 256 for 224, and a non-square
        crop fits in every image), centre crop."""
        crop = to_pair("crop", crop)
        resize = math.floor(max(crop) * 256 / 224) if resize is None else resize
        return cls(resize=resize, crop=crop, interpolation=interpolation, mean=IMAGENET_MEAN, std=IMAGENET_STD)

    @classmethod
    def timm(
        cls,
        crop: int | tuple[int, int] = 224,
        crop_pct: float = 0.9,
        interpolation: str = "bicubic",
        mean: tuple[float, ...] = INCEPTION_MEAN,
        std: tuple[float, ...] = INCEPTION_STD,
    ) -> "Preprocessing":
        """timm's eval transform: shorter side to ``floor(crop / crop_pct)``, centre crop (augreg ViT defaults)."""
        if isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float)) or not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct!r}")
        h, w = to_pair("crop", crop)
        # timm: a square size scales its one number; a non-square size scales both (and then resizes exactly).
        resize: int | tuple[int, int] = (
            math.floor(h / crop_pct) if h == w else (math.floor(h / crop_pct), math.floor(w / crop_pct))
        )
        return cls(resize=resize, crop=(h, w), interpolation=interpolation, mean=mean, std=std)

    @classmethod
    def hf(cls, image_size: int | tuple[int, int] = 224, channels: int = 3) -> "Preprocessing":
        """transformers' ``ViTImageProcessor`` defaults (google/vit-*): resize to exactly ``image_size`` with torch
        (bilinear, antialiased), no crop, mean = std = 0.5."""
        return cls(
            resize=to_pair("image_size", image_size),
            interpolation="bilinear",
            mean=(0.5,) * channels,
            std=(0.5,) * channels,
            backend="torch",
        )

    @classmethod
    def plain(cls, image_size: int | tuple[int, int], channels: int = 3) -> "Preprocessing":
        """Resize to the model's size and scale to [0, 1], no normalisation: what ``vit-einops train`` feeds."""
        return cls(resize=to_pair("image_size", image_size), mean=(0.0,) * channels, std=(1.0,) * channels)

    @classmethod
    def convention(cls, name: str, image_size: int | tuple[int, int], channels: int = 3) -> "Preprocessing":
        """The convention ``name`` (one of :data:`CONVENTIONS`) for a model of ``image_size`` (its crop, or the
        exact size it resizes to), with its defaults. torchvision's and timm's normalise three channels."""
        check_choice("preprocessing convention", name, CONVENTIONS)
        if name == "torchvision":
            return cls.torchvision(crop=image_size)
        if name == "timm":
            return cls.timm(crop=image_size)
        if name == "hf":
            return cls.hf(image_size, channels)
        return cls.plain(image_size, channels)

    # --- use --------------------------------------------------------------------------------------------------

    @property
    def channels(self) -> int:
        return len(self.mean)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(H, W) of the tensors produced, or None when that depends on the image (shorter-side resize, no crop)."""
        if self.crop is not None:
            return self.crop
        return self.resize if isinstance(self.resize, tuple) else None

    def __call__(self, image: Any) -> torch.Tensor:
        """A PIL image (any mode) -> (C, H, W) float32."""
        import torch
        from PIL import Image

        from .images import to_model_mode

        if not isinstance(image, Image.Image):
            raise TypeError(
                f"preprocessing takes a PIL image, got {type(image).__name__}; "
                f"read files with vit_einops.open_image(path)"
            )
        image = to_model_mode(image, self.channels)
        if self.backend == "pil":
            image = self._resize_pil(image)
            x = _to_uint8_tensor(image if self.crop is None else _center_crop(image, self.crop))
        else:
            x = self._resize_torch(_to_uint8_tensor(image))
            x = x if self.crop is None else _center_crop_tensor(x, self.crop)
        return self.normalise(x.to(torch.float32).div(255))

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """(C, H, W) pixels in [0, 1] -> float32 ``(x - mean) / std`` per channel: the last step of ``__call__``."""
        import torch

        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device).view(-1, 1, 1)
        return x.to(torch.float32).sub(mean).div(std)

    def resizes(self, height: int, width: int) -> bool:
        """Whether an image of ``height`` x ``width`` is resized or cropped (False: only normalised)."""
        size = (height, width)
        return self._target_size(height, width) != size or (self.crop is not None and self.crop != size)

    def _target_size(self, height: int, width: int) -> tuple[int, int]:
        """(H, W) that an image of ``height`` x ``width`` is resized to; ValueError when that is over
        :data:`~vit_einops.base.budget.MAX_PIXELS` (a thin image whose shorter side is scaled up a hundredfold), checked
        before anything is allocated."""
        if isinstance(self.resize, tuple):
            return self.resize
        # torchvision's rule for one number: the shorter side becomes it, the longer int(size * long / short).
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.resize, int(self.resize * long / short)
        target = (new_long, new_short) if width <= height else (new_short, new_long)  # (H, W)
        if new_short * new_long > MAX_PIXELS:
            raise ValueError(
                f"resizing a {width}x{height} image's shorter side to {self.resize} makes it {target[1]}x{target[0]} "
                f"({new_short * new_long:,} pixels), over the limit of {MAX_PIXELS:,}; crop it to a less extreme "
                f"aspect ratio first"
            )
        return target

    def _resize_pil(self, image: Any) -> Any:
        from PIL import Image

        h, w = self._target_size(image.height, image.width)
        if (h, w) == (image.height, image.width):
            return image
        resample = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR}.get(
            self.interpolation, Image.Resampling.BICUBIC
        )
        return image.resize((w, h), resample)

    def _resize_torch(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        h, w = self._target_size(x.shape[-2], x.shape[-1])
        if (h, w) == tuple(x.shape[-2:]):
            return x
        batch = x.unsqueeze(0)
        if self.interpolation == "nearest":
            return torch.nn.functional.interpolate(batch, size=(h, w), mode="nearest")[0]
        # torch resizes uint8 natively (with PIL's fixed-point arithmetic) for bicubic, and for bilinear on AVX2,
        # AVX-512 and ARM; elsewhere torchvision goes through float32 and rounds. Both branches copy that choice.
        native = self.interpolation == "bicubic" or (
            torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or os.uname().machine in ("aarch64", "arm64")
        )
        kwargs = dict(size=(h, w), mode=self.interpolation, align_corners=False, antialias=True)
        if native:
            return torch.nn.functional.interpolate(batch, **kwargs)[0]
        out = torch.nn.functional.interpolate(batch.to(torch.float32), **kwargs)[0]
        return out.round_().to(torch.uint8)

    # --- storage ----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["resize"] = list(self.resize) if isinstance(self.resize, tuple) else self.resize
        d["crop"] = None if self.crop is None else list(self.crop)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "Preprocessing":
        if not isinstance(d, dict):
            raise TypeError(f"a preprocessing record is a JSON object, got {type(d).__name__}")
        known = {"resize", "crop", "interpolation", "mean", "std", "backend"}
        if unknown := sorted(set(d) - known):
            raise ValueError(f"unknown preprocessing fields {unknown}; expected a subset of {sorted(known)}")
        if "resize" not in d:
            raise ValueError("a preprocessing record needs 'resize'")
        return cls(**d)


def _short(n: int) -> str:
    """An int as its digits, or as 1.23e+45 when it has too many to read (a resize of floor(224 / 1e-300))."""
    from decimal import Decimal

    return str(n) if n < 10**12 else f"{Decimal(n):.3g}"  # Decimal: ints past float's range round too


def _floats(name: str, values: Any) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of numbers, one per channel, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} must hold finite numbers, got {list(values)!r}")
        out.append(float(v))
    if len(out) not in (1, 3):
        raise ValueError(f"{name} needs 1 (grey) or 3 (RGB) values, got {len(out)}: {out}")
    return tuple(out)


def _to_uint8_tensor(image: Any) -> torch.Tensor:
    """An 8-bit PIL image (L or RGB) -> (C, H, W) uint8."""
    import numpy as np
    import torch

    array = np.array(image, dtype=np.uint8, copy=True)
    x = torch.from_numpy(array)
    return x.unsqueeze(0) if x.ndim == 2 else x.permute(2, 0, 1).contiguous()


def _crop_box(height: int, width: int, crop: tuple[int, int]) -> tuple[int, int]:
    # torchvision's centre crop: offsets rounded half to even (Python's round), as F.center_crop computes them.
    return int(round((height - crop[0]) / 2.0)), int(round((width - crop[1]) / 2.0))


def _center_crop(image: Any, crop: tuple[int, int]) -> Any:
    """torchvision's centre crop of a PIL image at least as large as the crop (the resize before makes it so)."""
    ch, cw = crop
    top, left = _crop_box(image.height, image.width, crop)
    return image.crop((left, top, left + cw, top + ch))


def _center_crop_tensor(x: torch.Tensor, crop: tuple[int, int]) -> torch.Tensor:
    """transformers' centre crop (both its backends): an odd margin's extra pixel goes below and right, where
    torchvision's rounding (:func:`_crop_box`) puts it above and left half the time."""
    ch, cw = crop
    top, left = (x.shape[-2] - ch) // 2, (x.shape[-1] - cw) // 2
    return x[..., top : top + ch, left : left + cw]
