"""The benchmark's noise detector on synthetic timings, load averages, /proc/stat text and CPU times: no real
timing anywhere here.

A measurement is noisy when the other processes used more than the cores the benchmark leaves free plus CPU_MARGIN
(CPU time from /proc/stat; where it cannot be read, their load against LOAD_MARGIN), or when a row's IQR/median
exceeds IQR_THRESHOLD (torch.utils.benchmark's own 0.1).
"""

from __future__ import annotations

import io
import math

import pytest

from vit_einops.bench import noise, report
from vit_einops.bench.device import Meter
from vit_einops.bench.measure import Timing, quartiles
from vit_einops.bench.noise import (
    CPU_MARGIN,
    IQR_THRESHOLD,
    LOAD_MARGIN,
    CpuUse,
    LoadProbe,
    busy_cpu_seconds,
    judge,
    load_verdict,
    row_fields,
    spread_verdict,
    summary,
)
from vit_einops.bench.runner import measure_with_retries


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
    # After a run on one thread, --threads 1 would change nothing: not advised; after one that followed the free
    # cores up to two, it is.
    one = summary(rows, (0.1, 2.0), threads=1, cpu_count=2)
    assert "--threads" not in one["advice"] and "--retries" in one["advice"]
    assert "--threads 1" in summary(rows, (0.1, 2.0), threads=1, cpu_count=2, most_threads=2)["advice"]
    quiet = summary([rows[0]], (0.1, 2.0), threads=2, cpu_count=2)
    assert quiet == dict(
        noisy=False, reasons=[], rows_noisy=0, rows=1, iqr_threshold=IQR_THRESHOLD, load_margin=LOAD_MARGIN,
        cpu_margin=CPU_MARGIN, advice=None,
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


# --- CPU time: /proc/stat and our own CPU seconds --------------------------------------------------------------

TICKS = 100  # USER_HZ


def proc_stat(busy_ticks: int, idle_ticks: int = 500_000, guest: int = 0) -> str:
    """/proc/stat as Linux writes it, with ``busy_ticks`` spread over user, nice, system, irq, softirq and steal
    (guest time is part of user already), then per-CPU lines and the counters that follow."""
    user, nice, system, irq, softirq = (busy_ticks * k // 10 for k in (6, 1, 2, 0, 1))
    steal = busy_ticks - user - nice - system - irq - softirq
    return (
        f"cpu  {user} {nice} {system} {idle_ticks} 1234 {irq} {softirq} {steal} {guest} 0\n"
        f"cpu0 {user // 2} {nice // 2} {system // 2} {idle_ticks // 2} 617 0 0 0 0 0\n"
        f"cpu1 {user - user // 2} {nice - nice // 2} {system - system // 2} {idle_ticks // 2} 617 0 0 0 0 0\n"
        "intr 123456 0 0\nctxt 987654\nbtime 1700000000\nprocesses 4242\nprocs_running 1\nprocs_blocked 0\n"
    )


def scripted_probe(stats, own_s, load=(1.0, 1.0), clock=(0.0, 300.0, 310.0), cpus: int = 2) -> LoadProbe:
    """A LoadProbe whose every reading comes from the given sequences: /proc/stat texts (or an exception to
    raise), this process's CPU seconds, load averages and monotonic times (the first is the probe's start)."""

    def reader(values):
        it = iter(values)

        def read():
            value = next(it)
            if isinstance(value, Exception):
                raise value
            return value

        return read

    return LoadProbe(
        read_stat=reader(stats), own_cpu_s=reader(own_s), load=reader(load), clock=reader(clock),
        ticks_per_s=TICKS, cpu_count=cpus,
    )  # fmt: skip


def probed_row(probe: LoadProbe, threads: int, spread: float = 0.01) -> dict:
    start, end = probe.sample(), probe.sample()
    return probe.row_fields(timing(1.0, spread), start, end, threads)


def test_busy_cpu_seconds_reads_the_aggregate_line():
    """user + nice + system + irq + softirq + steal; idle, iowait and the guest fields (inside user) left out."""
    line = "cpu  1289087 6699 81248 727620 10963 0 1986 3948 700 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
    assert busy_cpu_seconds(line, TICKS) == (1289087 + 6699 + 81248 + 1986 + 3948) / TICKS
    assert busy_cpu_seconds("cpu  10 0 5 100\n", TICKS) == 0.15  # a kernel before 2.5.41: four fields
    assert busy_cpu_seconds(proc_stat(2000), TICKS) == 20.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "intr 1 2 3\n",
        "cpu  12 x 3 4 5\n",
        "cpu  1 2 3\n",
        "cpu  1 -2 3 4 5\n",
        "cpu0 1 2 3 4 5\n",
        "cpu  ½ 1 2 3\n",
    ],
    ids=["empty", "no cpu line", "not a number", "too few fields", "negative", "only per-CPU lines", "unicode digit"],
)
def test_busy_cpu_seconds_refuses_malformed_text(text):
    assert busy_cpu_seconds(text, TICKS) is None


