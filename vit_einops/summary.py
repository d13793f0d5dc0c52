"""Parameter counts without allocating the parameters, and torchsummary's layer table beside them."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import torch
from torch import nn

from .model import ViT
from .presets import create_vit
from .sizes import check_forward_memory, check_model_memory


def count_parameters(model: nn.Module) -> int:
    """Every parameter's element count, summed; works on the meta device (shapes only)."""
    return sum(p.numel() for p in model.parameters())


def meta_vit(name: str, **overrides: Any) -> ViT:
    """Preset ``name`` on the meta device: every shape and no memory, and no random init to wait for (ViT-H's
    632M parameters count in well under a second)."""
    with torch.device("meta"):
        return create_vit(name, **overrides)


def zeroed_vit(name: str, **overrides: Any) -> ViT:
    """Preset ``name`` with real, zero weights on the CPU and no random initialisation: enough for a layer
    table, which needs shapes and one forward, not trained values."""
    model = meta_vit(name, **overrides)
    # The table's weights, and its forward (torchsummary runs a batch of two), within the memory budget.
    check_model_memory(model.config)
    check_forward_memory(model.config, 2)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def summarize(model: nn.Module, input_size: tuple[int, ...], batch_size: int = -1) -> str:
    """Return torchsummary's table for ``model`` on a (C, H, W) ``input_size`` as text (it runs one forward).

    torchsummary counts the ``weight``/``bias`` of each submodule whose forward runs; every parameter
    of vit_einops lives on such a module (the class token and positions included), so its
    "Total params" equals ``sum(p.numel() for p in model.parameters())``.
    """
    import torchsummary  # imports numpy; only the table needs it

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        torchsummary.summary(model, input_size, batch_size=batch_size, device="cpu")
    return buf.getvalue()
