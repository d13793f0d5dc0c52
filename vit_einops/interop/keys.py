"""The machinery the converters share: the one key-rename engine, config inference, and key checks.

A foreign ViT (torchvision's, timm's) holds the same tensors as ours under other names, with the same shapes:
conversion is a rename, checked key by key and shape by shape. What a state dict cannot tell (the number of heads,
a non-square image, the pooling), the caller passes in; everything else is read off the tensors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..base.checks import check_positive_int, to_pair
from ..network.config import ViTConfig
from ..network.model import ViT
from ..statedict import (
    StateDictMismatchError,
    check_keys,
    check_state_dict,
    convert_patchify,
    expected_shapes,
)

# h is not in any tensor's shape (the fused qkv is D x 3D for every h), so it comes from Table 1 by width D
# (192 and 384 are the DeiT Ti and S that torchvision and timm also ship).
HEADS_BY_DIM: dict[int, int] = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}



def require(state_dict: Mapping[str, torch.Tensor], key: str, ndim: int, source: str) -> torch.Tensor:
    """The tensor at ``key``, which config inference needs; a clear error if it is absent or of the wrong rank."""
    if key not in state_dict:
        raise StateDictMismatchError(source, [key], [], {})
    tensor = state_dict[key]
    if tensor.ndim != ndim:
        raise ValueError(f"{source} {key} must be {ndim}-D, got shape {tuple(tensor.shape)}")
    return tensor


# Block indices with more digits than this are beyond any depth a file can describe; int() is not even asked
# to read them (it refuses over 4,300 digits).
_INDEX_DIGITS = 30
# The missing blocks a message names before it counts the rest.
_NAMED = 3


def count_blocks(state_dict: Mapping[str, torch.Tensor], pattern: str, source: str) -> int:
    """L, from the block indices in keys matching ``pattern`` (one group: the index); they must run 0..L-1.

    A file names each of its blocks, so L is the number of indices present: a stray index in the billions is
    refused here, in one line that names a few of the missing blocks and counts the rest, before a model of that
    depth is laid out or its keys listed."""
    digits = {m.group(1).lstrip("0") or "0" for k in state_dict if (m := re.match(pattern, k))}
    if not digits:
        raise ValueError(f"{source} state dict has no encoder blocks (no key matches {pattern!r})")
    giant = max((d for d in digits if len(d) > _INDEX_DIGITS), key=len, default=None)
    indices = {int(d) for d in digits if len(d) <= _INDEX_DIGITS}
    if giant is None and indices == set(range(len(indices))):
        return len(indices)
    present = len(digits)
    largest = None if giant is not None else max(indices)
    # The first _NAMED indices below the largest that no key names lie among the first present + _NAMED.
    end = present + _NAMED if largest is None else min(largest, present + _NAMED)
    named = [i for i in range(end) if i not in indices][:_NAMED]
    if giant is not None:  # 10**(n-1) or more: too many digits to print the count
        index, missing, more = f"has {len(giant)} digits", f"over 10**{len(giant) - 1:,} blocks are", " and more"
    else:
        count = largest + 1 - present
        index, missing = str(largest), f"{count:,} block{'s are' if count > 1 else ' is'}"
        more = f" and {count - len(named):,} more" if count > len(named) else ""
    raise ValueError(
        f"{source} encoder block indices are not 0..L-1: the keys name {present} blocks, the largest index "
        f"{index}; {missing} missing ({', '.join(map(str, named))}{more})"
    )


def check_pos_rows(pos: torch.Tensor, key: str, prefix: int, source: str) -> None:
    """ValueError unless the position table ``pos`` (1, rows, D) has a row for each of its ``prefix`` tokens and at
    least one patch: with fewer, the patch grid would have no cells (or fewer than none) to take the side of."""
    rows = pos.shape[1]
    if rows < prefix + 1:
        tokens = f"{prefix} prefix token{'s' * (prefix != 1)} and 1 patch" if prefix else "1 patch"
        raise ValueError(
            f"{source} {key} of shape {tuple(pos.shape)} has {rows} rows: expected at least {prefix + 1} ({tokens})"
        )


def infer_heads(dim: int, heads: int | None) -> int:
    """``heads`` if given, else Table 1's h for width ``dim``."""
    if heads is not None:
        return check_positive_int("heads", heads)
    if dim not in HEADS_BY_DIM:
        raise ValueError(
            f"the number of heads cannot be read from a state dict and width {dim} is not a Table 1 size "
            f"({', '.join(f'{d}->{h}' for d, h in HEADS_BY_DIM.items())}); pass heads=..."
        )
    return HEADS_BY_DIM[dim]


