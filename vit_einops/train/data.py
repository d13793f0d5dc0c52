"""Datasets for training: scikit-learn's bundled handwritten digits (no download), or a folder of images.

Both come back as in-memory float tensors scaled to [0, 1], images (n, C, H, W) and int64 labels (n,), wrapped
in an :class:`ImageDataset` that also remembers the class names. Everything fits in memory at the sizes a
CPU run trains on, so batches are plain tensor indexing and no DataLoader worker is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .._checks import to_pair
from .config import DEFAULT_TEST_FRACTION

# The split of the digits into train and test is part of the benchmark: fixed, whatever --seed trains with.
DIGITS_SPLIT_SEED = 0
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class ImageDataset:
    """Images (n, C, H, W) float32 in [0, 1], labels (n,) int64 in [0, len(classes)), and the class names."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"expected images (n, C, H, W) and labels (n,), "
                f"got {tuple(self.images.shape)} and {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.labels.shape[0]

    def subset(self, indices: torch.Tensor | np.ndarray | list[int]) -> "ImageDataset":
        index = torch.as_tensor(indices, dtype=torch.long)
        return ImageDataset(self.images[index], self.labels[index], self.classes)


def stratified_split(labels: torch.Tensor, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices with every class in the same proportion in both (scikit-learn's splitter)."""
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test fraction must be in (0, 1), got {test_fraction}")
    index = np.arange(len(labels))
    train, test = train_test_split(index, test_size=test_fraction, random_state=seed, stratify=labels.numpy())
    return np.sort(train), np.sort(test)


def load_digits(test_fraction: float = DEFAULT_TEST_FRACTION) -> tuple[ImageDataset, ImageDataset]:
    """scikit-learn's 1,797 handwritten digits (8x8, one channel, 10 classes), split train/test stratified.

    The pixel values are counts 0..16 of the original 32x32 bitmaps' 4x4 blocks; dividing by 16 maps them to
    [0, 1]. The split uses :data:`DIGITS_SPLIT_SEED`, so every run is tested on the same images.
    """
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)  # (n, 1, 8, 8)
    data = ImageDataset(images, torch.from_numpy(bunch.target.astype(np.int64)), [str(c) for c in bunch.target_names])
    train, test = stratified_split(data.labels, test_fraction, DIGITS_SPLIT_SEED)
    return data.subset(train), data.subset(test)


def load_image(path: str | Path, image_size: int | tuple[int, int], in_channels: int = 3) -> torch.Tensor:
    """One image file -> (C, H, W) float32 in [0, 1], converted to grey (C=1) or RGB (C=3) and resized."""
    from PIL import Image, UnidentifiedImageError

    if in_channels not in (1, 3):
        raise ValueError(f"in_channels must be 1 (grey) or 3 (RGB) to read image files, got {in_channels}")
    h, w = to_pair("image_size", image_size)
    try:
        with Image.open(path) as img:
            img = img.convert("L" if in_channels == 1 else "RGB").resize((w, h), Image.Resampling.BILINEAR)
            array = np.asarray(img, dtype=np.float32) / 255.0
    except (FileNotFoundError, UnidentifiedImageError, OSError) as err:
        raise ValueError(f"cannot read image {str(path)!r}: {err}") from err
    return torch.from_numpy(array).reshape(h, w, in_channels).permute(2, 0, 1).contiguous()  # (H, W, C) -> (C, H, W)


def load_image_folder(
    root: str | Path, image_size: int | tuple[int, int], in_channels: int = 3, classes: list[str] | None = None
) -> ImageDataset:
    """A class-per-subfolder tree (``root/<class>/<image>``, torchvision's ImageFolder layout) read with Pillow.

    Classes are the subfolder names in sorted order, unless ``classes`` fixes them (a test folder must use the
    train folder's classes so that label i means the same class in both).
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"data folder {str(root)!r} does not exist or is not a directory")
    found = sorted(p.name for p in root.iterdir() if p.is_dir())
    if classes is None:
        classes = found
    elif sorted(found) != sorted(classes):
        raise ValueError(f"class folders in {str(root)!r} are {found}, expected the training classes {classes}")
    if len(classes) < 2:
        raise ValueError(f"data folder {str(root)!r} needs at least 2 class subfolders, found {found}")
    images, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"class folder {str(root / name)!r} has no images ({', '.join(IMAGE_SUFFIXES)})")
        images += [load_image(f, image_size, in_channels) for f in files]
        labels += [label] * len(files)
    return ImageDataset(torch.stack(images), torch.tensor(labels, dtype=torch.long), list(classes))


def load_folder_split(
    data: str | Path,
    test_data: str | Path | None,
    image_size: int | tuple[int, int],
    in_channels: int = 3,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    split_seed: int = DIGITS_SPLIT_SEED,
) -> tuple[ImageDataset, ImageDataset]:
    """Train and test sets from folders: ``test_data`` when given, else a stratified held-out part of ``data``."""
    train = load_image_folder(data, image_size, in_channels)
    if test_data is not None:
        return train, load_image_folder(test_data, image_size, in_channels, classes=train.classes)
    train_index, test_index = stratified_split(train.labels, test_fraction, split_seed)
    return train.subset(train_index), train.subset(test_index)


def describe_data(data: str | Path | None, test_data: str | Path | None, test_fraction: float) -> dict:
    """The JSON-ready description of a dataset that a checkpoint records and :func:`load_split` reads back."""
    if data is None:
        if test_data is not None:
            raise ValueError("a test folder needs a training folder: pass --data DIR with --test-data DIR")
        return {"name": "digits", "test_fraction": test_fraction}
    return {
        "name": "folder",
        "data": str(Path(data).resolve()),
        "test_data": None if test_data is None else str(Path(test_data).resolve()),
        "test_fraction": None if test_data is not None else test_fraction,
    }


def load_split(info: dict, image_size: int | tuple[int, int], in_channels: int) -> tuple[ImageDataset, ImageDataset]:
    """Train and test sets from a :func:`describe_data` description, read at the model's size and channels."""
    if info.get("name") == "digits":
        if to_pair("image_size", image_size) != (8, 8) or in_channels != 1:
            raise ValueError(
                f"the digits are 8x8 grey images; the model expects {in_channels} channels at {image_size}"
            )
        return load_digits(info["test_fraction"])
    if info.get("name") == "folder":
        return load_folder_split(
            info["data"], info["test_data"], image_size, in_channels, info["test_fraction"] or DEFAULT_TEST_FRACTION
        )
    raise ValueError(f"unknown data description {info!r}; expected name 'digits' or 'folder'")
