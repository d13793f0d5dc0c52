"""Weight initialisation shared by the embeddings and the linear layers."""

from __future__ import annotations

import torch
from torch import nn


def trunc_normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """Normal(0, std) truncated at two standard deviations.

    torch's ``trunc_normal_`` cuts at a=-2, b=2 in absolute units by default, which for std 0.02 cuts nothing.
    """
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)
