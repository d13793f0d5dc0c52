"""Training a ViT on bundled or folder data, with crash-safe, pickle-free checkpoints (``vit-einops train``).

Names load on first use (PEP 562), so importing ``vit_einops.train.config`` for the command line's defaults
does not pull in safetensors, scikit-learn or tqdm, which only the ``train`` extra installs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "config",
    "DIGITS_MODEL": "config",
    "Checkpoint": "checkpoint",
    "CheckpointError": "checkpoint",
    "load_checkpoint": "checkpoint",
    "load_model": "checkpoint",
    "save_checkpoint": "checkpoint",
    "ImageDataset": "data",
    "load_digits": "data",
    "load_folder_split": "data",
    "load_image": "data",
    "load_image_folder": "data",
    "Distributed": "loop",
    "TrainResult": "loop",
    "WarmupCosine": "loop",
    "init_distributed": "loop",
    "train": "loop",
    "plot_curves": "plots",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
