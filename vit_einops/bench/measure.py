"""How every number of the benchmark is measured: time (torch.utils.benchmark), peak memory (the profiler's
allocator records) and the machine's float matmul ceiling."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.benchmark import Measurement, Timer

from ..base.bootstrap import percentile


@dataclass
class Timing:
    """Seconds per call over every measured block: the median, the quartiles p25/p75 and their difference the
    interquartile range, how many blocks, and the fastest block (``min_s``: other processes and the cache only
    ever add time, so on a shared machine the ratio of two paths' minimums moves far less between runs than the
    ratio of their medians), and ``round_s``: each round's median, in the order the rounds ran (the paired ratios
    of vit_einops.bench.paired divide these round by round)."""

    median_s: float
    iqr_s: float
    blocks: int
    p25_s: float = float("nan")
    p75_s: float = float("nan")
    min_s: float = float("nan")
    round_s: tuple[float, ...] = ()

    @property
    def iqr_ratio(self) -> float:
        """IQR / median: the spread relative to the number reported (vit_einops.bench.noise judges it)."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")


def quartiles(times: list[float]) -> tuple[float, float]:
    """p25 and p75 of ``times`` by linear interpolation (numpy's default, as torch.utils.benchmark uses), with the
    one percentile the paired ratios' intervals use."""
    ordered = sorted(times)
    return percentile(ordered, 0.25), percentile(ordered, 0.75)


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    rounds: int,
    min_run_time: float,
    clock: Callable[[], float] | None = None,
    flush: Callable[[], object] | None = None,
) -> dict[str, Timing]:
    """Time each callable with ``Timer.blocked_autorange``, the callables taking turns for ``rounds`` rounds.

    Interleaving spreads slow drifts of the machine (other processes, clock, heat) over every path alike, so
    the ratios between paths are fairer than their absolute times. Each round's blocked_autorange starts with
    its own warm-up call (the block-size estimate), and the rounds' blocks are merged before taking the median;
    each round's own median is kept too (``round_s``), for ratios taken round by round.
    The calls run under the caller's grad mode and torch's current thread count.

    ``clock``: the seconds the Timer reads before and after each block (default: torch.utils.benchmark's, which is
    time.perf_counter; vit_einops.bench.device gives CUDA's events). ``flush``: called before each path's round,
    outside its timing (the device's cache flush).
    """
    threads = torch.get_num_threads()
    clock = {} if clock is None else {"timer": clock}
    timers = {
        name: Timer("fn()", globals={"fn": fn}, num_threads=threads, description=name, **clock)
        for name, fn in fns.items()
    }
    runs: dict[str, list[Measurement]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            if flush is not None:
                flush()
            runs[name].append(timer.blocked_autorange(min_run_time=min_run_time))
    timings = {}
    for name, measurements in runs.items():
        (merged,) = Measurement.merge(measurements)
        p25, p75 = quartiles(merged.times)
        round_s = tuple(m.median for m in measurements)
        timings[name] = Timing(merged.median, p75 - p25, len(merged.times), p25, p75, min(merged.times), round_s)
    return timings


# Lines torch's profiler writes straight to file descriptor 2 from C++ (no Python warning to filter): the CPU
# allocator's note when a block allocated before profiling is freed inside it (a training step's zero_grad does
# that; our peaks count only what a call allocates, so the note says nothing about them), and kineto's own log.
PROFILER_NOISE = ("Memory block of unknown size was allocated before the profiling started", "USDT:", "libkineto")


@contextlib.contextmanager
def filtered_stderr(drop: tuple[str, ...]) -> Iterator[None]:
    """Inside the block, lines written to file descriptor 2 that contain any of ``drop`` are withheld; every
    other line is written to stderr when the block ends. Only this block's stderr is touched, and it is restored
    even on an exception."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().splitlines(keepends=True)
            kept = b"".join(line for line in lines if not any(d.encode() in line for d in drop))
            if kept:
                os.write(2, kept)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once (find_library runs ldconfig); None where libc has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl without it, Windows)
        return None


def trim_heap() -> None:
    """Ask glibc to give the free pages of its heap back to the OS. Memory freed by a call stays resident
    otherwise: torch's tensors of up to 32 MB come from the heap once glibc has raised its mmap threshold (it does
    on the first free of a large block), and small blocks allocated in between keep the freed ones from being
    reused whole. A no-op where libc has no malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_memory() -> None:
    """Give memory freed by the last job back to the OS before the next one: collect garbage, then trim the heap
    (otherwise what a smaller model freed stays resident while the next, larger one runs, raising the peak RSS)."""
    gc.collect()
    trim_heap()


def peak_memory_bytes(fns: dict[str, Callable[[], object]]) -> dict[str, int]:
    """For each callable, the high-water mark of bytes it allocates on the CPU beyond what was live before it.

    Measured, not estimated: torch's profiler with ``profile_memory=True`` records every allocation and free of
    torch's CPU allocator, in order. The callables run one after the other, each inside its own labelled range,
    under one profiler (starting one per callable would cost more than the small ones take); the running sum of the
    records inside a range, maximised, is that callable's peak. Tensors that existed before the call (inputs,
    weights) are not counted; the result and everything the call keeps alive are. Memory a library allocates outside
    torch's allocator (BLAS scratch space) is not seen.

    The heap is trimmed before each call (outside its range), so that what the calls before it freed is not
    resident while it runs: the profiler's records, allocated between the tensors, fragment the heap, and
    profiling vit_b_16's four training steps in a row otherwise added 0.1 GB of resident memory per step.
    """
    labels = {name: f"vit_einops.bench.peak/{name}" for name in fns}
    with filtered_stderr(PROFILER_NOISE), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for name, fn in fns.items():
            trim_heap()
            with record_function(labels[name]):
                fn()
    # The raw records: the FunctionEvent view folds allocations into the op that made them.
    events = prof.profiler.kineto_results.events()
    ranges = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in labels.values()}
    records = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    peaks = {}
    for name, label in labels.items():
        start, end = ranges[label]
        live = peak = 0
        for t, nbytes in records:
            if start <= t <= end:
                live += nbytes
                peak = max(peak, live)
        peaks[name] = peak
    return peaks


def matmul_ceiling(
    dtype: torch.dtype,
    size: int = 2048,
    min_run_time: float = 1.0,
    device: torch.device | str = "cpu",
    time: Callable[..., dict[str, Timing]] = time_interleaved,
) -> dict[str, float]:
    """The achievable matmul rate: torch.mm of two (size, size) matrices on ``device``, 2*size^3 FLOPs per call,
    timed by ``time`` (that device's: vit_einops.bench.device.Meter.time)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(device, dtype) for _ in range(2))
    timing = time({"mm": lambda: torch.mm(a, b)}, rounds=1, min_run_time=min_run_time)["mm"]
    return dict(
        size=size, median_s=timing.median_s, iqr_s=timing.iqr_s, gflop_per_s=2 * size**3 / timing.median_s / 1e9
    )
