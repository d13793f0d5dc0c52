"""Paired ratios on synthetic per-round times (no timing here): the median of per-round ratios, its bootstrap
interval, the unresolved mark, and how the table and the ratio plot show them."""

from __future__ import annotations

import random
import statistics

import numpy
import pytest

from vit_einops.base.bootstrap import percentile
from vit_einops.bench.paired import PairedRatio, paired_ratio, paired_ratios, ratio_fields


def rounds_with_slowdown(seed: int, n: int, ratio: float, noise: float):
    """n rounds of a reference and a path ``ratio`` times slower, each time with its own lognormal noise of sigma
    ``noise``, and every other round slowed 3x for both (another process ran then)."""
    rng = random.Random(seed)
    ref, path = [], []
    for i in range(n):
        slow = 3.0 if i % 2 else 1.0
        ref.append(1e-3 * slow * rng.lognormvariate(0, noise))
        path.append(ratio * 1e-3 * slow * rng.lognormvariate(0, noise))
    return path, ref


def test_a_slowdown_of_both_paths_leaves_the_ratio_unchanged():
    """Both times x3 in half the rounds: the median of per-round ratios is exactly what it was (the times are
    multiples of 2^-10, so x3 rounds nothing and each division is the same), the ratio of medians is not."""
    ref = [k / 1024 for k in (40, 44, 41, 43, 42, 45)]
    path = [k / 1024 for k in (61, 62, 66, 60, 64, 63)]
    slowed_ref = [t * 3 if i % 2 else t for i, t in enumerate(ref)]
    slowed_path = [t * 3 if i % 2 else t for i, t in enumerate(path)]
    quiet, busy = paired_ratio(path, ref), paired_ratio(slowed_path, slowed_ref)
    assert busy.ratio == quiet.ratio == statistics.median(p / r for p, r in zip(path, ref, strict=True))
    assert statistics.median(path) / statistics.median(ref) == pytest.approx(quiet.ratio, rel=0.02)
    of_medians = statistics.median(slowed_path) / statistics.median(slowed_ref)
    # Each median mixes quiet and slowed rounds, each path's its own: the ratio moves 1.9% here.
    assert abs(of_medians - quiet.ratio) > 0.015 * quiet.ratio


def test_the_interval_is_deterministic_given_the_seed_and_holds_the_true_ratio():
    path, ref = rounds_with_slowdown(seed=1, n=25, ratio=1.5, noise=0.05)
    first = paired_ratio(path, ref, seed=7)
    assert first == paired_ratio(path, ref, seed=7)
    assert first.low < 1.5 < first.high and first.low < first.ratio < first.high and first.rounds == 25
    assert not first.unresolved
    # Over many synthetic runs, the 95% interval holds the true ratio about 95% of the time (the percentile
    # bootstrap of a median of 25 rounds: 0.9 or more here).
    covered = 0
    for seed in range(100):
        p, r = rounds_with_slowdown(seed=seed, n=25, ratio=1.5, noise=0.05)
        paired = paired_ratio(p, r, resamples=500, seed=seed)
        covered += paired.low <= 1.5 <= paired.high
    assert covered >= 90


def test_the_interval_matches_an_independent_numpy_bootstrap():
    """numpy's generator and percentile, 20,000 resamples: the same interval to within the gap between two
    neighbouring per-round ratios (the medians of resamples take only those values)."""
    path, ref = rounds_with_slowdown(seed=3, n=15, ratio=0.8, noise=0.08)
    ratios = numpy.array(path) / numpy.array(ref)
    rng = numpy.random.default_rng(0)
    medians = numpy.median(rng.choice(ratios, size=(20_000, len(ratios)), replace=True), axis=1)
    low, high = numpy.percentile(medians, [2.5, 97.5])
    gap = numpy.diff(numpy.sort(ratios)).max()
    ours = paired_ratio(path, ref)
    assert ours.ratio == pytest.approx(numpy.median(ratios), rel=1e-12)
    assert abs(ours.low - low) <= gap and abs(ours.high - high) <= gap


def test_percentile_is_numpys_linear_percentile():
    values = sorted(random.Random(0).random() for _ in range(37))
    for q in (0.0, 0.025, 0.5, 0.975, 1.0):
        assert percentile(values, q) == pytest.approx(numpy.percentile(values, 100 * q), rel=1e-12)


def test_an_interval_that_straddles_one_is_unresolved():
    path, ref = rounds_with_slowdown(seed=2, n=9, ratio=1.02, noise=0.2)
    straddling = paired_ratio(path, ref)
    assert straddling.low < 1.0 < straddling.high and straddling.unresolved
    assert ratio_fields(straddling)["ratio_unresolved"] is True
    clear = paired_ratio(*rounds_with_slowdown(seed=2, n=9, ratio=2.0, noise=0.02))
    assert clear.low > 1.0 and not clear.unresolved
    single = paired_ratio([2.0], [1.0])  # one round: no interval, so nothing is resolved
    assert (single.ratio, single.low, single.high, single.unresolved) == (2.0, None, None, True)


