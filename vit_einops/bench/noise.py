"""Is the machine lying? Two signs that a timing is not trustworthy, checked for every row of the benchmark.

1. **Busy machine**: other processes use the cores the benchmark runs on. Measured directly where Linux's
   /proc/stat can be read: the machine's busy CPU time (its aggregate "cpu" line: user, nice, system, irq,
   softirq and steal; not idle or iowait) and this process's own CPU time (every thread, user + system) are
   sampled at the start and end of each measurement; what the machine spent beyond our own, over the wall time,
   is the cores the *other* processes used. The machine is busy when that exceeds the cores the benchmark leaves
   free (cpu_count - threads) by more than CPU_MARGIN. /proc/stat counts in ticks (CLK_TCK, 100 a second), one
   tick per CPU at each end of a window of w seconds is cpu_count / (100 w) cores, and the verdict gives the other
   processes that benefit of the doubt, so a window of milliseconds (the smoke grid) cannot call the machine busy.
   Why not the load average: it counts threads that are runnable *or* in uninterruptible sleep, and on some
   virtual machines it never falls to 0 (it can read about 1.0 while /proc/stat, vmstat and ps show an idle
   machine; benchmarks/README.md), so "load above the thread count" would mark every row of an idle run. Where
   /proc/stat cannot be read (not Linux), the load average is the fallback: the 1-minute average counts the
   benchmark's own threads too, damped with a 60 s time constant, so t seconds into a run with ``threads`` busy
   threads our own share is threads*(1-e^(-t/60)); what remains of each sample is the other processes' load,
   judged against the same free cores with LOAD_MARGIN. Either way the load average is recorded with every row.
   Why it matters: every op of a multi-op path waits at a thread barrier for its slowest thread, so a path of
   many small ops (chunked) loses far more to a competing process than one fused kernel (SDPA): the ratios
   between paths are wrong, not just the absolute times.
2. **Spread**: the interquartile range of a row's timing blocks over their median. Above IQR_THRESHOLD the row's
   median is not stable enough to compare at the precision the targets need (1.3x).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..base.threads import CpuUse, ProbeSample, busy_cpu_seconds, current_load  # noqa: F401 (the bench's names)
from ..base.threads import LoadProbe as MachineProbe

# torch.utils.benchmark's own threshold: Measurement.meets_confidence() and the "may be unreliable" warning of
# its __repr__ use IQR/median > 0.1 (0.25 for "gross" noise). A 10% spread also decides a 1.3x comparison.
IQR_THRESHOLD = 0.10
# The load-average fallback: a process runnable half of the time, above what an idle machine's daemons and shells
# add; but some virtual machines' load never falls under ~1: why CPU time decides where it can.
LOAD_MARGIN = 0.5
# The CPU-time verdict: a fifth of a core taken from the benchmark's cores. CPU time counts what the other
# processes *got*, not what they wanted: on a full machine two spinners beside a 1-thread run on 2 cores get only
# 4/3 cores (three runnable threads share two), 1/3 of a core over the free one, so the margin must be under 1/3
# to see them; one spinner beside 2 threads gets 2/3. An idle machine's daemons use far less (benchmarks/README.md).
CPU_MARGIN = 0.2

ADVICE = (
    "the machine is busy or the timings are unstable: compare ratios only, rerun when the machine is idle, "
    "or --retries 2 to measure the noisy rows again"
)
# Only where the run used more than one thread: after a run on one, it would change nothing.
THREADS_ADVICE = (
    "; --threads 1 leaves a core free for other work, and no thread waits at a barrier for a preempted sibling"
)


def advice(threads: int) -> str:
    """What to do about a noisy run that used at most ``threads`` threads."""
    return ADVICE + (THREADS_ADVICE if threads > 1 else "")


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


def cpu_verdict(cpu: CpuUse, threads: int, cpu_count: int | None = None) -> NoiseVerdict:
    """Busy when the other processes used more than the cores left free plus CPU_MARGIN, even at the low end of
    what the ticks allow (others_cores - uncertainty_cores)."""
    cpu_count = cpu_count or os.cpu_count() or 1
    others = cpu.others_cores
    if others - cpu.uncertainty_cores > max(0, cpu_count - threads) + CPU_MARGIN:
        reason = (
            f"other processes used {others:.1f} cores while {threads} of {cpu_count} are in use here "
            f"(CPU time over {cpu.wall_s:.1f} s)"
        )
        return NoiseVerdict(True, [reason])
    return NoiseVerdict()


def machine_verdict(
    load: Sequence[float],
    threads: int,
    cpu_count: int | None = None,
    running_s: Sequence[float] = (0.0, math.inf),
    cpu: CpuUse | None = None,
) -> NoiseVerdict:
    """Whether other processes were using the benchmark's cores: the CPU-time verdict where ``cpu`` was measured,
    else the load-average verdict."""
    return (
        cpu_verdict(cpu, threads, cpu_count) if cpu is not None else load_verdict(load, threads, cpu_count, running_s)
    )


class LoadProbe(MachineProbe):
    """Samples of the machine around each measurement (:class:`vit_einops.base.threads.LoadProbe`: the load average,
    recorded, and the fallback verdict; CPU time, the verdict where Linux has it), and each row's noise columns."""

    def row_fields(self, timing, start: ProbeSample, end: ProbeSample, threads: int) -> dict:
        """:func:`row_fields` of a timing measured between two samples of this probe."""
        load, running_s = (start.load, end.load), (start.running_s, end.running_s)
        return row_fields(timing, load, threads, self.cpu_count, running_s, self.cpu_use(start, end))


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


