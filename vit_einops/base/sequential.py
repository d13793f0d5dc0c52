"""The base of every composed module, so that slicing keeps working."""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict

from torch import nn


class Sequential(nn.Sequential):
    """nn.Sequential whose slices are plain ``nn.Sequential`` with the children's names kept.

    torch slices by calling ``type(self)(OrderedDict(...))``, which our subclasses (constructed from sizes, not
    modules) cannot accept; ``model[:2]`` (patch embedding and encoder) and ``model.head[:-1]`` must still work.
    """

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return nn.Sequential(OrderedDict(list(self._modules.items())[idx]))
        return super().__getitem__(idx)


def forward_takes(module: nn.Module, keyword: str) -> bool:
    """Whether ``module.forward`` takes ``keyword`` after its input (by that name, or as ``**kwargs``): composed
    modules hand a keyword argument to the children that take it by name, never by position."""
    return _takes(type(module), keyword)


@functools.cache
def _takes(cls: type[nn.Module], keyword: str) -> bool:
    params = list(inspect.signature(cls.forward).parameters.values())[2:]  # self, then the input
    return any(p.kind is p.VAR_KEYWORD or p.name == keyword and p.kind is not p.VAR_POSITIONAL for p in params)
