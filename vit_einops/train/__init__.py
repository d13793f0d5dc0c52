"""Training a ViT on bundled or folder data, with crash-safe, pickle-free checkpoints (``vit-einops train``).

Names load on first use (PEP 562), so importing ``vit_einops.train.config`` for the command line's defaults
does not pull in safetensors, scikit-learn or tqdm, which only the ``train`` extra installs.
"""

from __future__ import annotations

from ..base.lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": "config",
    "DIGITS_MODEL": "config",
    "Checkpoint": "checkpoint",
    "CheckpointError": "checkpoint",
    "load_checkpoint": "checkpoint",
    "load_checkpoint_model": "checkpoint",
    "save_checkpoint": "checkpoint",
    "ImageDataset": "data",
    "load_digits": "data",
    "load_folder_split": "data",
    "load_image": "data",
    "load_image_folder": "data",
    "stratified_subset": "data",
    "Distributed": "loop",
    "TrainResult": "loop",
    "TrainingDivergedError": "loop",
    "resolve_device": "loop",
    "WarmupCosine": "loop",
    "init_distributed": "loop",
    "train": "loop",
    "plot_curves": "plots",
    "plot_confusion": "plots",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
