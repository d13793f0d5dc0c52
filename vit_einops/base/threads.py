"""Torch's intra-op thread count for every command: as many threads as the machine has free cores, followed while
the work runs.

Why: torch splits each op between its threads (OpenMP) and ends it at a barrier where every thread waits for the
slowest. A thread more than the free cores waits for a core at every barrier, so a path of many small ops runs
several times slower beside another process than on one thread less. The free cores are the machine's CPUs less
what the other processes used over a short window (CPU time from /proc/stat, less this process's own; where
/proc/stat cannot be read, the 1-minute load average), rounded, at most this process's CPUs, at least 1.

The count is chosen when the work starts and checked again between batches, rounds or images
(:func:`follow_free_cores`, at most once every RECHECK_S seconds: one read of /proc/stat), so a run that starts on
an idle machine and is then shared drops a thread, and takes it back when the other process ends.

``--threads N`` (every command) and the environment variable ``VIT_EINOPS_THREADS=N`` fix the count instead: the
flag, then the variable, then the free cores. The policy is applied by the commands (and in Python by ``with
vit_einops.thread_policy(): ...`` around the work): importing this module changes nothing, and leaving the block
puts torch's count back.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import astuple, dataclass, field
from pathlib import Path

import torch

from .checks import check_int, check_nonnegative_float, check_positive_float

ENV_VAR = "VIT_EINOPS_THREADS"
# How long the first choice watches the machine: /proc/stat counts in ticks of 10 ms, one per CPU at each end of
# the window, so 0.3 s reads the other processes to +-0.07 cores on 2 CPUs.
FREE_WINDOW_S = 0.3
# How often the count is checked again while the work runs: one read of /proc/stat, and over a window this long the
# ticks are +-0.02 cores on 2 CPUs.
RECHECK_S = 1.0


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


def current_load() -> float:
    """The 1-minute load average now, or NaN where the OS has none (then no load verdict is possible)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity call
        return os.cpu_count() or 1


def _clock_ticks() -> float | None:
    """/proc/stat's unit, USER_HZ (100 on every Linux); None where the OS has no sysconf or no such value."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return None
    return float(ticks) if ticks > 0 else None


@dataclass(frozen=True)
class CpuUse:
    """The machine's CPU time during one window of ``wall_s`` seconds: ``busy_s`` CPU-seconds all CPUs were busy
    (/proc/stat), ``own_s`` of them this process's (every thread), and ``resolution_s``, how far one reading of the
    busy counter may be off (one tick per CPU)."""

    wall_s: float
    busy_s: float
    own_s: float
    resolution_s: float = 0.0

    def __post_init__(self) -> None:
        check_positive_float("CpuUse.wall_s", self.wall_s)
        for name in ("busy_s", "own_s", "resolution_s"):
            check_nonnegative_float(f"CpuUse.{name}", getattr(self, name))

    def __add__(self, other: CpuUse) -> CpuUse:
        """Two windows as one: their seconds added (the bench's check before and after its grid)."""
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


@dataclass(frozen=True)
class ProbeSample:
    """One sample of the machine: the 1-minute load average, seconds since the probe began, the machine's busy
    CPU-seconds (None where /proc/stat cannot be read) and this process's CPU-seconds."""

    load: float
    running_s: float
    busy_s: float | None
    own_s: float


class LoadProbe:
    """Samples of the machine, each with the seconds since this probe began: the load average and CPU time.

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


def _free_between(probe: LoadProbe, start: ProbeSample, end: ProbeSample, when: str) -> tuple[int, str, float]:
    """(the free cores, how that was found, the cores the other processes used) between two samples."""
    cpu = probe.cpu_use(start, end)
    if cpu is not None:
        others = cpu.others_cores
        how = f"other processes used {others:.2f} cores over {cpu.wall_s:.2g} s {when} (/proc/stat)"
    else:
        others = end.load if end.load == end.load else 0.0  # NaN: no load average either
        how = f"load average {end.load:.2f} {when}"
    return max(1, min(available_cpus(), round(probe.cpu_count - others))), how, others


def free_cores(
    probe: LoadProbe | None = None, window_s: float = FREE_WINDOW_S, sleep: Callable[[float], None] = time.sleep
) -> tuple[int, str]:
    """How many threads the machine has room for now, and how that was found: the cores the other processes used
    over ``window_s`` seconds of this process sleeping, taken from the machine's CPUs, rounded, at most this
    process's CPUs, at least 1. Where /proc/stat cannot be read, the 1-minute load average stands for the other
    processes (it counts threads in uninterruptible sleep too, and on some virtual machines reads about 1.0 when
    idle: why CPU time decides where it can)."""
    probe = probe or LoadProbe()
    start = probe.sample()
    sleep(window_s)
    free, how, _ = _free_between(probe, start, probe.sample(), "at the start")
    return free, how


def fixed_threads(threads: int | None, flag: str = "--threads") -> tuple[int | None, str]:
    """The count ``threads`` (given as ``flag``) or the variable VIT_EINOPS_THREADS fixes, checked: 1 to this
    machine's CPUs; (None, "") when neither is set. ValueError naming the flag or the variable and the value."""
    if threads is not None:
        return check_threads(flag, threads), flag
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return None, ""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"{ENV_VAR} must be a whole number of threads from 1 to {os.cpu_count() or 1}, got {text!r}"
        ) from None
    return check_threads(ENV_VAR, value), ENV_VAR


