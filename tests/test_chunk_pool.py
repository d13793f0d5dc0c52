"""chunk_pool.run_tasks, the chunked path's threaded schedule: every task once, on workers that run torch's ops on one
thread each, under the caller's grad and inference modes; a task's exception reaches the caller; torch's thread
count as the caller and new threads see it is left as it was."""

from __future__ import annotations

import threading

import pytest
import torch

from vit_einops.network.chunk_pool import run_tasks


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
