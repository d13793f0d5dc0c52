"""Is the machine lying? Two signs that a timing is not trustworthy, checked for every row of the benchmark.

1. **Load**: other processes want the cores the benchmark uses. The 1-minute load average counts runnable
   threads, the benchmark's own included, damped with a 60 s time constant: t seconds into a run with ``threads``
   busy threads our own share is threads*(1-e^(-t/60)). Subtracting it from each sample leaves what the other
   processes load; the machine is busy when that exceeds the cores the benchmark leaves free
   (cpu_count - threads) by more than LOAD_MARGIN. With threads = cores (torch's default) that is "load above the
   thread count".
   Why it matters: every op of a multi-op path waits at a thread barrier for its slowest thread, so a path of
   many small ops (chunked) loses far more to a competing process than one fused kernel (SDPA): the ratios
   between paths are wrong, not just the absolute times.
2. **Spread**: the interquartile range of a row's timing blocks over their median. Above IQR_THRESHOLD the row's
   median is not stable enough to compare at the precision the targets need (1.3x).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# torch.utils.benchmark's own threshold: Measurement.meets_confidence() and the "may be unreliable" warning of
# its __repr__ use IQR/median > 0.1 (0.25 for "gross" noise). A 10% spread also decides a 1.3x comparison.
IQR_THRESHOLD = 0.10
# A process runnable half of the time: an idle machine's daemons and shells stay well under it (0.0 to 0.3).
LOAD_MARGIN = 0.5

ADVICE = (
    "the machine is busy or the timings are unstable: compare ratios only, rerun when the machine is idle, "
    "use --threads 1 (one core stays free for other work, and no thread waits at a barrier for a preempted "
    "sibling), or --retries 2 to measure the noisy rows again"
)


@dataclass
class NoiseVerdict:
    """Whether a measurement is trustworthy: ``noisy`` and the reasons (empty when not noisy)."""

    noisy: bool = False
    reasons: list[str] = field(default_factory=list)


def own_load(threads: int, running_s: float) -> float:
    """What the benchmark itself adds to the 1-minute load average after ``running_s`` seconds with ``threads``
    busy threads: the kernel's average is exponentially damped with a 60 s time constant, so threads*(1-e^(-t/60))."""
    return threads * (1.0 - math.exp(-running_s / 60.0)) if math.isfinite(running_s) else float(threads)


def others_load(
    load_start: float, load_end: float, threads: int, running_s: Sequence[float] = (0.0, math.inf)
) -> float:
    """The load the *other* processes put on the machine during a measurement: each load sample less our own
    share at that time (``running_s``: seconds since the benchmark began, at the start and end of the
    measurement; by default the start is taken as our beginning and the end as long after), the larger of the two."""
    return max(load_start - own_load(threads, running_s[0]), load_end - own_load(threads, running_s[1]))


def load_verdict(
    load: Sequence[float], threads: int, cpu_count: int | None = None, running_s: Sequence[float] = (0.0, math.inf)
) -> NoiseVerdict:
    """Busy when the other processes' load exceeds the cores left free by more than LOAD_MARGIN."""
    cpu_count = cpu_count or os.cpu_count() or 1
    load_start, load_end = load
    others = others_load(load_start, load_end, threads, running_s)
    free = max(0, cpu_count - threads)
    if others > free + LOAD_MARGIN:
        reason = (
            f"load {load_start:.2f} -> {load_end:.2f} on {cpu_count} CPUs: other processes want "
            f"{others:.1f} cores while {threads} of {cpu_count} are in use here"
        )
        return NoiseVerdict(True, [reason])
    return NoiseVerdict()


class LoadProbe:
    """Samples of the load average, each with the seconds since this probe (the benchmark run) began."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def sample(self) -> tuple[float, float]:
        return current_load(), time.monotonic() - self.started


def spread_verdict(median_s: float, iqr_s: float, name: str = "") -> NoiseVerdict:
    """Noisy when IQR/median > IQR_THRESHOLD."""
    ratio = iqr_s / median_s if median_s > 0 else float("inf")
    if ratio > IQR_THRESHOLD:
        who = f"{name}: " if name else ""
        return NoiseVerdict(True, [f"{who}IQR/median {ratio:.2f} > {IQR_THRESHOLD}"])
    return NoiseVerdict()


def combine(*verdicts: NoiseVerdict) -> NoiseVerdict:
    reasons = [r for v in verdicts for r in v.reasons]
    return NoiseVerdict(any(v.noisy for v in verdicts), reasons)


def judge(timings: Mapping[str, object], load: Sequence[float], threads: int, cpu_count: int | None = None):
    """One verdict for a set of timings (objects with median_s and iqr_s) measured under ``load`` (start, end)."""
    return combine(
        load_verdict(load, threads, cpu_count),
        *(spread_verdict(t.median_s, t.iqr_s, name) for name, t in timings.items()),
    )


def current_load() -> float:
    """The 1-minute load average now, or NaN where the OS has none (then no load verdict is possible)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def row_fields(
    timing,
    load: Sequence[float],
    threads: int,
    cpu_count: int | None = None,
    running_s: Sequence[float] = (0.0, math.inf),
) -> dict:
    """The noise columns of one result row: quartiles, IQR/median, the load around its measurement, and the
    verdict (``noisy``, and ``noise``: the reasons joined, empty when trustworthy)."""
    verdict = combine(load_verdict(load, threads, cpu_count, running_s), spread_verdict(timing.median_s, timing.iqr_s))
    return dict(
        p25_s=timing.p25_s,
        p75_s=timing.p75_s,
        iqr_ratio=timing.iqr_ratio,
        load_start=round(load[0], 2),
        load_end=round(load[1], 2),
        noisy=verdict.noisy,
        noise="; ".join(verdict.reasons),
    )


def noise_score(rows: Sequence[Mapping]) -> tuple[int, float]:
    """How noisy a set of rows is, for choosing between attempts: noisy rows first, then the worst IQR/median."""
    return sum(bool(r["noisy"]) for r in rows), max((r["iqr_ratio"] for r in rows), default=0.0)


def summary(
    rows: Sequence[Mapping],
    load: Sequence[float],
    threads: int,
    cpu_count: int | None = None,
    running_s: Sequence[float] = (0.0, math.inf),
) -> dict:
    """The run's verdict for results.json: ``noisy`` when the load at the start or end of the run said busy or
    any row is noisy, with counts, the reasons and the advice."""
    run_load = load_verdict(load, threads, cpu_count, running_s)
    flagged = [r for r in rows if r["noisy"]]
    reasons = list(run_load.reasons)
    if flagged:
        reasons.append(f"{len(flagged)} of {len(rows)} rows are noisy (load or IQR/median > {IQR_THRESHOLD})")
    noisy = run_load.noisy or bool(flagged)
    return dict(
        noisy=noisy,
        reasons=reasons,
        rows_noisy=len(flagged),
        rows=len(rows),
        iqr_threshold=IQR_THRESHOLD,
        load_margin=LOAD_MARGIN,
        advice=ADVICE if noisy else None,
    )
