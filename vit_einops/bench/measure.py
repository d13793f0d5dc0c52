"""How every number of the benchmark is measured: time (torch.utils.benchmark), peak memory (the profiler's
allocator records) and the machine's float matmul ceiling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.benchmark import Measurement, Timer


@dataclass
class Timing:
    """Seconds per call: the median and interquartile range over every measured block, and how many blocks."""

    median_s: float
    iqr_s: float
    blocks: int


def time_interleaved(fns: dict[str, Callable[[], object]], *, rounds: int, min_run_time: float) -> dict[str, Timing]:
    """Time each callable with ``Timer.blocked_autorange``, the callables taking turns for ``rounds`` rounds.

    Interleaving spreads slow drifts of the machine (other processes, clock, heat) over every path alike, so
    the ratios between paths are fairer than their absolute times. Each round's blocked_autorange starts with
    its own warm-up call (the block-size estimate), and the rounds' blocks are merged before taking the median.
    The calls run under the caller's grad mode and torch's current thread count.
    """
    threads = torch.get_num_threads()
    timers = {
        name: Timer("fn()", globals={"fn": fn}, num_threads=threads, description=name) for name, fn in fns.items()
    }
    runs: dict[str, list[Measurement]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            runs[name].append(timer.blocked_autorange(min_run_time=min_run_time))
    timings = {}
    for name, measurements in runs.items():
        (merged,) = Measurement.merge(measurements)
        timings[name] = Timing(merged.median, merged.iqr, len(merged.times))
    return timings


def peak_memory_bytes(fns: dict[str, Callable[[], object]]) -> dict[str, int]:
    """For each callable, the high-water mark of bytes it allocates on the CPU beyond what was live before it.

    Measured, not estimated: torch's profiler with ``profile_memory=True`` records every allocation and free of
    torch's CPU allocator, in order. The callables run one after the other, each inside its own labelled range,
    under one profiler (starting one costs ~0.2 s); the running sum of the records inside a range, maximised, is
    that callable's peak. Tensors that existed before the call (inputs, weights) are not counted; the result and
    everything the call keeps alive are. Memory a library allocates outside torch's allocator (BLAS scratch
    space) is not seen.
    """
    labels = {name: f"vit_einops.bench.peak/{name}" for name in fns}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for name, fn in fns.items():
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


def matmul_ceiling(dtype: torch.dtype, size: int = 2048, min_run_time: float = 1.0) -> dict[str, float]:
    """The machine's achievable matmul rate: torch.mm of two (size, size) matrices, 2*size^3 FLOPs per call."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(dtype) for _ in range(2))
    timing = time_interleaved({"mm": lambda: torch.mm(a, b)}, rounds=1, min_run_time=min_run_time)["mm"]
    return dict(
        size=size, median_s=timing.median_s, iqr_s=timing.iqr_s, gflop_per_s=2 * size**3 / timing.median_s / 1e9
    )
