"""The benchmark's noise detector on synthetic timings and load averages: no real timing anywhere here.

A measurement is noisy when the other processes' load exceeds the cores the benchmark leaves free by more than
LOAD_MARGIN, or when a row's IQR/median exceeds IQR_THRESHOLD (torch.utils.benchmark's own 0.1).
"""

from __future__ import annotations

import math

import pytest

from vit_einops.bench import noise
from vit_einops.bench.measure import Timing, quartiles
from vit_einops.bench.noise import IQR_THRESHOLD, LOAD_MARGIN, judge, load_verdict, row_fields, spread_verdict, summary
from vit_einops.bench.run import measure_with_retries


def timing(median: float, iqr: float) -> Timing:
    return Timing(median, iqr, 10, median - iqr / 2, median + iqr / 2)


# (load at start, load at end, threads, CPUs, busy?): the benchmark's own threads are in the end's load.
LOAD_CASES = {
    "idle machine, 2 threads on 2 CPUs (end load is ours)": (0.1, 2.05, 2, 2, False),
    "another job at the start": (3.0, 5.0, 2, 2, True),
    "a job that started during the run": (0.2, 4.8, 2, 2, True),
    "1 thread of 2: one busy neighbour fits the free core": (1.3, 2.2, 1, 2, False),
    "1 thread of 2: two neighbours do not": (1.6, 2.9, 1, 2, True),
    "exactly at the margin is still quiet": (LOAD_MARGIN, 2.0, 2, 2, False),
    "no load average on this OS (NaN)": (math.nan, math.nan, 2, 2, False),
}


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_load_verdict(case):
    start, end, threads, cpus, busy = LOAD_CASES[case]
    verdict = load_verdict((start, end), threads, cpus)
    assert verdict.noisy is busy
    assert bool(verdict.reasons) is busy


@pytest.mark.parametrize(
    "load, running_s, busy",
    [
        ((2.3, 2.3), (300.0, 310.0), False),  # 5 min into a 2-thread run: ~2.0 of the 2.3 is ours
        ((3.0, 3.0), (300.0, 310.0), True),  # another job holds a core
        ((2.3, 2.3), (0.0, 10.0), True),  # at the very start the 2.3 cannot be ours
        ((1.2, 1.3), (30.0, 40.0), False),  # half a minute in: ours is 2*(1-e^-0.5) = 0.79
    ],
    ids=["late, all ours", "late, a neighbour", "at the start", "half a minute in"],
)
def test_load_verdict_subtracts_our_own_share_by_running_time(load, running_s, busy):
    assert load_verdict(load, 2, 2, running_s=running_s).noisy is busy


def test_own_load_follows_the_kernels_damping():
    assert noise.own_load(2, 0.0) == 0.0
    assert noise.own_load(2, 60.0) == pytest.approx(2 * (1 - math.exp(-1)))
    assert noise.own_load(2, math.inf) == 2.0


def test_load_reason_names_the_numbers():
    verdict = load_verdict((3.0, 5.0), 2, 2)
    assert verdict.reasons == [
        "load 3.00 -> 5.00 on 2 CPUs: other processes want 3.0 cores while 2 of 2 are in use here"
    ]


@pytest.mark.parametrize(
    "median, iqr, noisy",
    [(1.0, 0.0, False), (1.0, IQR_THRESHOLD, False), (1.0, 0.11, True), (2e-3, 1e-3, True), (0.0, 0.0, True)],
    ids=["no spread", "at the threshold", "just above", "half the median", "zero median"],
)
def test_spread_verdict(median, iqr, noisy):
    verdict = spread_verdict(median, iqr, "core/chunked")
    assert verdict.noisy is noisy
    if noisy and median:
        assert verdict.reasons == [f"core/chunked: IQR/median {iqr / median:.2f} > {IQR_THRESHOLD}"]


