"""The token layout the study tools read: the prefix tokens (class, distillation, register), then the patches.

A ViT's sequence is ``[prefix tokens] + gh * gw patches`` in row-major order, the prefix tokens named by
``model.config.prefix_tokens`` in token order: ("cls",), ("cls", "dist"), ("cls", "reg1", ..., "regR") or ()
for a model without a class token. Tools that take attention maps take those names as ``prefix_tokens`` and the
patch grid of the run (``model.patch_embed.grid_for(images.shape[-2:])``), never assuming that token 0 is a
class token or that the grid is the config's.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._checks import MAX_SIZE, show_int

CLASS_TOKEN = "cls"
# What to read where a model has no class token (SigLIP): the patches' own attention, averaged over them.
NO_CLASS_TOKEN = "the mean over patch queries (patch_attention_grid)"


def check_prefix_tokens(prefix_tokens: Any) -> tuple[str, ...]:
    """``prefix_tokens`` as a tuple of distinct non-empty names, or a TypeError/ValueError naming it."""
    if isinstance(prefix_tokens, str) or not isinstance(prefix_tokens, Sequence):
        raise TypeError(
            f"prefix_tokens must be a sequence of token names such as ('cls', 'reg1'), got {prefix_tokens!r}"
        )
    names = tuple(prefix_tokens)
    if not all(isinstance(name, str) and name for name in names) or len(set(names)) != len(names):
        raise ValueError(f"prefix_tokens must be distinct non-empty names, got {names!r}")
    return names


def check_grid(name: str, grid: Any) -> tuple[int, int]:
    """A patch grid (gh, gw) as a pair of Python ints: two positive ints (not bools, not floats) in a tuple, list or
    torch.Size; a TypeError or ValueError naming ``name`` and the grid otherwise. Every tool that takes a grid reads
    it here, so a negative grid whose product fits the tokens, or a float one, is refused before any reshape."""
    expected = "a (gh, gw) pair of positive ints"
    if not isinstance(grid, (tuple, list)):
        raise TypeError(f"{name} must be {expected}, got {grid!r} of type {type(grid).__name__}")
    if len(grid) != 2:
        raise ValueError(f"{name} must be {expected}, got {len(grid)} values: {grid!r}")
    for side in grid:
        if isinstance(side, bool) or not isinstance(side, numbers.Integral):
            raise TypeError(f"{name} must be {expected}, got {grid!r} (a {type(side).__name__} side)")
    gh, gw = (int(side) for side in grid)
    if not (0 < gh <= MAX_SIZE and 0 < gw <= MAX_SIZE):
        raise ValueError(f"{name} must be {expected} (each at most 2**63 - 1), got ({show_int(gh)}, {show_int(gw)})")
    return gh, gw


def num_patch_tokens(n: int, grid_size: tuple[int, int], prefix_tokens: Sequence[str]) -> int:
    """The number of prefix tokens P, after checking that ``n`` tokens are P prefix tokens and a gh x gw grid."""
    gh, gw = check_grid("grid_size", grid_size)
    names = check_prefix_tokens(prefix_tokens)
    if n != len(names) + gh * gw:
        raise ValueError(
            f"attention over {n} tokens does not fit a {gh}x{gw} grid after the {len(names)} prefix tokens "
            f"{names!r} ({len(names)} + {gh * gw} = {len(names) + gh * gw}); pass the model's "
            "config.prefix_tokens and the grid of its input"
        )
    return len(names)


def class_index(prefix_tokens: Sequence[str], what: str) -> int:
    """The class token's position among the prefix tokens, or a ValueError saying what to read instead."""
    names = check_prefix_tokens(prefix_tokens)
    if CLASS_TOKEN not in names:
        raise ValueError(f"{what} reads the class token's row, but this model has none (prefix tokens {names!r}); "
                         f"use {NO_CLASS_TOKEN} instead")  # fmt: skip
    return names.index(CLASS_TOKEN)


def model_prefix_tokens(model: nn.Module) -> tuple[str, ...] | None:
    """``model.config.prefix_tokens``, or None for a module without a ViT's config (a bare attention layer)."""
    names = getattr(getattr(model, "config", None), "prefix_tokens", None)
    return None if names is None else check_prefix_tokens(names)


def model_grid(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """The patch grid of ``model`` on ``images`` (..., H, W): ``model.patch_embed.grid_for((H, W))``."""
    return tuple(model.patch_embed.grid_for(tuple(images.shape[-2:])))
