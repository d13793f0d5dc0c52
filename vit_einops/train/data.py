"""Datasets for training: scikit-learn's bundled handwritten digits (no download), or a folder of images; and the
batches the loop draws from them or from any Dataset or DataLoader the caller brings.

The bundled loaders return in-memory float tensors scaled to [0, 1], images (n, C, H, W) and int64 labels (n,),
wrapped in an :class:`ImageDataset` that also remembers the class names. Everything fits in memory at the sizes a
CPU run trains on, so their batches are plain tensor indexing and no DataLoader worker is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, Subset

from ..base.checks import check_positive_int, to_pair
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

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One (image (C, H, W), label ()) pair: a map-style Dataset, so a DataLoader can batch it too."""
        return self.images[index], self.labels[index]

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


def stratified_subset(labels: torch.Tensor, n: int) -> np.ndarray:
    """Indices of ``n`` items, every class in (as nearly as ``n`` allows) its share of ``labels``; sorted.

    Class c's i-th item (in index order) gets the key (i + 0.5) / count_c and the ``n`` smallest keys win: each
    class is taken in proportion, and the first items of every class come before the second items of any.
    Deterministic, so ``--limit`` picks the same images on every run and every rank.
    """
    check_positive_int("limit", n)
    labels = np.asarray(labels)
    if n >= len(labels):
        return np.arange(len(labels))
    keys = np.empty(len(labels))
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        keys[members] = (np.arange(len(members)) + 0.5) / len(members)
    return np.sort(np.argsort(keys, kind="stable")[:n])


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
    """One image file -> (C, H, W) float32 in [0, 1]: grey (C=1) or RGB (C=3), resized bilinearly to image_size.

    Exactly ``Preprocessing.plain(image_size, in_channels)`` (what a trained model records, so predicting on a file
    later feeds it the same numbers) on :func:`~vit_einops.images.open_image`, which refuses what is not a sane
    image file (a directory or FIFO named like an image, a decompression bomb, an unreadable format) with a
    ValueError naming it; 16-bit images are scaled instead of clipped.
    """
    from ..images import open_image
    from ..preprocess import Preprocessing

    return Preprocessing.plain(image_size, in_channels)(open_image(path))


def _visible(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if not p.name.startswith(".")]


def load_image_folder(
    root: str | Path,
    image_size: int | tuple[int, int] | None = None,
    in_channels: int = 3,
    classes: list[str] | None = None,
    *,
    transform: Callable[[Any], torch.Tensor] | None = None,
) -> ImageDataset:
    """A class-per-subfolder tree (``root/<class>/<image>``, torchvision's ImageFolder layout) read with Pillow.

    Each image is read with :func:`~vit_einops.images.open_image`, then either resized to ``image_size`` and scaled
    to [0, 1] (``Preprocessing.plain``, what ``vit-einops train`` records with a model it trains), or given to
    ``transform``, e.g. a pretrained model's own ``model.transforms()``, so that fine-tuning sees the numbers the
    weights were trained on. Give exactly one of the two.

    Classes are the subfolder names in sorted order, unless ``classes`` fixes them (a test folder must use the
    train folder's classes so that label i means the same class in both). Hidden entries (a name starting with
    ".": ``.ipynb_checkpoints/``, ``.DS_Store``, macOS ``._`` files) are neither classes nor images, as in
    torchvision's ImageFolder.
    """
    from ..images import open_image

    if (image_size is None) == (transform is None):
        raise TypeError(
            "give load_image_folder exactly one of image_size (resize and scale to [0, 1]) and transform= "
            "(e.g. transform=model.transforms(), the preprocessing a pretrained model expects)"
        )
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be callable (PIL image -> tensor), got {type(transform).__name__}")
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"data folder {str(root)!r} does not exist or is not a directory")
    found = sorted(p.name for p in _visible(root) if p.is_dir())
    if classes is None:
        classes = found
    elif sorted(found) != sorted(classes):
        raise ValueError(f"class folders in {str(root)!r} are {found}, expected the training classes {classes}")
    if len(classes) < 2:
        raise ValueError(f"data folder {str(root)!r} needs at least 2 class subfolders, found {found}")
    images, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(p for p in _visible(root / name) if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"class folder {str(root / name)!r} has no images ({', '.join(IMAGE_SUFFIXES)})")
        images += [
            load_image(f, image_size, in_channels) if transform is None else transform(open_image(f)) for f in files
        ]
        labels += [label] * len(files)
    if transform is not None:
        _check_transformed(images, transform)
    return ImageDataset(torch.stack(images), torch.tensor(labels, dtype=torch.long), list(classes))


def _check_transformed(images: list[Any], transform: Any) -> None:
    """What ``transform`` made must stack into one batch: (C, H, W) float tensors of one shape."""
    for x in images:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim != 3:
            raise TypeError(
                f"transform {transform!r} must turn a PIL image into a (C, H, W) float tensor, got "
                f"{type(x).__name__}{tuple(x.shape) if isinstance(x, torch.Tensor) else ''}"
            )
    shapes = sorted({tuple(x.shape) for x in images})
    if len(shapes) > 1:
        raise ValueError(f"transform made images of {len(shapes)} shapes ({shapes[:3]}...); it must give one size")
    bad = sum(not torch.isfinite(x).all().item() for x in images)
    if bad:  # training on them would give a nan loss many steps later, far from the cause
        raise ValueError(
            f"transform {transform!r} made {bad} of {len(images)} images with non-finite values (nan or inf)"
        )


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


# --- batches from whatever the caller trains on -------------------------------------------------------------