# (what happens, threads, this process's CPU seconds over the 10 s window, machine busy ticks, noisy?, reason)
CPU_CASES = {
    "idle machine, load 1.0 beside our 2 threads": (2, 20.0, 2001, False, ""),
    "a neighbour using 1 core while 2 threads run": (
        2, 10.0, 2000, True, "other processes used 1.0 cores while 2 of 2 are in use here (CPU time over 10.0 s)"
    ),
    "1 thread of 2 and one neighbour: it has the free core": (1, 10.0, 2000, False, ""),
    "2 threads of 2 and two neighbours": (
        2, 10.0, 2000, True, "other processes used 1.0 cores while 2 of 2 are in use here (CPU time over 10.0 s)"
    ),
    "1 thread of 2 and two neighbours: three threads share two cores": (
        1, 20 / 3, 2000, True, "other processes used 1.3 cores while 1 of 2 are in use here (CPU time over 10.0 s)"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CPU_CASES))
def test_cpu_time_decides_whatever_the_load_average_says(case):
    """The load average reads 1.0 above our own threads throughout (an idle virtual machine's phantom, which the load
    verdict counts as a neighbour); the CPU time of the window decides, and the row records both."""
    threads, own_s, busy_ticks, noisy, reason = CPU_CASES[case]
    load = threads + 1.0
    probe = scripted_probe([proc_stat(0), proc_stat(busy_ticks)], [0.0, own_s], load=(load, load))
    fields = probed_row(probe, threads)
    assert (fields["noisy"], fields["noise"]) == (noisy, reason)
    assert fields["others_cores"] == round((busy_ticks / TICKS - own_s) / 10.0, 2)
    assert (fields["load_start"], fields["load_end"]) == (load, load)


def test_idle_machine_is_quiet_and_says_so():
    """Load 3.0 five minutes into a 2-thread run: the load verdict sees 1.0 cores of neighbours that the CPU time
    (0.01 s of others' work in 10 s) shows are not there."""
    assert load_verdict((3.0, 3.0), 2, 2, running_s=(300.0, 310.0)).noisy is True
    probe = scripted_probe([proc_stat(0), proc_stat(2001)], [0.0, 20.0], load=(3.0, 3.0))
    assert probed_row(probe, threads=2) == dict(
        p25_s=0.995, p75_s=1.005, iqr_ratio=pytest.approx(0.01), load_start=3.0, load_end=3.0, others_cores=0.0,
        noisy=False, noise="",
    )  # fmt: skip


def test_a_short_window_cannot_cry_wolf():
    """20 ms with 1 thread: 4 ticks of busy time read as 1.0 other cores, but one tick per CPU at each end is
    1.0 core in so short a window, so the verdict cannot tell: quiet (the smoke grid's rows are this short)."""
    probe = scripted_probe([proc_stat(0), proc_stat(4)], [0.0, 0.02], clock=(0.0, 1.0, 1.02))
    fields = probed_row(probe, threads=1, spread=0.0)
    assert (fields["others_cores"], fields["noisy"]) == (1.0, False)
    # The same reading over 10 s is 1.0 core for certain: with 2 threads of 2 the machine is busy.
    probe = scripted_probe([proc_stat(0), proc_stat(2000)], [0.0, 10.0])
    assert probed_row(probe, threads=2)["noisy"] is True


