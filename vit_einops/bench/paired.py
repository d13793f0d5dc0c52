"""Ratios of paired timings: the median of the per-round ratios, with a bootstrap 95% interval.

The compared paths of a row take turns, round after round, in one process on the same inputs, and each round gives
one time per path (the median of that round's blocks). A path's ratio in a round is its time over the reference
path's time in the same round, so whatever slows the whole round (another process, the clock, heat) multiplies
both and cancels; the ratio of two medians taken at different moments keeps it. The row's ratio is the median of
its per-round ratios.

The interval (vit_einops.base.bootstrap): resample the rounds with replacement (RESAMPLES times, from a seeded
generator, so a run's interval is the same every time its rounds are), take the median of each resample's ratios,
and keep the middle 95% of those medians (the 2.5th to the 97.5th percentile). A ratio is *unresolved* when its
interval reaches 1.0: these rounds cannot say which path is faster. One round has no interval, and is unresolved too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..base.bootstrap import RESAMPLES, SEED, bootstrap_interval


@dataclass(frozen=True)
class PairedRatio:
    """A path's time over the reference's: ``ratio`` (the median of ``rounds`` per-round ratios), the bootstrap
    interval ``low`` to ``high`` (None with one round), and ``unresolved``: the interval reaches 1.0 or is
    missing. The reference path's own row (``is_reference``) is the unit, never unresolved."""

    ratio: float
    low: float | None
    high: float | None
    rounds: int
    is_reference: bool = False

    @property
    def unresolved(self) -> bool:
        return not self.is_reference and (self.low is None or self.low <= 1.0 <= self.high)


def _check_rounds(name: str, times: Sequence[float]) -> None:
    if not times:
        raise ValueError(f"{name} has no rounds; expected at least one time per round")
    bad = [t for t in times if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0)]
    if bad:
        raise ValueError(f"{name} has {bad[0]!r} among its round times; expected finite seconds > 0")


def paired_ratio(
    times: Sequence[float], reference: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED
) -> PairedRatio:
    """``times`` over ``reference``, round by round (the same rounds, in order): the median of the per-round ratios
    and its bootstrap interval (module docstring)."""
    _check_rounds("times", times)
    _check_rounds("reference", reference)
    if len(times) != len(reference):
        raise ValueError(f"times has {len(times)} rounds and reference {len(reference)}; expected the same rounds")
    ratios = [t / r for t, r in zip(times, reference, strict=True)]
    ratio = statistics.median(ratios)
    if len(ratios) == 1:
        return PairedRatio(ratio, None, None, 1)
    low, high = bootstrap_interval(ratios, statistics.median, resamples=resamples, seed=seed)
    return PairedRatio(ratio, low, high, len(ratios))


def paired_ratios(round_s: Mapping[str, Sequence[float]], reference: str, **bootstrap) -> dict[str, PairedRatio]:
    """Every path's :func:`paired_ratio` over ``reference`` (a key of ``round_s``: each path's time per round). The
    reference itself is the unit: ratio 1.0, interval 1.0 to 1.0, never unresolved."""
    ref = round_s[reference]
    return {
        path: PairedRatio(1.0, 1.0, 1.0, len(ref), is_reference=True)
        if path == reference
        else paired_ratio(times, ref, **bootstrap)
        for path, times in round_s.items()
    }


def ratio_fields(paired: PairedRatio | None) -> dict:
    """A result row's ratio columns: ``time_ratio``, ``time_ratio_low``, ``time_ratio_high`` and
    ``ratio_unresolved`` (None for each without a reference path)."""
    if paired is None:
        return dict(time_ratio=None, time_ratio_low=None, time_ratio_high=None, ratio_unresolved=None)
    return dict(
        time_ratio=paired.ratio,
        time_ratio_low=paired.low,
        time_ratio_high=paired.high,
        ratio_unresolved=paired.unresolved,
    )