def judge(
    timings: Mapping[str, object],
    load: Sequence[float],
    threads: int,
    cpu_count: int | None = None,
    cpu: CpuUse | None = None,
):
    """One verdict for a set of timings (objects with median_s and iqr_s) measured under ``load`` (start, end)
    and, where measured, ``cpu`` (the CPU time of the same window, which then decides instead of the load)."""
    return combine(
        machine_verdict(load, threads, cpu_count, cpu=cpu),
        *(spread_verdict(t.median_s, t.iqr_s, name) for name, t in timings.items()),
    )



def row_fields(
    timing,
    load: Sequence[float],
    threads: int,
    cpu_count: int | None = None,
    running_s: Sequence[float] = (0.0, math.inf),
    cpu: CpuUse | None = None,
) -> dict:
    """The noise columns of one result row: quartiles, IQR/median, the load around its measurement, the cores the
    other processes used during it (``others_cores``; None where /proc/stat could not be read), and the verdict
    (``noisy``, and ``noise``: the reasons joined, empty when trustworthy)."""
    verdict = combine(
        machine_verdict(load, threads, cpu_count, running_s, cpu), spread_verdict(timing.median_s, timing.iqr_s)
    )
    return dict(
        p25_s=timing.p25_s,
        p75_s=timing.p75_s,
        iqr_ratio=timing.iqr_ratio,
        load_start=round(load[0], 2),
        load_end=round(load[1], 2),
        others_cores=None if cpu is None else round(cpu.others_cores, 2),
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
    cpu: CpuUse | None = None,
    at_start: NoiseVerdict | None = None,
    most_threads: int | None = None,
) -> dict:
    """The run's verdict for results.json (``most_threads``: the most threads the run used, when the count followed the
    free cores; the advice names --threads 1 only after a run on more): ``noisy`` when the machine was busy around
    the run (``cpu``: the CPU time of windows at its start and end; without it, the load at its start and end), or
    busy in its first window alone (``at_start``: the verdict the run printed before its rows), or any row is noisy;
    with counts, the reasons and the advice."""
    run_busy = machine_verdict(load, threads, cpu_count, running_s, cpu)
    if at_start is not None and at_start.noisy and not run_busy.noisy:
        run_busy = NoiseVerdict(True, [f"at the start, {reason}" for reason in at_start.reasons])
    flagged = [r for r in rows if r["noisy"]]
    reasons = list(run_busy.reasons)
    if flagged:
        reasons.append(f"{len(flagged)} of {len(rows)} rows are noisy (load or IQR/median > {IQR_THRESHOLD})")
    noisy = run_busy.noisy or bool(flagged)
    return dict(
        noisy=noisy,
        reasons=reasons,
        rows_noisy=len(flagged),
        rows=len(rows),
        iqr_threshold=IQR_THRESHOLD,
        load_margin=LOAD_MARGIN,
        cpu_margin=CPU_MARGIN,
        advice=advice(most_threads or threads) if noisy else None,
    )
