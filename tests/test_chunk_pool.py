"""chunk_pool.run_tasks, the chunked path's threaded schedule: every task once, on workers that run torch's ops on one
thread each, under the caller's grad and inference modes; a task's exception reaches the caller; torch's thread
count as the caller and new threads see it is left as it was. Nothing waits for ever: a worker thread the system
refuses, one that never starts, or a KeyboardInterrupt while workers start fails that call with a clear error and
leaves the pool working; a signal in the caller's wait is raised there. Each such call runs on a thread joined with
a deadline (``bounded``), so a hang fails the test instead of blocking the suite."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest
import torch

from vit_einops.network import chunk_pool
from vit_einops.network.chunk_pool import run_tasks, workers

WORKER = "vit-einops-chunked-"  # the name every worker thread's name starts with


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_every_task_runs_once_on_single_threaded_workers(two_threads):
    seen: list[tuple[int, int, int]] = []
    run_tasks(lambda i: seen.append((i, threading.get_ident(), torch.get_num_threads())), 50, 2)
    assert sorted(i for i, _, _ in seen) == list(range(50))
    assert {threads for _, _, threads in seen} == {1}  # each worker's ops run on its own thread only
    assert threading.get_ident() not in {ident for _, ident, _ in seen}
    assert torch.get_num_threads() == 2  # the caller's count
    fresh: list[int] = []
    thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert fresh == [2]  # the process-wide count a new thread starts from, which building the workers changes


def test_workers_run_under_the_callers_grad_and_inference_modes(two_threads):
    modes: list[tuple[bool, bool]] = []
    task = lambda i: modes.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))  # noqa: E731
    with torch.inference_mode():
        run_tasks(task, 4, 2)
    with torch.no_grad():
        run_tasks(task, 4, 2)
    run_tasks(task, 4, 2)
    assert modes == [(False, True)] * 4 + [(False, False)] * 4 + [(True, False)] * 4


def test_a_tasks_exception_reaches_the_caller_and_the_pool_still_works(two_threads):
    started: list[int] = []

    def task(i):
        started.append(i)
        if i == 3:
            raise ZeroDivisionError(f"task {i}")

    with pytest.raises(ZeroDivisionError, match="task 3"):
        run_tasks(task, 40, 2)
    assert 3 in started and len(started) < 40  # no task starts once one has failed (at most one per other worker)
    done: list[int] = []
    run_tasks(done.append, 10, 2)
    assert sorted(done) == list(range(10))


def bounded(call, seconds=20.0):
    """``call()`` on a daemon thread joined with a deadline: its result, its exception raised here, or a failure."""
    outcome: list = []

    def run():
        try:
            outcome.append((call(), None))
        except BaseException as error:  # raised again on the test's thread
            outcome.append((None, error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    if thread.is_alive():
        pytest.fail(f"the call did not return within {seconds} s")
    result, error = outcome[0]
    if error is not None:
        raise error
    return result


def worker_threads(expected: int) -> int:
    """The live worker threads once they are ``expected`` (a worker a failed start gave up on ends on its own)."""
    deadline = time.monotonic() + 10
    while (live := sum(t.name.startswith(WORKER) for t in threading.enumerate())) != expected:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return live


def new_thread_count() -> int:
    counts: list[int] = []
    bounded(lambda: counts.append(torch.get_num_threads()))
    return counts[0]


def start_fails(monkeypatch, nth: int, start) -> None:
    """Thread.start runs ``start(thread, real_start)`` instead for the ``nth`` worker thread the pool starts."""
    real_start = threading.Thread.start
    seen: list[threading.Thread] = []

    def patched(thread):
        if thread.name.startswith(WORKER):
            seen.append(thread)
            if len(seen) == nth:
                return start(thread, real_start)
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", patched)


def refuse(thread, real_start):
    raise RuntimeError("can't start new thread")


def interrupt_before(thread, real_start):
    raise KeyboardInterrupt


def interrupt_after(thread, real_start):  # the thread runs; the interrupt lands before start() returns
    real_start(thread)
    raise KeyboardInterrupt


def never_run(thread, real_start):  # start() returns, the thread never runs
    return None


def assert_a_later_call_works(size: int) -> None:
    done: list[int] = []
    bounded(lambda: run_tasks(done.append, 3 * size, size))
    assert sorted(done) == list(range(3 * size))
    assert workers() == size and worker_threads(size) == size  # no thread of the failed start left waiting
    assert new_thread_count() == 2  # the process-wide count, put back after the failed start too


@pytest.mark.parametrize(
    "start, error, message",
    [
        (
            refuse,
            RuntimeError,
            "the chunked attention path could not start worker thread {second} of {size}: can't start new thread",
        ),
        (
            never_run,
            RuntimeError,
            "the chunked attention path's worker threads did not start within 0.5 s ({running} of {size} running)",
        ),
        (interrupt_before, KeyboardInterrupt, ""),
        (interrupt_after, KeyboardInterrupt, ""),
    ],
    ids=["refused", "never runs", "KeyboardInterrupt before it starts", "KeyboardInterrupt after it started"],
)
def test_a_failed_worker_start_fails_that_call_and_a_later_call_works(start, error, message, two_threads, monkeypatch):
    """The second of three new workers fails to start: the call raises a clear error (or the KeyboardInterrupt
    itself), no worker is left waiting, the process-wide thread count is put back, and a later call at the same
    count starts the missing workers and runs every task. (The pool once stopped the old workers first and waited
    for the new ones at a barrier: a failed start left a stopped pool in place, where every later call of that
    count hung, and the started workers waited at the barrier for ever.)"""
    before = workers()
    size = before + 3
    start_fails(monkeypatch, 2, start)
    monkeypatch.setattr(chunk_pool, "START_SECONDS", 0.5)
    with pytest.raises(error) as caught:
        bounded(lambda: run_tasks(lambda i: None, 10, size))
    assert str(caught.value) == message.format(second=before + 2, running=workers(), size=size)
    assert before < workers() < size  # the workers that started stay, to serve the next calls
    monkeypatch.undo()
    assert_a_later_call_works(size)


def test_a_signal_in_the_callers_wait_is_raised_there_and_no_task_starts_after_it(two_threads):
    """Ctrl-C while the caller waits for its tasks: the signal handler's exception reaches the caller at once (the
    main thread, where Python runs signal handlers), and the tasks not yet started never start."""

    class Interrupt(Exception):
        pass

    def handler(signum, frame):
        raise Interrupt

    started: list[int] = []
    both_running, release = threading.Barrier(3), threading.Event()

    def task(i):
        started.append(i)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_running.wait(timeout=10)
        release.wait(timeout=10)

    def interrupt():  # sends the signal whatever happens, so that the test's own thread cannot wait for ever
        try:
            both_running.wait(timeout=10)
        finally:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(Interrupt):
            run_tasks(task, 20, 2)
    finally:
        release.set()
        signal.signal(signal.SIGUSR1, previous)
    bounded(lambda: run_tasks(lambda i: None, 4, 2))
    assert sorted(started) == [0, 1]


def test_run_tasks_called_from_a_task_runs_in_turn_on_that_worker(two_threads):
    """Every worker inside a task that hands out tasks of its own would otherwise wait on workers that all wait."""
    seen: list[tuple[int, int]] = []

    def outer(i):
        run_tasks(lambda j: seen.append((threading.get_ident(), i)), 3, 2)
        seen.append((threading.get_ident(), i))

    count = 2 * workers() + 2
    bounded(lambda: run_tasks(outer, count, 2))
    by_task: dict[int, set[int]] = {}
    for ident, i in seen:
        by_task.setdefault(i, set()).add(ident)
    assert len(seen) == 4 * count and sorted(by_task) == list(range(count))
    assert all(len(idents) == 1 for idents in by_task.values())
