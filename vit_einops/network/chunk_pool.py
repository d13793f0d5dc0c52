"""The chunked path's blocks as tasks for a few threads, each running torch's ops on one core, taken in turn.

Why: torch splits each op between its intra-op threads (OpenMP) and ends it at a barrier where every thread waits
for the slowest. On a machine shared with other processes a thread is preempted now and then, and for as long as it
waits for a core the op it is in cannot end: the other threads spin, then sleep, at the barrier. The chunked path
issues three ops per block, dozens to hundreds per call, so it meets such a stall far more often than SDPA's one
fused kernel per call. Here each task (a block of queries: its scores, their softmax, its output rows) runs whole on
one worker, with single-threaded ops, and a worker that finishes a task takes the next one not yet taken (dynamic
scheduling): a preempted worker holds back only the task it is in, while the others take the rest. torch releases
the GIL inside its kernels, so the workers' ops run in parallel; only the Python between two ops takes turns.

Each worker thread's intra-op thread count is 1. torch.set_num_threads, called in a thread, sets that thread's
OpenMP and MKL counts (other threads keep theirs), and also the process-wide count a new thread starts from; the
pool puts that one back from the thread that starts workers as soon as they have set theirs.

One pool serves every caller, whatever its thread count: a call of ``threads`` threads hands its tasks to that many
workers, and the pool starts workers when a call asks for more than it has. It never stops one, so no caller can be
left with jobs that no worker will read, and callers of different thread counts share the same workers rather than
replace them call after call; it holds as many workers as the largest count any call has asked for.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

import torch

START_SECONDS = 60.0  # how long new workers may take to start and set their thread count before the call fails
_WAIT_SECONDS = 0.5  # the caller waits in steps this long, so that Ctrl-C reaches it wherever a lock wait cannot


class _Start:
    """One round of starting workers: open until the thread that starts them has put the process-wide count back.

    A worker sets its own count and joins the pool under ``gate`` only while the round is open: one that runs after
    its round ended (the round timed out or was interrupted) ends at once, so it can change no count after it was
    put back."""

    def __init__(self) -> None:
        self.gate = threading.Lock()
        self.open = True
        self.ready = threading.Semaphore(0)


class _Pool:
    """Daemon threads, each running the jobs of one queue, one after another, with torch's ops on its own thread."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.size = 0  # workers running jobs

    def grow(self, size: int) -> None:
        """Start workers until ``size`` run; a RuntimeError if the system refuses a thread or the workers have not
        started within START_SECONDS. The workers that did start stay in the pool; the process-wide thread count is
        put back whatever happens, a KeyboardInterrupt included."""
        threads = torch.get_num_threads()
        start = _Start()
        started = 0
        try:
            for i in range(self.size, size):
                worker = threading.Thread(target=self._work, args=(start,), name=f"vit-einops-chunked-{i}", daemon=True)
                try:
                    worker.start()
                except RuntimeError as error:
                    raise RuntimeError(
                        f"the chunked attention path could not start worker thread {i + 1} of {size}: {error}"
                    ) from error
                started += 1
        finally:
            try:
                deadline = time.monotonic() + START_SECONDS
                while started and start.ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    started -= 1
            finally:
                with start.gate:
                    start.open = False
                    torch.set_num_threads(threads)  # the process-wide count, which the workers' own setting changed
        if self.size < size:
            raise RuntimeError(
                f"the chunked attention path's worker threads did not start within {START_SECONDS:g} s "
                f"({self.size} of {size} running)"
            )

    def _work(self, start: _Start) -> None:
        with start.gate:
            if not start.open:
                return
            # torch sets a thread's counts from the process-wide one on its first parallel op or count query, and
            # would undo a setting made before that: the query comes first.
            torch.get_num_threads()
            torch.set_num_threads(1)
            self.size += 1
        start.ready.release()
        _ON_WORKER.active = True
        while True:
            self.jobs.get()()


_POOL = _Pool()
_POOL_LOCK = threading.Lock()
_ON_WORKER = threading.local()  # .active on the pool's workers


def _forget_pool() -> None:
    # A forked child has none of its parent's threads: it starts its own workers on first use.
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = _Pool(), threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def workers() -> int:
    """How many worker threads the pool runs, whatever the number of calls: the largest thread count a call has
    asked for (0 before the first), fewer after a failed start until a later call starts the rest."""
    return _POOL.size


def _pool(size: int) -> _Pool:
    """The pool, with at least ``size`` workers."""
    with _POOL_LOCK:
        if _POOL.size < size:
            _POOL.grow(size)
        return _POOL


def run_tasks(task: Callable[[int], None], count: int, threads: int) -> None:
    """``task(i)`` for each i in range(count), on ``threads`` workers that each take the next i when done with one.

    Returns when every task has run. The workers run under the caller's grad and inference modes (both are
    per-thread in torch). The first exception a task raises is raised here, after the tasks already started have
    ended; no task starts after it. An exception raised in the caller while it waits (Ctrl-C's KeyboardInterrupt)
    is raised at once, and no task starts after it either. Called from a task, it runs the tasks in turn on the
    calling worker, which would otherwise wait on workers that may all be waiting likewise.
    """
    if getattr(_ON_WORKER, "active", False):
        for i in range(count):
            task(i)
        return
    pool = _pool(threads)
    indices = iter(range(count))
    take = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Semaphore(0)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def job() -> None:
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                while not errors:
                    with take:
                        i = next(indices, None)
                    if i is None:
                        break
                    task(i)
        except BaseException as error:  # handed to the caller, whatever it is
            errors.append(error)
        finally:
            done.release()

    helpers = min(threads, count)
    for _ in range(helpers):
        pool.jobs.put(job)
    try:
        for _ in range(helpers):
            while not done.acquire(timeout=_WAIT_SECONDS):
                pass
    except BaseException as interrupt:
        errors.append(interrupt)  # the jobs stop taking tasks
        raise
    if errors:
        raise errors[0]
