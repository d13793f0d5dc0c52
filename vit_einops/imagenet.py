"""ImageNet-1k's class names, shipped with the package (``vit_einops/data/imagenet1k.txt``).

The list is torchvision's ``_IMAGENET_CATEGORIES``, one name per line in logit order; timm's ImageNet-1k heads use
the same index order (the classes sorted by WordNet id). A torchvision or timm weights file holds no names, so a
1000-class one is given these, and its ``model.source`` says they were assumed (:func:`assume_imagenet_names`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from typing import Any

NUM_CLASSES = 1000
# What model.source["class_names"] records when the names were not in the file but assumed from its 1000 logits.
ASSUMED = "assumed: ImageNet-1k (1000 logits, no names in the file; torchvision's and timm's order)"


@lru_cache(maxsize=1)
def _names() -> tuple[str, ...]:
    names = tuple(files(__package__).joinpath("data", "imagenet1k.txt").read_text(encoding="utf-8").splitlines())
    if len(names) != NUM_CLASSES or len(set(names)) != NUM_CLASSES:
        raise RuntimeError(f"vit_einops/data/imagenet1k.txt holds {len(names)} names; the package is damaged")
    return names


def imagenet1k_classes() -> list[str]:
    """The 1000 ImageNet-1k class names, in logit order ("tench", "goldfish", ...)."""
    return list(_names())


def assume_imagenet_names(model: Any) -> None:
    """Give a model with 1000 logits and no class names ImageNet-1k's, and record in ``model.source`` that they
    were assumed; any other model is left as it is."""
    if model.config.num_classes != NUM_CLASSES or model.config.embedding or model.class_names is not None:
        return
    model.class_names = imagenet1k_classes()
    model.source = {**(model.source or {}), "class_names": ASSUMED}