FALLBACK_STATS = {
    "/proc/stat unreadable": [OSError("no /proc"), OSError("no /proc")],
    "malformed aggregate line": ["cpu  12 x 3 4 5\n", "cpu  12 x 3 4 5\n"],
    "readable only at the end": [OSError("no /proc"), proc_stat(2000)],
    "counter went back": [proc_stat(4000), proc_stat(2000)],
}


@pytest.mark.parametrize("case", list(FALLBACK_STATS))
@pytest.mark.parametrize("load, busy", [((0.1, 2.05), False), ((3.0, 5.0), True)], ids=["quiet load", "busy load"])
def test_without_cpu_time_the_load_average_decides_as_before(case, load, busy):
    """No usable /proc/stat: exactly the load verdict (with the running time), and no others_cores."""
    probe = scripted_probe(FALLBACK_STATS[case], [0.0, 20.0], load=load, clock=(0.0, 0.0, 1e9))
    start, end = probe.sample(), probe.sample()
    assert probe.cpu_use(start, end) is None
    fields = probe.row_fields(timing(1.0, 0.01), start, end, threads=2)
    assert fields == row_fields(timing(1.0, 0.01), load, 2, 2, running_s=(0.0, 1e9))
    assert (fields["noisy"], fields["others_cores"]) == (busy, None)
    if busy:
        assert fields["noise"] == (
            "load 3.00 -> 5.00 on 2 CPUs: other processes want 3.0 cores while 2 of 2 are in use here"
        )


def test_judge_and_summary_take_the_cpu_time():
    cpu = CpuUse(wall_s=10.0, busy_s=20.0, own_s=10.0, resolution_s=0.02)
    assert cpu.others_cores == 1.0 and cpu.uncertainty_cores == pytest.approx(0.002)
    verdict = judge({"sdpa": timing(1.0, 0.02)}, (0.1, 2.0), threads=2, cpu_count=2, cpu=cpu)
    assert verdict.reasons == ["other processes used 1.0 cores while 2 of 2 are in use here (CPU time over 10.0 s)"]
    idle = CpuUse(wall_s=10.0, busy_s=20.25, own_s=20.0)
    assert judge({"sdpa": timing(1.0, 0.02)}, (3.0, 3.0), threads=2, cpu_count=2, cpu=idle).noisy is False
    # The run's check: the start and end windows as one (10 s idle + 10 s with a neighbour on one core).
    both = idle + cpu
    assert (both.wall_s, both.busy_s, both.own_s, both.others_cores) == (20.0, 40.25, 30.0, 0.5125)
    s = summary([dict(noisy=False, iqr_ratio=0.01)], (3.0, 3.0), threads=2, cpu_count=2, cpu=both)
    assert s["noisy"] is True and s["reasons"] == [
        "other processes used 0.5 cores while 2 of 2 are in use here (CPU time over 20.0 s)"
    ]
    assert summary([dict(noisy=False, iqr_ratio=0.01)], (3.0, 3.0), 2, 2, cpu=idle)["noisy"] is False


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(wall_s=0.0, busy_s=1.0, own_s=1.0), "wall_s.*got 0.0"),
        (dict(wall_s=math.inf, busy_s=1.0, own_s=1.0), "wall_s.*got inf"),
        (dict(wall_s=1.0, busy_s=math.nan, own_s=1.0), "busy_s.*got nan"),
        (dict(wall_s=1.0, busy_s=1.0, own_s=-1.0), "own_s.*got -1.0"),
    ],
)
def test_cpu_use_refuses_impossible_windows(kwargs, words):
    with pytest.raises(ValueError, match=words):
        CpuUse(**kwargs)


