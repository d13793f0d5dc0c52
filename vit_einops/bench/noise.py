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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path

from ..base.checks import check_nonnegative_float, check_positive_float

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


@dataclass(frozen=True)
class CpuUse:
    """The machine's CPU time during one measurement window of ``wall_s`` seconds: ``busy_s`` CPU-seconds all CPUs
    were busy (/proc/stat), ``own_s`` of them this process's (every thread), and ``resolution_s``, how far one
    reading of the busy counter may be off (one tick per CPU)."""

    wall_s: float
    busy_s: float
    own_s: float
    resolution_s: float = 0.0

    def __post_init__(self) -> None:
        check_positive_float("CpuUse.wall_s", self.wall_s)
        for name in ("busy_s", "own_s", "resolution_s"):
            check_nonnegative_float(f"CpuUse.{name}", getattr(self, name))

    def __add__(self, other: CpuUse) -> CpuUse:
        """Two windows as one: their seconds added (the run's check before and after the grid)."""
        return CpuUse(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def others_cores(self) -> float:
        """The cores the other processes used on average; never below 0 (our own clock counts finer than
        /proc/stat's ticks, so the difference can dip under 0 on an idle machine)."""
        return max(0.0, (self.busy_s - self.own_s) / self.wall_s)

    @property
    def uncertainty_cores(self) -> float:
        """How far others_cores may be off because /proc/stat counts whole ticks."""
        return self.resolution_s / self.wall_s


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


def busy_cpu_seconds(stat: str, ticks_per_s: float) -> float | None:
    """The CPU-seconds all CPUs spent busy since boot, from /proc/stat's text: the aggregate "cpu" line's total
    less idle and iowait, over its first eight fields (user nice system idle iowait irq softirq steal; the guest
    fields that follow are already counted in user and nice). None when that line is missing or malformed."""
    line = next((fields for fields in (ln.split() for ln in stat.splitlines()) if fields[:1] == ["cpu"]), [])
    try:
        ticks = [int(f) for f in line[1:9]]
    except ValueError:
        return None
    if len(ticks) < 4 or min(ticks) < 0:  # user nice system idle at least (every Linux since 2.4)
        return None
    return (sum(ticks) - sum(ticks[3:5])) / ticks_per_s


def read_proc_stat() -> str:
    return Path("/proc/stat").read_text()


@dataclass(frozen=True)
class ProbeSample:
    """One sample of the machine: the 1-minute load average, seconds since the probe began, the machine's busy
    CPU-seconds (None where /proc/stat cannot be read) and this process's CPU-seconds."""

    load: float
    running_s: float
    busy_s: float | None
    own_s: float


class LoadProbe:
    """Samples of the machine around each measurement, each with the seconds since this probe (the benchmark run)
    began: the load average (recorded, and the fallback verdict) and CPU time (the verdict where Linux has it).

    The readers are arguments so that tests can feed synthetic /proc/stat text, CPU times and clocks:
    ``read_stat`` returns /proc/stat's text (an OSError: not available), ``own_cpu_s`` this process's CPU-seconds
    (time.process_time: user + system of every thread, os.times()'s sum at finer than its 10 ms), ``clock``
    monotonic seconds, ``load`` the 1-minute load average, ``ticks_per_s`` /proc/stat's unit (CLK_TCK).
    """

    def __init__(
        self,
        *,
        read_stat: Callable[[], str] = read_proc_stat,
        own_cpu_s: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        load: Callable[[], float] | None = None,
        ticks_per_s: float | None = None,
        cpu_count: int | None = None,
    ) -> None:
        self.read_stat, self.own_cpu_s, self.clock = read_stat, own_cpu_s, clock
        self.load = load or current_load
        self.ticks_per_s = ticks_per_s or _clock_ticks()
        self.cpu_count = cpu_count or os.cpu_count() or 1
        self.started = clock()

    def sample(self) -> ProbeSample:
        return ProbeSample(self.load(), self.clock() - self.started, self._busy_s(), self.own_cpu_s())

    def _busy_s(self) -> float | None:
        if self.ticks_per_s is None:
            return None
        try:
            return busy_cpu_seconds(self.read_stat(), self.ticks_per_s)
        except (OSError, UnicodeDecodeError):  # not Linux, or /proc not mounted
            return None

    def cpu_use(self, start: ProbeSample, end: ProbeSample) -> CpuUse | None:
        """The CPU time between two samples, or None when either lacks /proc/stat or the counters make no sense
        (a busy counter that went back, no time passed): then the load average decides."""
        wall = end.running_s - start.running_s
        if start.busy_s is None or end.busy_s is None or end.busy_s < start.busy_s or not wall > 0:
            return None
        return CpuUse(wall, end.busy_s - start.busy_s, end.own_s - start.own_s, self.cpu_count / self.ticks_per_s)

    def row_fields(self, timing, start: ProbeSample, end: ProbeSample, threads: int) -> dict:
        """:func:`row_fields` of a timing measured between two samples of this probe."""
        load, running_s = (start.load, end.load), (start.running_s, end.running_s)
        return row_fields(timing, load, threads, self.cpu_count, running_s, self.cpu_use(start, end))


def _clock_ticks() -> float | None:
    """/proc/stat's unit, USER_HZ (100 on every Linux); None where the OS has no sysconf or no such value."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return None
    return float(ticks) if ticks > 0 else None


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
) -> dict:
    """The run's verdict for results.json: ``noisy`` when the machine was busy around the run (``cpu``: the CPU
    time of windows at its start and end; without it, the load at its start and end), or busy in its first
    window alone (``at_start``: the verdict the run printed before its rows), or any row is noisy; with counts,
    the reasons and the advice."""
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
        advice=ADVICE if noisy else None,
    )
