"""Argument checks shared by every constructor: one place, one wording of each error."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_positive_int(name: str, value: Any) -> int:
    """Return `value` if it is an int > 0, else raise naming `name` and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def check_nonnegative_int(name: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 0, else raise naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_index(name: str, value: Any, length: int, container: str | None = None) -> int:
    """A Python-style index into ``length`` items (negative counts from the end), returned as 0..length-1.

    ``container`` names what is indexed in the message ("a ViT of depth 12"); by default "<length> items".
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if not -length <= value < length:
        container = container or f"{length} items"
        raise ValueError(f"{name} {value} out of range for {container} (valid: {-length}..{length - 1})")
    return value % length


def check_probability(name: str, value: Any) -> float:
    """Dropout rates live in [0, 1): a rate of 1 would zero every activation."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r} of type {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, choices))}")
    return value


def to_pair(name: str, value: Any) -> tuple[int, int]:
    """Accept an int (square) or an (h, w) pair of positive ints."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or an (h, w) pair, got {value!r}")
        return (check_positive_int(f"{name}[0]", value[0]), check_positive_int(f"{name}[1]", value[1]))
    check_positive_int(name, value)
    return (value, value)
