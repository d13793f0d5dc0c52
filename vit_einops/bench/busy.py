"""Busy processes for the benchmark scripts that measure beside other work (benchmarks/contention.py,
benchmarks/command_threads.py): each a Python loop (``while True: pass``) that keeps one core busy, started by the
script for a condition and stopped after it, on SIGTERM and Ctrl-C too (:func:`guarded`); each also ends by itself
once its script is gone or after its limit, so none outlives a killed run."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from ..base.io import check_file_output, output_lock

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


def add_out_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The scripts' --out (a JSON file of ``what``) and --force (replace it), which :func:`guarded` checks."""
    parser.add_argument("--out", type=Path, default=None, help=f"JSON file for {what}")
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")


@contextlib.contextmanager
def guarded(out: Path | None, force: bool) -> Iterator[None]:
    """A script's run: within the block SIGTERM raises :class:`Terminated` in the main thread (as Ctrl-C raises
    KeyboardInterrupt), so that the ``finally`` that stops the busy processes runs (the handler before is put back);
    and the ``out`` file, when given, is locked for the whole run and checked before anything is measured (a missing
    folder, a FIFO or an existing file without ``force`` is refused at once, not after the run)."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with output_lock(out) if out else contextlib.nullcontext():
            if out:
                check_file_output(out, force, "pass --force to replace it")
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
