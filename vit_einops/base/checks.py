"""Argument checks shared by every constructor: one place, one wording of each error."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def _is_int(value: Any) -> bool:
    """An integer, numpy's scalar ints included, but not a bool (True is not a size; numpy's bool is no Integral)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# torch's integers are int64 (sizes, indices, a generator's seed): the range every int checked here must fit, so that
# a value past it is refused by name where it enters, not by torch's "Overflow when unpacking long long" later.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The largest size a tensor holds along one axis, and the largest count of a model's parts.
MAX_SIZE = INT64_MAX


def check_int(name: str, value: Any, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """Return ``value`` as a Python int if it is an int in [low, high] (by default torch's int64 range); else a
    TypeError (not an int) or ValueError (out of range) naming ``name`` and the value."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be {_int_range(value, low, high)}, got {show_int(value)}")
    return value


def _int_range(value: int, low: int, high: int) -> str:
    """What [low, high] asks of ``value``, for a message: the bound it broke where the other is int64's."""
    int64 = "(torch's integers are int64)"
    if value > high and high == INT64_MAX:
        return f"at most 2**63 - 1 {int64}"
    if value < low and high == INT64_MAX:
        return {1: "a positive int", 0: ">= 0", INT64_MIN: f"at least -2**63 {int64}"}.get(low, f">= {low}")
    return f"an int in [{'-2**63' if low == INT64_MIN else low}, {high}]"


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` (as a Python int) if it is an int in [1, 2**63 - 1], else raise naming ``name`` and the
    value."""
    return check_int(name, value, 1)


def check_nonnegative_int(name: str, value: Any) -> int:
    """Return ``value`` (as a Python int) if it is an int in [0, 2**63 - 1], else raise naming ``name`` and the
    value."""
    return check_int(name, value, 0)


def show_int(value: int) -> str:
    """``value`` for a message; one too long for a message line (over 256 bits, 78 digits; Python refuses to print
    past 4300) by its length in bits."""
    return str(value) if value.bit_length() <= 256 else f"an int of {value.bit_length():,} bits"


def check_size(name: str, value: Any, *, positive: bool = True) -> int:
    """A size or count of a model (a width, a depth, a number of tokens or classes): a positive int (or >= 0 when
    not ``positive``) at most :data:`MAX_SIZE`. The estimates multiply such sizes, so one past torch's range is
    refused here, by name, rather than overflowing in a product later."""
    return check_int(name, value, 1 if positive else 0)


def check_grid(name: str, grid: Any) -> tuple[int, int]:
    """A patch grid (gh, gw) as a pair of Python ints: two positive ints (not bools, not floats) in a tuple, list or
    torch.Size; a TypeError or ValueError naming ``name`` and the grid otherwise, before any reshape reads it."""
    expected = "a (gh, gw) pair of positive ints"
    if not isinstance(grid, (tuple, list)):
        raise TypeError(f"{name} must be {expected}, got {grid!r} of type {type(grid).__name__}")
    if len(grid) != 2:
        raise ValueError(f"{name} must be {expected}, got {len(grid)} values: {grid!r}")
    for side in grid:
        if not _is_int(side):
            raise TypeError(f"{name} must be {expected}, got {grid!r} (a {type(side).__name__} side)")
    gh, gw = (int(side) for side in grid)
    if not (0 < gh <= MAX_SIZE and 0 < gw <= MAX_SIZE):
        raise ValueError(f"{name} must be {expected} (each at most 2**63 - 1), got ({show_int(gh)}, {show_int(gw)})")
    return gh, gw


def check_heads(dim: Any, heads: Any) -> tuple[int, int]:
    """(dim, heads) as sizes, ``dim`` split evenly between the heads (D_h = D / h, Eq. 5); else raise naming both."""
    dim, heads = check_size("dim", dim), check_size("heads", heads)
    if dim % heads:
        raise ValueError(f"dim {dim} is not divisible by heads {heads}")
    return dim, heads


def check_patch_grid(image_size: Any, patch_size: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """(image_size, patch_size) as (h, w) pairs of sizes (an int means square), each side of the image a whole
    number of patches (Eq. 1: N' = HW / P^2); else raise naming the side and both pairs."""
    image, patch = (
        tuple(check_size(f"{name}[{i}]", side) for i, side in enumerate(to_pair(name, value)))
        for name, value in (("image_size", image_size), ("patch_size", patch_size))
    )
    for size, side, axis in zip(image, patch, ("height", "width")):
        if size % side:
            raise ValueError(
                f"image {axis} {size} is not divisible by patch {axis} {side} (image_size {image}, patch_size {patch})"
            )
    return image, patch


def check_index(name: str, value: Any, length: int, container: str | None = None) -> int:
    """A Python-style index into ``length`` items (negative counts from the end), returned as 0..length-1.

    ``container`` names what is indexed in the message ("a ViT of depth 12"); by default "<length> items".
    """
    value = check_int(name, value)
    if not -length <= value < length:
        container = container or f"{length} items"
        raise ValueError(f"{name} {value} out of range for {container} (valid: {-length}..{length - 1})")
    return value % length


def check_real(name: str, value: Any, expected: str) -> float:
    """Return ``value`` as a finite Python float; TypeError for a non-number (bools included), ValueError for
    nan or +-inf. ``expected`` describes the valid range in both messages ("a float in [0, 1)")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {value!r} of type {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {expected}, got {value}")
    return value


def check_positive_float(name: str, value: Any) -> float:
    """A finite float > 0 (an epsilon, a learning rate)."""
    value = check_real(name, value, "a positive finite float")
    if value <= 0:
        raise ValueError(f"{name} must be a positive finite float, got {value}")
    return value


def check_nonnegative_float(name: str, value: Any) -> float:
    """A finite float >= 0 (a weight decay, an interval in seconds)."""
    value = check_real(name, value, "a finite float >= 0")
    if value < 0:
        raise ValueError(f"{name} must be a finite float >= 0, got {value}")
    return value


def check_real_in_range(name: str, value: Any, low: float, high: float) -> float:
    """A finite float in [low, high] (a time limit: inf would never return)."""
    expected = f"a finite float in [{low:g}, {high:g}]"
    value = check_real(name, value, expected)
    if not low <= value <= high:
        raise ValueError(f"{name} must be {expected}, got {value}")
    return value


def check_probability(name: str, value: Any) -> float:
    """A rate in [0, 1): dropout (a rate of 1 would zero every activation), label smoothing, Adam's betas."""
    value = check_real(name, value, "a float in [0, 1)")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool (not 0/1, not a string): a TypeError naming it otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}")
    return value


def check_dense_tensor(name: str, value: Any, *, values: bool = True) -> None:
    """TypeError unless ``value`` is a dense (strided) torch tensor; with ``values``, ValueError for one on the meta
    device, which has a shape but no values to read. Sparse, MKL-DNN and nested tensors have no strides: the
    operations of a model (a convolution, a comparison of pixel values) fail on them with torch's internal errors."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_nested:
        raise TypeError(f"{name} is a nested tensor; expected a dense (strided) tensor, or a list of them")
    if value.layout != torch.strided:
        layout = str(value.layout).removeprefix("torch.").lstrip("_")
        raise TypeError(f"{name} is a {layout} tensor; expected a dense (strided) tensor: pass {name}.to_dense()")
    if values and value.is_meta:
        raise ValueError(
            f"{name} is a meta tensor (a shape without values); expected a tensor that holds its values, on the "
            "model's device"
        )


def check_attention_mask(mask: Any, shape: tuple[int, ...], axes: str) -> Any:
    """``mask`` if it is a bool tensor (True = may attend) that broadcasts to the scores' ``shape`` (their axes
    named by ``axes``, such as "(b, h, n, m)"): a TypeError naming its dtype, or a ValueError naming its shape,
    otherwise. Attention kernels fill the scores where the mask is False, which a float mask (an additive bias
    in torch's SDPA) or another shape would turn into a wrong result or an error from inside the kernel."""
    import torch

    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {got}")
    try:
        fits = mask.ndim <= len(shape) and torch.broadcast_shapes(mask.shape, shape) == tuple(shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {axes} = {tuple(shape)}")
    return mask


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, choices))}")
    return value


def to_pair(name: str, value: Any) -> tuple[int, int]:
    """Accept an int (square) or an (h, w) pair of positive ints."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or an (h, w) pair, got {value!r}")
        return (check_positive_int(f"{name}[0]", value[0]), check_positive_int(f"{name}[1]", value[1]))
    return (check_positive_int(name, value),) * 2
