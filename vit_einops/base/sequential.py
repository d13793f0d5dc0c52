"""The base of every composed module, so that slicing keeps working."""

from __future__ import annotations

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