def infer_image_size(
    num_patch_tokens: int, patch_size: tuple[int, int], image_size: int | tuple[int, int] | None, source: str
) -> tuple[int, int]:
    """(H, W) from the number of patch rows in the position embedding; square unless ``image_size`` is given."""
    if image_size is not None:
        h, w = to_pair("image_size", image_size)
        if (h // patch_size[0]) * (w // patch_size[1]) != num_patch_tokens or h % patch_size[0] or w % patch_size[1]:
            raise ValueError(
                f"image_size {(h, w)} with patch_size {patch_size} gives a grid of "
                f"{h / patch_size[0]:g} x {w / patch_size[1]:g}, but the {source} position embedding has "
                f"{num_patch_tokens} patch rows"
            )
        return (h, w)
    side = round(num_patch_tokens**0.5)
    if side * side != num_patch_tokens:
        raise ValueError(
            f"the {source} position embedding has {num_patch_tokens} patch rows, not a square grid; "
            f"pass image_size=(H, W)"
        )
    return (side * patch_size[0], side * patch_size[1])


# Our state-dict keys, each spelled once: every library's rule table names them through these patterns (the module
# tree of vit_einops.network.blocks: ``blocks.{i}.attn`` is ResidualAdd(norm, mha[, ls]), ``blocks.{i}.mlp`` is
# ResidualAdd(norm, ff[, ls])). Group 1 of a block pattern is the block index.
BLOCK = r"blocks\.(\d+)\."
ATTN_NORM, MHA, ATTN_LS = BLOCK + r"attn\.norm\.", BLOCK + r"attn\.mha\.", BLOCK + r"attn\.ls\."
MLP_NORM, FF, MLP_LS = BLOCK + r"mlp\.norm\.", BLOCK + r"mlp\.ff\.", BLOCK + r"mlp\.ls\."

# (our key regex, their key template or the templates of the pieces it is cut into along its first axis, the rank
# of their tensor where it is stored in another shape, else None).
Rule = tuple[str, "str | tuple[str, ...]", "int | None"]


@dataclass(frozen=True)
class KeyLayout:
    """The one rename engine: another library's key layout as ``rules`` (see :data:`Rule`), applied with
    re.fullmatch, first match wins. Every one of our keys matches one rule. A tensor moves by renaming, by being cut
    into pieces along its first axis (our fused qkv into HF's query, key and value) or stacked from them, and by a
    reshape (CLIP's (D,) class token); our patch projection is compared in its Conv2d form, whatever ``patchify``
    the model uses. Rules may be pairs (our regex, their template) where the tensor only moves.
    """

    name: str
    rules: tuple[tuple, ...]

    def _rule(self, ours: str) -> tuple[re.Match, tuple[str, ...], int | None]:
        for pattern, template, *rank in self.rules:
            if m := re.fullmatch(pattern, ours):
                return m, (template,) if isinstance(template, str) else template, (rank or [None])[0]
        raise ValueError(f"the {self.name} layout has no counterpart of our {ours!r}")

    def groups(self, shapes: Mapping[str, torch.Size]) -> list[tuple[list[str], list[str]]]:
        """(our keys, their keys) pairs: one side has one key, the other the pieces it is cut into along the first
        axis (q, k, v; or SigLIP's in_proj into q and kv)."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for ours in shapes:
            m, templates, _ = self._rule(ours)
            groups.setdefault(tuple(m.expand(t) for t in templates), []).append(ours)
        return [(ours, list(theirs)) for theirs, ours in groups.items()]

    def expected(self, shapes: Mapping[str, torch.Size]) -> dict[str, torch.Size]:
        """Their key -> shape, for our keys and ``shapes``."""
        expected = {}
        for ours, theirs in self.groups(shapes):
            if len(ours) > 1:  # many of ours stacked in one of theirs
                expected[theirs[0]] = torch.Size([sum(shapes[k][0] for k in ours), *shapes[ours[0]][1:]])
                continue
            shape, rank = shapes[ours[0]], self._rule(ours[0])[2]
            whole = shape[len(shape) - rank :] if rank else shape
            for key in theirs:
                expected[key] = torch.Size([whole[0] // len(theirs), *whole[1:]])
        return expected

    def move(self, state_dict: Mapping[str, torch.Tensor], shapes: Mapping[str, torch.Size], *, to_ours: bool) -> dict:
        """``state_dict`` (theirs, or ours) moved to the other side, every tensor cut, stacked and reshaped to its
        shape there; keys and shapes must have been checked."""
        theirs = self.expected(shapes)
        moved: dict[str, torch.Tensor] = {}
        for our_keys, their_keys in self.groups(shapes):
            source, target = (their_keys, our_keys) if to_ours else (our_keys, their_keys)
            target_shapes = [shapes[k] if to_ours else theirs[k] for k in target]
            pieces = [state_dict[k] for k in source]
            whole = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
            if len(target) == 1:
                moved[target[0]] = whole.reshape(target_shapes[0])
            else:
                cut = whole.split([s[0] for s in target_shapes])
                moved.update((k, t.reshape(s)) for k, t, s in zip(target, cut, target_shapes, strict=True))
        return moved

    def to_ours(self, state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
        """Their state dict -> ours for ``config``, after checking every key and shape."""
        state_dict = check_state_dict(state_dict, self.name)
        shapes = expected_shapes(conv_form(config))
        check_keys(state_dict, self.expected(shapes), self.name)
        return convert_patchify(self.move(state_dict, shapes, to_ours=True), config, "conv", config.patchify)

    def from_ours(self, state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
        """Our state dict for ``config`` -> theirs, after checking every key and shape."""
        state_dict = check_state_dict(state_dict, "vit-einops")
        check_keys(state_dict, expected_shapes(config), "vit-einops")
        state_dict = convert_patchify({k: v.detach() for k, v in state_dict.items()}, config, config.patchify, "conv")
        return self.move(state_dict, expected_shapes(conv_form(config)), to_ours=False)


def conv_form(config: ViTConfig) -> ViTConfig:
    """The same config with a Conv2d patch projection, the form every library stores."""
    return ViTConfig.from_dict({**config.to_dict(), "patchify": "conv"})


def model_and_config(model_or_state: Any, config: ViTConfig | None) -> tuple[dict[str, torch.Tensor], ViTConfig]:
    """Accept a ViT (its own config) or our state dict plus its config."""
    if isinstance(model_or_state, ViT):
        if config is not None and config != model_or_state.config:
            raise ValueError("config was given together with a ViT whose own config differs; pass one or the other")
        return model_or_state.state_dict(), model_or_state.config
    if config is None:
        raise TypeError("a vit-einops state dict needs its ViTConfig: pass config=..., or pass the ViT itself")
    if not isinstance(config, ViTConfig):
        raise TypeError(f"config must be a ViTConfig, got {type(config).__name__}")
    return check_state_dict(model_or_state, "vit-einops"), config