def test_header_shows_the_other_processes_cpu_use():
    meta = dict(
        time_utc="2025-01-01T00:00:00Z", torch="2.13.0", einops="0.8", python="3.11", threads=2, cpu_count=2,
        cpu_capability="AVX2", bf16_hardware=[], cpu_model="AMD EPYC", blas="mkl", load_average=[1.02, 0.9, 0.8],
        dtype="float32", others_cores=0.01, threads_source="--threads",
    )  # fmt: skip
    ceiling = dict(size=1024, gflop_per_s=100.0, median_s=0.02, iqr_s=0.0)
    lines = report.header_text(meta, ceiling).splitlines()
    assert lines[1] == "threads 2 (of 2 CPUs; from --threads)"
    assert lines[4] == "other processes' CPU use (/proc/stat, during the ceiling): 0.01 cores at start"
    meta.update(others_cores_end=1.0)
    assert report.header_text(meta, ceiling).splitlines()[4].endswith("0.01 cores at start, 1.00 at the end")
    meta.update(others_cores=None, others_cores_end=None)
    assert report.header_text(meta, ceiling).splitlines()[4] == (
        "other processes' CPU use: not measured (no /proc/stat); the load average judges the machine"
    )


# --- A noisy run says so before its rows, as soon as it knows, and again at the end -------------------------------


def scripted_run(monkeypatch, tmp_path, others_cores=(0.0, 0.0), noisy_job=None):
    """bench.runner.run of the smoke grid with every measurement faked, no timing: the matmul ceilings at the start and
    the end take 10 s and 1000 s of the probe's clock while other processes use ``others_cores`` (start, end) of its
    2 CPUs (a busy start alone is then too short to make the two windows together busy); each job's rows are
    synthetic, noisy (IQR/median 0.30) for job number ``noisy_job``. Returns the printed text and, for each job, what
    had been printed when it began."""
    from vit_einops.bench import plots
    from vit_einops.bench import runner as bench_run

    start, end = (round(o * s * TICKS) for o, s in zip(others_cores, (10, 1000), strict=True))  # busy ticks
    probe = scripted_probe(
        [proc_stat(0), proc_stat(start), proc_stat(start), proc_stat(start + end)], [0.0] * 4,
        load=[1.0] * 4, clock=(0.0, 0.0, 10.0, 20.0, 1020.0),
    )  # fmt: skip
    stdout, seen = io.StringIO(), []

    def noise_fields():
        noisy = len(seen) - 1 == noisy_job
        return dict(p25_s=1e-3, p75_s=1e-3, iqr_ratio=0.3 if noisy else 0.0, load_start=1.0, load_end=1.0,
                    others_cores=0.0, noisy=noisy, noise="IQR/median 0.30 > 0.1" if noisy else "",
                    time_ratio=1.0, time_ratio_low=1.0, time_ratio_high=1.0, ratio_unresolved=False,
                    rounds=3)  # fmt: skip

    def measure_point(point, mode, dtype, paths, *args):
        seen.append(stdout.getvalue())
        fields = noise_fields()
        return [
            dict(section="core", mode=mode, path=path, kernel="aten::bmm", batch=point.batch, heads=point.heads,
                 tokens=point.tokens, head_dim=point.head_dim, dtype="float32", median_s=1e-3, iqr_s=0.0, blocks=1,
                 gflop=1e-3, gflop_per_s=1.0, peak_bytes=1024, attn_matrix_bytes=1024, first_call_s=None, mem_ratio=1.0,
                 **fields)
            for path in paths["core"]
        ]  # fmt: skip

    def measure_model(preset, batch, *args):
        seen.append(stdout.getvalue())
        fields = noise_fields()
        return [
            dict(model=preset, mode="inference", optimizer=None, path=path, batch=batch, image_size=32,
                 dtype="float32", median_s=1e-3, iqr_s=0.0, blocks=1, images_per_s=batch / 1e-3, gflop=1e-3,
                 gflop_per_s=1.0, peak_bytes=1024, max_abs_diff_vs_einsum=0.0, **fields)
            for path in ("einsum", "torch")
        ]  # fmt: skip

    def ceiling(dtype, size, run_time, device, time):
        return dict(size=size, median_s=1.0, iqr_s=0.0, gflop_per_s=100.0)

    monkeypatch.setattr(bench_run, "measure_point", measure_point)
    monkeypatch.setattr(bench_run, "measure_model", measure_model)
    monkeypatch.setattr(bench_run, "matmul_ceiling", ceiling)
    monkeypatch.setattr(Meter, "release", lambda self: None)  # a full gc.collect per job: seconds in pytest
    monkeypatch.setattr(plots, "figures", lambda *rows: {})  # the figures have tests of their own
    # One thread: the cores free at the start would be this machine's, not the script's.
    options = bench_run.with_overrides("smoke", out=tmp_path / "out", core_paths=("einsum", "sdpa"), threads=1)
    results = bench_run.run(options, stdout=stdout, probe=probe)
    # The smoke grid: the verdict's 2 modes at N 17, then 2 N x 2 modes of attention (at N 17 the layer paths only,
    # which this fake leaves out), one model.
    assert len(seen) == 2 + 4 + 1
    return results, stdout.getvalue(), seen


