"""The bench's answer first: the verdict paragraph on fake rows (its arithmetic), where einsum's A outgrows the
memory budget, and the order a run measures in (the verdict's rows first, the compiled paths last). No timing."""

from __future__ import annotations

import pytest

from vit_einops.base.budget import max_memory
from vit_einops.bench import report
from vit_einops.bench.attention import Point, grid
from vit_einops.bench.budget import einsum_memory_tokens, point_bytes
from vit_einops.bench.runner import _compile_text, plan_jobs, with_overrides

MIB = 2**20


def row(path: str, mode: str, gflop_per_s: float, ratio: float, low: float | None, high: float | None, **extra) -> dict:
    return dict(
        section="core", mode=mode, path=path, batch=1, heads=12, tokens=1025, head_dim=64, gflop_per_s=gflop_per_s,
        attn_matrix_bytes=48 * MIB, time_ratio=ratio, time_ratio_low=low, time_ratio_high=high,
        ratio_unresolved=low is not None and low <= 1.0 <= high, noisy=False, **extra,
    )  # fmt: skip


ROWS = [
    row("einsum", "forward", 20.0, 2.5, 2.25, 2.75),
    row("chunked", "forward", 40.0, 1.25, 1.2, 1.3),
    row("sdpa", "forward", 50.0, 1.0, 1.0, 1.0),
    row("einsum", "forward_backward", 15.0, 2.0, 1.9, 2.1),
    row("chunked", "forward_backward", 30.0, 1.0, 0.9, 1.1),  # unresolved: its interval holds 1.0
    row("sdpa", "forward_backward", 30.0, 1.0, 1.0, 1.0),
]


def test_the_verdict_gives_each_ratio_its_interval_and_share_of_the_ceiling():
    text = report.verdict_text(ROWS, 100.0, {"forward": 26_256, "forward_backward": 18_567}, "the 20.0 GiB limit")
    assert text.splitlines()[0].startswith("Verdict: at N 1025 (batch 1, 12 heads of 64), against SDPA's time: ")
    assert max(map(len, text.splitlines())) <= report.TABLE_WIDTH
    flat = " ".join(text.split())
    assert (
        "einsum takes 2.50x [2.25, 2.75] forward and 2.00x [1.90, 2.10] forward+backward; "
        "chunked takes 1.25x [1.20, 1.30] forward and 1.00x? [0.90, 1.10] forward+backward." in flat
    )
    # GFLOP/s over the 100 GFLOP/s ceiling
    assert (
        "Share of the matmul ceiling (100.0 GFLOP/s): forward sdpa 50%, einsum 20%, chunked 40%; "
        "forward+backward sdpa 30%, einsum 15%, chunked 30%." in flat
    )
    assert (
        "einsum's attention matrix A (48.0 MiB here) outgrows the 20.0 GiB limit at this batch and heads: "
        "forward from N 26,256, forward+backward from N 18,567." in flat
    )
    assert flat.endswith("?: the interval reaches 1.0, the rounds cannot tell the paths apart.")


def test_the_verdict_marks_noisy_rows_and_says_when_there_is_nothing_to_compare():
    noisy = [dict(r, noisy=r["path"] == "einsum") for r in ROWS if r["mode"] == "forward"]
    flat = " ".join(report.verdict_text(noisy, 100.0, {"forward": None}, "the limit").split())
    assert "einsum takes 2.50x [2.25, 2.75] (noisy) forward;" in flat and "forward not below N 2^24" in flat
    only_sdpa = [r for r in ROWS if r["path"] == "sdpa"]
    assert report.verdict_text(only_sdpa, 100.0, {}, "the limit").startswith("Verdict: none: ")


def test_einsum_runs_out_of_memory_where_the_budget_says():
    """The smallest N whose einsum point is over the limit: the N before it fits."""
    for mode in ("forward", "forward_backward"):
        with max_memory("1GiB"):
            n = einsum_memory_tokens(1, 12, 64, mode, 4)
        assert point_bytes(1, 12, n, 64, mode, False, 4) > 2**30 >= point_bytes(1, 12, n - 1, 64, mode, False, 4)
    with max_memory("1TiB"):
        assert einsum_memory_tokens(1, 1, 1, "forward", 4, most=1000) is None


def test_the_verdict_is_measured_first_and_the_compiled_paths_last():
    options = with_overrides("default")
    points = grid(options.batches, options.heads, options.tokens, options.head_dims)
    verdict, rest = plan_jobs(options, points)
    largest = Point(1, 12, 1025, 64)
    assert [(j.what, j.mode, j.paths) for j in verdict] == [
        (largest, mode, {"core": ("einsum", "chunked", "sdpa")}) for mode in options.modes
    ]
    kinds = ["compiled" if "einsum_compiled" in j.paths.get("core", ()) else j.kind for j in rest]
    assert kinds == sorted(kinds, key=["attention", "model", "compiled"].index)  # the models, then compiling
    assert kinds.count("compiled") == len(points) * len(options.modes)
    # At the verdict's point the other core paths are measured beside sdpa again (their ratios are over it in the
    # same rounds), and that second sdpa row is dropped: every (point, mode, path) has one row.
    again = [j for j in rest if j.what == largest and j.kind == "attention" and "einsum" not in j.paths["core"]]
    assert all(j.paths["core"][0] == "sdpa" and j.drop == (("core", "sdpa"),) for j in again)
    compiled = [j for j in rest if "einsum_compiled" in j.paths.get("core", ())]
    assert all(j.paths["core"] == ("sdpa", "einsum_compiled", "flex_compiled") for j in compiled)


@pytest.mark.parametrize("paths", [("sdpa",), ("einsum", "chunked"), ("sdpa_math", "sdpa")])
def test_no_verdict_jobs_without_a_path_to_compare_with_sdpa(paths):
    options = with_overrides("smoke", core_paths=paths)
    verdict, _ = plan_jobs(options, grid(options.batches, options.heads, options.tokens, options.head_dims))
    assert verdict == []


def test_the_compile_lines_fit_the_tables_width_at_any_count():
    """The compiled paths' header wraps at the tables' 120 columns (a full run's took 140), each path a row."""
    calls = [{"path": "einsum_compiled"}] * 8 + [{"path": "flex_compiled"}] * 4
    info = dict(attempted=True, skip_reason=None, first_calls=calls, total_first_call_s=1234.5,
                first_call_s_by_path={"einsum_compiled": 1000.0, "flex_compiled": 234.5})
    lines = _compile_text(info).splitlines()
    assert max(map(len, lines)) <= report.TABLE_WIDTH
    assert " ".join(lines[:-2]).endswith("took 1234.5 s in all")
    assert lines[-2:] == [
        "  einsum_compiled   1000.0 s over 8 first calls",
        "  flex_compiled      234.5 s over 4 first calls",
    ]