def test_judge_combines_load_and_every_timing():
    timings = {"sdpa": timing(1.0, 0.02), "chunked": timing(1.3, 0.5)}
    quiet = judge({"sdpa": timings["sdpa"]}, (0.1, 2.0), threads=2, cpu_count=2)
    assert not quiet.noisy and quiet.reasons == []
    verdict = judge(timings, (3.0, 5.0), threads=2, cpu_count=2)
    assert verdict.noisy
    assert [r.split(":")[0] for r in verdict.reasons] == ["load 3.00 -> 5.00 on 2 CPUs", "chunked"]


def test_row_fields_mark_the_row_and_say_why():
    fields = row_fields(timing(2.0, 0.4), (0.2, 2.1), threads=2, cpu_count=2)
    assert fields["noisy"] is True and fields["noise"] == "IQR/median 0.20 > 0.1"
    assert (fields["p25_s"], fields["p75_s"], fields["iqr_ratio"]) == (1.8, 2.2, pytest.approx(0.2))
    assert (fields["load_start"], fields["load_end"]) == (0.2, 2.1)
    assert row_fields(timing(2.0, 0.1), (0.2, 2.1), threads=2, cpu_count=2)["noisy"] is False


def test_summary_flags_the_run_and_gives_advice():
    rows = [dict(noisy=False, iqr_ratio=0.01), dict(noisy=True, iqr_ratio=0.3), dict(noisy=False, iqr_ratio=0.02)]
    s = summary(rows, (0.1, 2.0), threads=2, cpu_count=2)
    assert s["noisy"] is True and (s["rows_noisy"], s["rows"]) == (1, 3)
    assert s["reasons"] == ["1 of 3 rows are noisy (load or IQR/median > 0.1)"]
    assert "--threads 1" in s["advice"] and "--retries" in s["advice"]
    quiet = summary([rows[0]], (0.1, 2.0), threads=2, cpu_count=2)
    assert quiet == dict(
        noisy=False, reasons=[], rows_noisy=0, rows=1, iqr_threshold=IQR_THRESHOLD, load_margin=LOAD_MARGIN,
        advice=None,
    )  # fmt: skip
    busy = summary([rows[0]], (4.0, 6.0), threads=2, cpu_count=2)
    assert busy["noisy"] is True and busy["rows_noisy"] == 0 and busy["reasons"][0].startswith("load 4.00 -> 6.00")


def attempts_of(sequence):
    """A measure() that returns the given row sets in turn, recording how often it was called."""
    calls = []

    def measure():
        calls.append(1)
        return [dict(r) for r in sequence[len(calls) - 1]]

    return measure, calls


NOISY = [dict(noisy=True, iqr_ratio=0.4), dict(noisy=False, iqr_ratio=0.01)]
LESS_NOISY = [dict(noisy=True, iqr_ratio=0.2), dict(noisy=False, iqr_ratio=0.01)]
QUIET = [dict(noisy=False, iqr_ratio=0.02), dict(noisy=False, iqr_ratio=0.01)]


def test_retries_stop_at_the_first_quiet_attempt():
    measure, calls = attempts_of([NOISY, QUIET, NOISY])
    rows = measure_with_retries(measure, retries=2)
    assert len(calls) == 2 and [r["noisy"] for r in rows] == [False, False] and rows[0]["attempts"] == 2


def test_retries_keep_the_least_noisy_attempt():
    measure, calls = attempts_of([NOISY, LESS_NOISY, NOISY])
    rows = measure_with_retries(measure, retries=2)
    assert len(calls) == 3 and rows[0]["iqr_ratio"] == 0.2 and {r["attempts"] for r in rows} == {3}


def test_no_retries_measures_once():
    measure, calls = attempts_of([NOISY])
    assert measure_with_retries(measure, retries=0)[0]["attempts"] == 1 and len(calls) == 1


def test_quartiles_interpolate_like_numpy():
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert quartiles([1.0, 2.0]) == (1.25, 1.75)
    assert quartiles([3.0]) == (3.0, 3.0)


def test_current_load_without_an_os_load_average(monkeypatch):
    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(noise.os, "getloadavg", unavailable)
    assert math.isnan(noise.current_load())
