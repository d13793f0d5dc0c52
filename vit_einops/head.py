"""Eq. 4, y = LN(z_L^0), and the classifier attached to it."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ._checks import check_choice, check_nonnegative_int, check_positive_int
from ._sequential import Sequential
from .config import POOLS


class TokenPool(nn.Module):
    """(b, n, D) -> (b, D): "cls" takes the class token z^0 (the paper); "mean" averages the patch tokens,
    the class token excluded."""

    def __init__(self, mode: str = "cls") -> None:
        super().__init__()
        self.mode = check_choice("pool", mode, POOLS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] if self.mode == "cls" else x[:, 1:].mean(dim=1)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"


class ClassificationHead(Sequential):
    """``norm`` (the final LayerNorm of Eq. 4), ``pool``, optional ``pre_logits`` (Linear + tanh, the paper's
    pre-training head), then ``fc`` to ``num_classes`` (nn.Identity when num_classes is 0).

    With ``fc_norm`` the LayerNorm comes after the pooling (timm's ``fc_norm``, its default for average pooling).
    For "cls" pooling the order makes no difference (LayerNorm acts on each token alone); for "mean" it does.

    Shapes: (b, n, D) -> (b, num_classes), or (b, D or representation_size) when num_classes is 0.
    """

    def __init__(
        self,
        dim: int,
        num_classes: int,
        pool: str = "cls",
        representation_size: int | None = None,
        layer_norm_eps: float = 1e-6,
        fc_norm: bool = False,
    ) -> None:
        check_positive_int("dim", dim)
        check_nonnegative_int("num_classes", num_classes)  # 0: no classifier
        stages = [("norm", nn.LayerNorm(dim, eps=layer_norm_eps)), ("pool", TokenPool(pool))]
        if fc_norm:
            stages.reverse()
        features = dim
        if representation_size is not None:
            features = check_positive_int("representation_size", representation_size)
            stages.append(("pre_logits", nn.Sequential(OrderedDict(fc=nn.Linear(dim, features), act=nn.Tanh()))))
        stages.append(("fc", nn.Linear(features, num_classes) if num_classes else nn.Identity()))
        super().__init__(OrderedDict(stages))