def class_names_of(data: Any) -> list[str] | None:
    """The class names a dataset carries (``.classes``, as torchvision's ImageFolder and :class:`ImageDataset`),
    looking through a DataLoader's ``.dataset`` and ``Subset``/``random_split`` wrappers; None if it has none."""
    for _ in range(8):  # a DataLoader over a Subset of a Subset...; bounded, a cyclic .dataset cannot loop forever
        classes = getattr(data, "classes", None)
        if isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes):
            return list(classes)
        data = getattr(data, "dataset", None)
        if data is None:
            return None
    return None


def _pair(batch: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (b, C, H, W), labels (b,) integer) from one batch, or a TypeError saying what was expected."""
    if isinstance(batch, dict) or not isinstance(batch, (tuple, list)) or len(batch) != 2:
        got = f"a dict with keys {sorted(batch)}" if isinstance(batch, dict) else f"{type(batch).__name__}"
        if isinstance(batch, (tuple, list)):
            got += f" of {len(batch)} items"
        raise TypeError(
            f"{where} must yield (images, labels) pairs, got {got}; wrap the dataset so that item i is "
            "(image tensor (C, H, W), int label)"
        )
    images, labels = batch
    if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(
            f"{where} must yield (images, labels) tensors, got ({type(images).__name__}, {type(labels).__name__}); "
            "convert images to tensors (e.g. torchvision.transforms.ToTensor) in the dataset"
        )
    if labels.ndim != 1 or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(
            f"{where} must yield integer class labels of shape (b,), got {labels.dtype} of shape {tuple(labels.shape)}"
        )
    return images, labels


def _check_map_style(data: Any, where: str) -> None:
    if isinstance(data, IterableDataset) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise TypeError(
            f"{where} must be a map-style Dataset (with __getitem__ and __len__) or a DataLoader, "
            f"got {type(data).__name__}"
        )
    if len(data) == 0:
        raise ValueError(f"{where} is empty")


class Batches:
    """This rank's training batches, epoch by epoch, from any of what :func:`~vit_einops.train.train` accepts.

    - :class:`ImageDataset` (in memory): each batch is one tensor index, no DataLoader.
    - Any other map-style Dataset yielding (image, label): a DataLoader batches it, in the same order.
    - A DataLoader: used as given (its batch size, workers, transforms, collate).

    For the first two the order is ``DistributedSampler(shuffle=True, seed=seed)`` at ``set_epoch(epoch)``: a
    function of (seed, epoch) alone, the rank's shard under torchrun, so a resumed run sees the same batches.
    A DataLoader's sampler gets ``set_epoch(epoch)`` when it has one; a shuffling DataLoader without its own
    ``generator`` draws its order from the global RNG, which the loop reseeds from (seed, epoch, rank) just before
    each epoch, so that too repeats on resume. ``exact_resume`` is False for a DataLoader (or sampler) with its own
    ``generator`` (shuffling with it, or seeding workers from it), or with persistent workers: that random state
    carries over from epoch to epoch and no checkpoint records it.
    """

    def __init__(self, data: Any, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.memory: ImageDataset | None = None
        self.exact_resume = True
        if isinstance(data, DataLoader):
            self.loader = data
            self.sampler = next(
                (s for s in (data.sampler, getattr(data.batch_sampler, "sampler", None)) if hasattr(s, "set_epoch")),
                None,
            )
            if world_size > 1 and not isinstance(self.sampler, DistributedSampler):
                raise ValueError(
                    f"under torchrun ({world_size} processes) a DataLoader needs a DistributedSampler, or every rank "
                    "trains on all the data and the ranks may take different numbers of steps; pass the Dataset "
                    "instead and train() shards it"
                )
            try:
                self.steps = len(data)
            except TypeError as err:
                raise TypeError(
                    "the training DataLoader has no length (an IterableDataset?); the learning-rate schedule needs "
                    "the number of steps per epoch: use a map-style Dataset"
                ) from err
            if self.steps == 0:
                raise ValueError("the training DataLoader yields no batches")
            shuffles_with_own = getattr(self.sampler or data.sampler, "generator", None) is not None
            seeds_workers_with_own = data.num_workers > 0 and data.generator is not None
            self.exact_resume = not (shuffles_with_own or seeds_workers_with_own or data.persistent_workers)
            return
        _check_map_style(data, "the training data")
        self.sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.batch_sampler = BatchSampler(self.sampler, batch_size, drop_last=False)
        self.steps = len(self.batch_sampler)
        if isinstance(data, ImageDataset):
            self.memory, self.loader = data, None
        else:  # its own generator: iter() would otherwise draw a worker seed from the global RNG that drives dropout
            self.loader = DataLoader(data, batch_sampler=self.batch_sampler, generator=torch.Generator())

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch``: call it after reseeding the global RNG for the epoch."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        if self.memory is not None:
            for index in self.batch_sampler:
                yield self.memory.images[index], self.memory.labels[index]
        else:
            for batch in self.loader:
                yield _pair(batch, "the training data")


def eval_batches(
    data: Any, batch_size: int = 512, rank: int = 0, world_size: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Test batches in order: this rank's every ``world_size``-th item of a Dataset, or a DataLoader as given."""
    if isinstance(data, DataLoader):
        for batch in data:
            yield _pair(batch, "the test data")
        return
    _check_map_style(data, "the test data")
    index = torch.arange(rank, len(data), world_size)
    if isinstance(data, ImageDataset):
        for start in range(0, len(index), batch_size):
            batch = index[start : start + batch_size]
            yield data.images[batch], data.labels[batch]
        return
    for batch in DataLoader(Subset(data, index.tolist()), batch_size=batch_size):
        yield _pair(batch, "the test data")
