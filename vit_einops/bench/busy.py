"""Busy processes for the benchmark scripts that measure beside other work (benchmarks/contention.py,
benchmarks/command_threads.py): each a Python loop (``while True: pass``) that keeps one core busy, started by the
script for a condition and stopped after it, on SIGTERM and Ctrl-C too (:func:`sigterm_raises`); each also ends by
itself once its script is gone or after its limit, so none outlives a killed run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

# Spins until the limit has passed or its parent is gone (reparented: killed with no chance to stop it), looking
# every 100,000 empty iterations (milliseconds) so that the loop itself stays pure Python.
BUSY_LOOP = """import os, time
parent, end = {parent}, time.monotonic() + {limit}
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(100_000):
        pass
"""
BUSY_LIMIT_S = (1.0, 86_400.0)  # a busy process must outlive a condition (seconds at least), a day at most


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that every ``finally`` on the way out stops the busy loops."""


def _terminate(signum, frame) -> None:
    raise Terminated(signal.Signals(signum).name)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (as Ctrl-C raises
    KeyboardInterrupt), so that the ``finally`` that stops the busy processes runs; the handler before is put back."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_busy(count: int, limit: float) -> list[subprocess.Popen]:
    """``count`` processes that each keep one core busy for ``limit`` seconds at most, and end once this process is
    gone."""
    loop = BUSY_LOOP.format(parent=os.getpid(), limit=limit)
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


def check_busy(processes: list[subprocess.Popen], limit: float, seconds: float) -> None:
    """ValueError if a busy process ended before the condition did: the condition was measured without it."""
    ended = [p for p in processes if p.poll() is not None]
    if ended:
        raise ValueError(
            f"{len(ended)} of {len(processes)} busy processes ended before their condition did (after {seconds:.1f} "
            f"s; --busy-limit {limit:g} s): raise --busy-limit past the time one condition takes"
        )


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()
