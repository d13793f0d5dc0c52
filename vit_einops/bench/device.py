"""What differs between a CPU and a CUDA device in the bench: the dtypes each may run, the clock a round is timed
with, what empties the cache between rounds, and how peak memory is read.

On a CPU: torch.utils.benchmark's own timer (time.perf_counter), no flush, peak memory from the profiler's
allocator records (vit_einops.bench.measure). On CUDA: CUDA events on the current stream, a write of a buffer twice
the L2 size before each path's round (so no round starts with what the previous one left in L2), and
torch.cuda.max_memory_allocated after reset_peak_memory_stats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ..base.device import resolve_device
from . import env
from .measure import Timing, peak_memory_bytes, release_memory, time_interleaved
from .names import DTYPES

# Triton's do_bench writes 256 MB between timings: the buffer used where a device reports no L2 size.
FALLBACK_FLUSH_BYTES = 256 * 2**20


def check_device(device: str | torch.device) -> torch.device:
    """The bench's device: "cpu", "cuda" or "cuda:N" (vit_einops.base.device: CUDA refused, saying what is missing,
    where this torch or machine has none)."""
    if isinstance(device, str) and device == "auto":
        raise ValueError("device 'auto' is not a bench device; expected 'cpu', 'cuda' or 'cuda:N'")
    resolved = resolve_device(device)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def check_dtype(
    dtype: str,
    device: torch.device,
    flags: Iterable[str] | None = None,
    slowdown: Callable[[torch.dtype], float] | None = None,
) -> str:
    """``dtype`` if the bench should run it on ``device``; else a ValueError saying why, in one line.

    float32 runs everywhere. On a CPU, float16 and bfloat16 run only where the CPU has that dtype's matmul hardware
    (env.HALF_FLAGS; torch emulates it otherwise, far slower than float32) and a matmul in it measures no slower
    than float32. On CUDA, float16 runs on every device torch supports; bfloat16 needs compute capability 8.0 or
    later (Ampere). ``flags`` (default: /proc/cpuinfo's) and ``slowdown`` (default: env.half_slowdown, measured once
    per process) stand in for the machine.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype == "float32":
        return dtype
    reason = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if dtype == "bfloat16" and major < 8:
            name = torch.cuda.get_device_name(device)
            reason = f"{name} (compute capability {major}.{minor}) has no bfloat16 hardware; 8.0 or later has"
    elif not set(env.HALF_FLAGS[dtype]) & set(env.cpu_flags() if flags is None else flags):
        wanted = ", ".join(env.HALF_FLAGS[dtype])
        reason = f"this CPU has none of {wanted}: torch emulates {dtype}, far slower than float32"
    elif (ratio := (slowdown or env.half_slowdown)(getattr(torch, dtype))) > 1.0:
        reason = f"a 512x512 {dtype} matmul measured {ratio:.1f}x slower than float32 here"
    if reason:
        raise ValueError(f"not running {dtype} on {device.type}: {reason}; use --dtype float32")
    return dtype


def l2_flush_bytes(l2_bytes: int) -> int:
    """How many bytes to write so that a round finds nothing of the last one in an L2 cache of ``l2_bytes``: twice
    the cache (a buffer of exactly its size evicts everything only under strict LRU replacement, which GPUs do not
    document), or FALLBACK_FLUSH_BYTES where the size is unknown (0)."""
    if isinstance(l2_bytes, bool) or not isinstance(l2_bytes, int) or l2_bytes < 0:
        raise ValueError(f"L2 size {l2_bytes!r} is not a whole number of bytes >= 0")
    return 2 * l2_bytes if l2_bytes else FALLBACK_FLUSH_BYTES


class EventClock:
    """Seconds on a device's own clock, read the way torch.utils.benchmark's Timer reads its ``timer``: each call
    records an event on the current stream, waits for it, and returns the time since the first call.

    The driver gives the milliseconds between two events as a float32, whose resolution coarsens with the distance:
    so the clock adds up the intervals between consecutive readings (in float64) instead of measuring each from the
    first event. ``event`` makes an event with ``record()``, ``synchronize()`` and ``elapsed_time(end)`` in ms
    (torch.cuda.Event(enable_timing=True) on CUDA).
    """

    def __init__(self, event: Callable[[], object]) -> None:
        self._event = event
        self._last = None
        self._seconds = 0.0

    def __call__(self) -> float:
        event = self._event()
        event.record()
        event.synchronize()
        if self._last is not None:
            self._seconds += self._last.elapsed_time(event) / 1e3
        self._last = event
        return self._seconds


class L2Flush:
    """Writes a buffer of l2_flush_bytes(the device's L2 size) on ``device``: called before each path's round."""

    def __init__(self, device: torch.device) -> None:
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        self.buffer = torch.empty(l2_flush_bytes(l2), dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.fill_(1)


def cuda_peak_bytes(fns: dict[str, Callable[[], object]], device: torch.device) -> dict[str, int]:
    """For each callable, the most bytes torch's CUDA allocator held during one call beyond what it held before:
    torch.cuda.max_memory_allocated after reset_peak_memory_stats, less memory_allocated at the start (inputs and
    weights excluded; the output, saved activations, gradients and temporaries included, as on a CPU)."""
    peaks = {}
    for name, fn in fns.items():
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peaks[name] = torch.cuda.max_memory_allocated(device) - before
    return peaks


class Meter:
    """How the bench measures on one device: its timings (:meth:`time`), peak memory (:meth:`peak_bytes`) and the
    memory it gives back between jobs (:meth:`release`)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = check_device(device)
        self.clock: Callable[[], float] | None = None  # None: torch.utils.benchmark's timer, time.perf_counter
        self.flush: Callable[[], None] | None = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # events and the flush buffer live on the current device
            self.clock = EventClock(lambda: torch.cuda.Event(enable_timing=True))
            self.flush = L2Flush(self.device)

    def time(self, fns: dict[str, Callable[[], object]], *, rounds: int, min_run_time: float) -> dict[str, Timing]:
        """time_interleaved on this device's clock, the cache flushed before each path's round."""
        return time_interleaved(fns, rounds=rounds, min_run_time=min_run_time, clock=self.clock, flush=self.flush)

    def peak_bytes(self, fns: dict[str, Callable[[], object]]) -> dict[str, int]:
        if self.device.type == "cuda":
            return cuda_peak_bytes(fns, self.device)
        return peak_memory_bytes(fns)

    def release(self) -> None:
        """Give what the last job freed back: the CPU heap (measure.release_memory), and on CUDA the allocator's
        cached blocks, so that the next job's peak starts from what it holds."""
        release_memory()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def describe(self) -> dict[str, object]:
        """The header's record of the device: its name, and on CUDA the GPU, its compute capability, memory and L2."""
        if self.device.type != "cuda":
            return dict(device=str(self.device))
        props = torch.cuda.get_device_properties(self.device)
        return dict(
            device=str(self.device),
            gpu=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            gpu_memory_bytes=props.total_memory,
            l2_bytes=props.L2_cache_size,
            flush_bytes=self.flush.buffer.numel(),
            cuda=torch.version.cuda,
        )