EARLY = "NOISY RUN (so far): "
FIRST_ROW = "\nattention core, forward (ratios over sdpa)"


def test_a_machine_busy_at_the_start_is_announced_before_the_grid(monkeypatch, tmp_path):
    results, text, seen = scripted_run(monkeypatch, tmp_path, others_cores=(3.0, 0.0))
    threads = results["meta"]["threads"]
    busy = f"other processes used 3.0 cores while {threads} of 2 are in use here (CPU time over 10.0 s)"
    assert report.early_noise_text(["the machine is busy: " + busy]) in seen[0]  # before the first job was measured
    assert text.count(EARLY) == 1 and text.index(EARLY) < text.index(FIRST_ROW)
    # The verdict at the end says so again, although the end was quiet and no row was noisy.
    assert results["noisy"] is True and results["noise"]["reasons"] == ["at the start, " + busy]
    assert text.index("\n" + report.noise_text(results["noise"])) > text.index("\nwhole model")


def test_the_first_noisy_row_is_announced_at_once(monkeypatch, tmp_path):
    results, text, seen = scripted_run(monkeypatch, tmp_path, noisy_job=1)
    assert not any(EARLY in s for s in seen[:2])  # the start and the first job were quiet
    line = EARLY + "attention core forward_backward b 2 h 2 n 17 d 8 einsum: IQR/median 0.30 > 0.1. Rows marked ! "
    assert all(line in s for s in seen[2:])  # printed when the second job's rows came back
    assert text.count(EARLY) == 1 and text.index(EARLY) < text.index(FIRST_ROW)
    assert results["noisy"] is True and results["noise"]["reasons"][-1].startswith("2 of 10 rows are noisy")
    assert text.index("\n" + report.noise_text(results["noise"])) > text.index("\nwhole model")


def test_a_machine_busy_only_at_the_end_still_says_so_before_the_rows(monkeypatch, tmp_path):
    results, text, seen = scripted_run(monkeypatch, tmp_path, others_cores=(0.0, 5.0))
    assert not any(EARLY in s for s in seen)
    assert results["noisy"] is True
    assert text.count(EARLY) == 1 and text.index(EARLY) < text.index(FIRST_ROW)
    assert EARLY + "; ".join(results["noise"]["reasons"]) in text
    assert text.index("\n" + report.noise_text(results["noise"])) > text.index("\nwhole model")


def test_a_quiet_run_never_says_noisy(monkeypatch, tmp_path):
    results, text, seen = scripted_run(monkeypatch, tmp_path)
    assert results["noisy"] is False and "NOISY" not in text and not any("NOISY" in s for s in seen)
