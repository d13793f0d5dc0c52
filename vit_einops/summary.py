"""torchsummary's layer table, with a true parameter total beside it."""

from __future__ import annotations

import contextlib
import io

import torchsummary
from torch import nn


def summarize(model: nn.Module, input_size: tuple[int, ...], batch_size: int = -1) -> str:
    """Return torchsummary's table for ``model`` on a (C, H, W) ``input_size`` as text.

    torchsummary counts the ``weight``/``bias`` of each submodule whose forward runs; every parameter
    of vit_einops lives on such a module (the class token and positions included), so its
    "Total params" equals ``sum(p.numel() for p in model.parameters())``.
    """
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        torchsummary.summary(model, input_size, batch_size=batch_size, device="cpu")
    return buf.getvalue()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