def check_threads(name: str, value: object) -> int:
    """A thread count: 1 to the machine's CPUs (more threads than cores only fight over them, and thousands would
    exhaust the process's thread limit)."""
    cpus = os.cpu_count() or 1
    value = check_int(name, value)
    if not 1 <= value <= cpus:
        raise ValueError(f"{name} {value} is out of range: expected 1 to {cpus} (this machine's CPUs)")
    return value


@dataclass
class ThreadPolicy:
    """The thread count of one run: ``fixed`` by the flag or the variable (``source`` names which), or chosen from
    the free cores at the first :meth:`follow` and followed at each later one, at most every ``recheck_s`` seconds.
    ``used`` lists the counts in the order the run used them."""

    fixed: int | None = None
    source: str = ""
    probe: LoadProbe = field(default_factory=lambda: LoadProbe())  # looked up at each policy: tests script it
    window_s: float = FREE_WINDOW_S
    recheck_s: float = RECHECK_S
    sleep: Callable[[float], None] = time.sleep
    used: list[int] = field(default_factory=list)
    others: float = 0.0  # the cores the other processes used at the last check
    _last: ProbeSample | None = None

    def __post_init__(self) -> None:
        self._last = None if self.fixed is not None else self.probe.sample()

    @property
    def threads(self) -> int | None:
        """The count in use now; None before the first :meth:`follow` of a free-cores policy."""
        return self.used[-1] if self.used else None

    def follow(self) -> int:
        """Set torch's count to the fixed one, or to the cores free since the last check (the first check waits
        until ``window_s`` has passed since the policy began); returns the count in use."""
        if self.fixed is not None:
            return self._use(self.fixed)
        waited = self.probe.clock() - self.probe.started - self._last.running_s
        if self.used and waited < self.recheck_s:  # the clock alone: no file is read between checks
            return self._use(self.used[-1])
        now = self.probe.sample()
        waited = now.running_s - self._last.running_s
        if waited < self.window_s:  # the first choice: the window is what remains of the time since the policy began
            self.sleep(self.window_s - waited)
            now = self.probe.sample()
        if self.used and self.probe.cpu_use(self._last, now) is None:
            # Without /proc/stat only the load average is left, and while the work runs it counts our own threads:
            # the first choice stands.
            self._last = now
            return self._use(self.used[-1])
        when = "at the last check" if self.used else "at the start"
        free, self.source, self.others = _free_between(self.probe, self._last, now, when)
        self._last = now
        return self._use(free)

    def _use(self, threads: int) -> int:
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.used.append(threads)
        elif torch.get_num_threads() != threads:  # something in the run set it: the policy's count again
            torch.set_num_threads(threads)
        return threads

    def describe(self) -> str:
        """One line for the command's summary: "threads: 1 (1 of 2 cores busy with other processes)", "threads: 2
        (--threads)", "threads: 2, then 1 (...)" when the count followed the free cores while the run went on."""
        counts = ", then ".join(map(str, self.used)) if self.used else str(torch.get_num_threads())
        if self.fixed is not None:
            why = self.source
        elif not self.used:
            why = "torch's: no work was run under the policy"
        else:
            cpus = self.probe.cpu_count
            busy = min(cpus, round(self.others))
            why = f"{busy} of {cpus} cores busy with other processes" if busy else f"all {cpus} cores free"
            if len(self.used) > 1:
                why = f"followed the free cores; at the last check {why}"
            why += f"; --threads or {ENV_VAR} fixes it"
        return f"threads: {counts} ({why})"


_ACTIVE: ContextVar[ThreadPolicy | None] = ContextVar("vit_einops_thread_policy", default=None)


@contextlib.contextmanager
def thread_policy(
    threads: int | None = None, flag: str = "--threads", *, lazy: bool = False, **options
) -> Iterator[ThreadPolicy]:
    """Within the block, torch's thread count follows the free cores (or is fixed by ``threads``, given as ``flag``,
    or by VIT_EINOPS_THREADS), checked again at each :func:`follow_free_cores` in the work (faithfulness's chunks,
    the explanation methods, training batches); torch's count is put back when the block ends. The free cores are
    first read on entry, or with ``lazy`` (the commands) at the first :func:`follow_free_cores`, so that a command
    refusing its arguments never waits for the window. ``options`` go to :class:`ThreadPolicy` (tests script the
    probe)."""
    fixed, source = fixed_threads(threads, flag)
    before = torch.get_num_threads()
    policy = ThreadPolicy(fixed, source, **options)
    if fixed is not None or not lazy:
        policy.follow()
    token = _ACTIVE.set(policy)
    try:
        yield policy
    finally:
        _ACTIVE.reset(token)
        torch.set_num_threads(before)


def follow_free_cores() -> int:
    """Between batches, rounds or images: the active policy's :meth:`ThreadPolicy.follow` (cheap: at most one read
    of /proc/stat a second). Without a policy (library code called from Python) torch's count is left alone."""
    policy = _ACTIVE.get()
    return torch.get_num_threads() if policy is None else policy.follow()


def threads_summary() -> str:
    """The active policy's :meth:`ThreadPolicy.describe`, or torch's count when no policy is active."""
    policy = _ACTIVE.get()
    return f"threads: {torch.get_num_threads()} (torch's)" if policy is None else policy.describe()
