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
pool puts that one back from the thread that built it as soon as its workers have set theirs.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

import torch


class _Pool:
    """``size`` daemon threads, each running the jobs of one queue, one after another, until it hands them None."""

    def __init__(self, size: int):
        self.size = size
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threads = torch.get_num_threads()
        ready = threading.Barrier(size + 1)
        for i in range(size):
            threading.Thread(target=self._work, args=(ready,), name=f"vit-einops-chunked-{i}", daemon=True).start()
        ready.wait()
        torch.set_num_threads(threads)  # the process-wide count, which the workers' own setting changed

    def _work(self, ready: threading.Barrier) -> None:
        # torch sets a thread's counts from the process-wide one on its first parallel op or count query, and would
        # undo a setting made before that: the query comes first.
        torch.get_num_threads()
        torch.set_num_threads(1)
        ready.wait()
        while (job := self.jobs.get()) is not None:
            job()

    def close(self) -> None:
        for _ in range(self.size):
            self.jobs.put(None)


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    # A forked child has none of its parent's threads: it builds its own pool on first use.
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _pool(size: int) -> _Pool:
    """The pool of ``size`` workers, built on first use, rebuilt when torch's thread count has changed."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.size != size:
            if _POOL is not None:
                _POOL.close()  # its workers end after the jobs already queued, another caller's included
            _POOL = _Pool(size)
        return _POOL


def run_tasks(task: Callable[[int], None], count: int, threads: int) -> None:
    """``task(i)`` for each i in range(count), on ``threads`` workers that each take the next i when done with one.

    Returns when every task has run. The workers run under the caller's grad and inference modes (both are
    per-thread in torch). The first exception a task raises is raised here, after the tasks already started have
    ended; no task starts after it.
    """
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
    for _ in range(helpers):
        done.acquire()
    if errors:
        raise errors[0]