def test_paired_ratios_make_the_reference_the_unit():
    path, ref = rounds_with_slowdown(seed=4, n=5, ratio=1.3, noise=0.01)
    out = paired_ratios({"sdpa": ref, "einsum": path}, "sdpa")
    assert out["sdpa"] == PairedRatio(1.0, 1.0, 1.0, 5, is_reference=True) and not out["sdpa"].unresolved
    assert out["einsum"] == paired_ratio(path, ref)
    assert ratio_fields(None) == dict.fromkeys(("time_ratio", "time_ratio_low", "time_ratio_high", "ratio_unresolved"))


@pytest.mark.parametrize(
    "times, reference, message",
    [
        ([], [], "times has no rounds"),
        ([1.0, 2.0], [1.0], "times has 2 rounds and reference 1"),
        ([1.0, 0.0], [1.0, 1.0], "times has 0.0 among its round times"),
        ([1.0], [float("nan")], "reference has nan among its round times"),
    ],
)
def test_bad_rounds_are_refused_by_name(times, reference, message):
    with pytest.raises(ValueError, match=message):
        paired_ratio(times, reference)


def ratio_rows() -> list[dict]:
    """Core rows at one point: sdpa (the unit), einsum resolved at 1.50x and chunked unresolved at 1.04x."""
    from test_bench_plots import attention_rows, with_ratios

    rows = with_ratios(attention_rows((50,), noisy_path=None), unresolved=("chunked",))
    intervals = {"einsum": (1.5, 1.43, 1.57), "chunked": (1.04, 0.97, 1.12), "sdpa": (1.0, 1.0, 1.0)}
    for r in rows:
        ratio, low, high = intervals[r["path"]]
        r.update(
            time_ratio=ratio, time_ratio_low=low, time_ratio_high=high, noise="", ceiling_fraction=0.5, gflop_per_s=1.0
        )
    return rows


def test_the_table_marks_an_unresolved_ratio_and_explains_the_mark():
    from vit_einops.bench import report

    rows = ratio_rows()
    lines = {r["path"]: line for r, line in zip(rows[:3], report.attention_table(rows).splitlines()[3:6], strict=True)}
    assert "1.04? [0.97, 1.12]" in lines["chunked"]
    assert "1.50 [1.43, 1.57]" in lines["einsum"] and "1.50?" not in lines["einsum"]
    assert "1.00 [1.00, 1.00]" in lines["sdpa"]
    note = report.unresolved_note(rows)
    assert note.startswith("\n? after a time ratio (2 rows): unresolved.")  # chunked in both modes
    assert report.unresolved_note([r for r in rows if r["path"] != "chunked"]) is None


def test_the_ratio_plot_draws_no_number_for_an_unresolved_ratio():
    from vit_einops.bench import plots

    rows = ratio_rows()
    fig = plots.figures(rows, [])["attention_ratio.png"]
    for ax in fig.axes:
        texts = [t.get_text() for t in ax.texts]
        assert texts == ["1.50x"]  # einsum's; none for chunked (unresolved) or sdpa (the unit)
        hollow = [line for line in ax.lines if line.get_marker() == "o" and line.get_markerfacecolor() == "white"]
        assert [tuple(line.get_ydata()) for line in hollow] == [(1.04,)]


def test_the_thread_count_follows_the_cores_free_at_the_start(monkeypatch):
    """free_cores on a scripted /proc/stat: 2 CPUs, others busy 1.0 or 0.02 cores over the window -> 1 or 2 threads
    (at most this process's CPUs, at least 1, however busy the machine)."""
    from test_bench_noise import TICKS, proc_stat, scripted_probe

    from vit_einops.base import threads as env

    monkeypatch.setattr(env, "available_cpus", lambda: 2)
    cases = {1.0: 1, 0.02: 2, 5.0: 1}
    for others, threads in cases.items():
        probe = scripted_probe([proc_stat(0), proc_stat(round(others * 10 * TICKS))], [0.0, 0.0], load=[9.0] * 2,
                               clock=(0.0, 0.0, 10.0))  # fmt: skip
        count, how = env.free_cores(probe, window_s=10.0, sleep=lambda s: None)
        assert count == threads and f"other processes used {others:.2f} cores over 10 s" in how
    # Without /proc/stat the load average stands for the other processes.
    for load, threads in ((0.3, 2), (1.2, 1), (9.0, 1)):
        probe = scripted_probe([OSError("no /proc"), OSError("no /proc")], [0.0, 0.0], load=[load] * 2,
                               clock=(0.0, 0.0, 10.0))  # fmt: skip
        expected = (threads, f"load average {load:.2f} at the start")
        assert env.free_cores(probe, window_s=10.0, sleep=lambda s: None) == expected
