"""The bench's figures and the %ceil column on synthetic rows: no timing anywhere here.

The figures must read right for one N as for many: no overlapping panels, an x axis that spans the measured N, log
axes labelled with plain numbers (never 10^k or 1.14x10^1), and throughput bars from zero on a linear axis, each
labelled with its value. A share of the matmul ceiling above 100% is flagged, never printed as a number.
"""

from __future__ import annotations

import itertools
import re
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vit_einops.bench import plots, report
from vit_einops.bench.attention import REFERENCE

PATHS = ("einsum", "chunked", "sdpa")
MODES = ("forward", "forward_backward")
PLAIN = re.compile(r"^\d+(\.\d+)?$")  # 20, 0.5, 1000: no exponent, no mathtext


def attention_rows(tokens, batches=(1,), noisy_path="chunked") -> list[dict]:
    """Core rows as the grid measures them: time growing with N, the paths apart by factors, quartiles 2% around
    the median, the noisy path marked."""
    rows = []
    for b, mode, n, path in itertools.product(batches, MODES, tokens, PATHS):
        t = 1e-5 * b * n * (1 + PATHS.index(path)) * (3 if mode == "forward_backward" else 1)
        rows.append(
            dict(section="core", mode=mode, path=path, kernel="aten::bmm", batch=b, heads=2, tokens=n, head_dim=8,
                 median_s=t,
                 p25_s=0.98 * t, p75_s=1.02 * t, iqr_s=0.04 * t, peak_bytes=1000 * b * n * (1 + PATHS.index(path)),
                 attn_matrix_bytes=4 * b * 2 * n * n, noisy=path == noisy_path)
        )  # fmt: skip
    return with_ratios(rows)


def with_ratios(rows: list[dict], unresolved=()) -> list[dict]:
    """The ratio columns measure_point adds: time and memory over SDPA at the same point and mode, the time's
    interval 5% either side; the paths in ``unresolved`` are marked so."""
    ref = {(r["batch"], r["mode"], r["tokens"]): r for r in rows if r["path"] == REFERENCE["core"]}
    for r in rows:
        base = ref[r["batch"], r["mode"], r["tokens"]]
        ratio = r["median_s"] / base["median_s"]
        r.update(time_ratio=ratio, time_ratio_low=ratio / 1.05, time_ratio_high=ratio * 1.05,
                 ratio_unresolved=r["path"] in unresolved, mem_ratio=r["peak_bytes"] / base["peak_bytes"])  # fmt: skip
    return rows


def model_rows(models=("vit_ti_16", "vit_b_16")) -> list[dict]:
    """Two presets a tenfold apart, four paths within 10% of each other (the case a log axis exaggerates)."""
    rows = []
    for scale, model in zip((1.0, 10.0), models, strict=False):
        for mode, path in itertools.product(("inference", "train_step"), ("einsum", "chunked", "sdpa", "torch")):
            t = 0.01 * scale * (1 + 0.03 * ("einsum", "chunked", "sdpa", "torch").index(path))
            rows.append(dict(model=model, mode=mode, path=path, batch=2, median_s=t, p25_s=0.97 * t, p75_s=1.04 * t,
                             images_per_s=2 / t, noisy=path == "chunked"))  # fmt: skip
    return rows


def drawn(fig):
    """Lay the figure out and draw it (Agg, in memory): tick labels and bounding boxes are final only then."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return renderer


def assert_no_overlap(fig) -> None:
    """No two panels' boxes (the axes with their titles and tick labels) overlap, and everything drawn (the
    figure's titles and labels too) lies inside the figure."""
    renderer = drawn(fig)
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
    overlapping = [(i, j) for i, j in itertools.combinations(range(len(boxes)), 2) if boxes[i].overlaps(boxes[j])]
    assert overlapping == []
    drawn_box, page = fig.get_tightbbox(renderer), fig.bbox_inches  # both in inches
    assert page.x0 - 0.01 <= drawn_box.x0 and drawn_box.x1 <= page.x1 + 0.01, (drawn_box, page)
    assert page.y0 - 0.01 <= drawn_box.y0 and drawn_box.y1 <= page.y1 + 0.01, (drawn_box, page)


def visible_labels(axis, low: float, high: float) -> list[tuple[float, str]]:
    """(value, text) of every labelled tick of ``axis`` (major and minor) within [low, high]."""
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return [
        (t.get_loc(), t.label1.get_text())
        for t in ticks
        if t.label1.get_visible() and t.label1.get_text() and low * (1 - 1e-9) <= t.get_loc() <= high * (1 + 1e-9)
    ]


# (tokens, batches): one N on a grid of panels (where the axes broke), the smoke grid's two N, the default four.
N_CASES = {
    "one N, two batches": ((50,), (1, 8)),
    "two N (smoke)": ((9, 17), (2,)),
    "the default N": ((50, 197, 577, 1025), (1,)),
}


@pytest.mark.parametrize("case", list(N_CASES))
def test_attention_figures_read_right_for_one_n_and_many(case):
    tokens, batches = N_CASES[case]
    rows = attention_rows(tokens, batches)
    figs = plots.figures(rows, [])
    assert list(figs) == ["attention_time.png", "attention_memory.png", "attention_ratio.png"]
    for name, fig in figs.items():
        assert len(fig.axes) == len(batches) * len(MODES), name
        assert_no_overlap(fig)
        for ax in fig.axes:
            assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
            # The x axis spans the measured N with room either side: one N no longer collapses it to a point.
            left, right = ax.get_xlim()
            assert left < min(tokens) and right > max(tokens) and right / left >= 1.5
            assert list(ax.get_xticks()) == list(tokens) and ax.xaxis.get_minor_locator()() == []
            assert ax.xaxis.get_major_formatter().format_ticks(tokens) == [str(n) for n in tokens]
            # Plain numbers on the log y axis, one at each end, none in 10^k or a.bc x 10^k notation.
            low, high = ax.get_ylim()
            labels = visible_labels(ax.yaxis, low, high)
            assert len(labels) >= 2 and all(PLAIN.match(text) for _, text in labels), labels
            assert all(float(text) == pytest.approx(value) for value, text in labels)
            assert (labels[0][0], labels[-1][0]) == pytest.approx((low, high))
            # Every point inside the frame, none on it.
            for line in ax.lines:
                ys = [y for y in line.get_ydata() if y is not None]
                assert all(low < y < high for y in ys), (name, line.get_label(), ys, (low, high))


def test_the_ratio_figure_always_shows_the_reference_line():
    """Every other path 20x to 60x slower than SDPA at one N: the y axis still reaches down to 1 (SDPA's own line)."""
    rows = [dict(r, median_s=r["median_s"] * 20, p25_s=r["p25_s"] * 20, p75_s=r["p75_s"] * 20)
            if r["path"] != "sdpa" else r for r in attention_rows((50,))]  # fmt: skip
    fig = plots.figures(with_ratios(rows), [])["attention_ratio.png"]
    for ax in fig.axes:
        low, high = ax.get_ylim()
        assert low < 1.0 < high


@pytest.mark.parametrize("models", [("vit_ti_16",), ("vit_ti_16", "vit_b_16")], ids=["one model", "two models"])
def test_throughput_bars_start_at_zero_on_a_linear_axis_with_their_values(models):
    rows = model_rows(models)
    fig = plots.figures([], rows)["model_images_per_s.png"]
    assert len(fig.axes) == 2 * len(models)  # a panel per (mode, model)
    assert_no_overlap(fig)
    panels = [(mode, model) for mode in ("inference", "train_step") for model in models]
    for ax, (mode, model) in zip(fig.axes, panels, strict=True):
        assert ax.get_title() == f"{model}, {mode}"
        assert ax.get_yscale() == "linear"
        low, high = ax.get_ylim()
        panel = [r for r in rows if (r["mode"], r["model"]) == (mode, model)]
        assert low == 0 and high > max(r["batch"] / r["p25_s"] for r in panel)  # room above the error bars
        assert [bar.get_height() for bar in ax.patches] == pytest.approx([r["images_per_s"] for r in panel])
        assert [t.get_text() for t in ax.texts] == [plots.images_per_s_label(r["images_per_s"]) for r in panel]
        assert [bar.get_hatch() for bar in ax.patches] == ["//" if r["noisy"] else None for r in panel]
        assert [t.get_text() for t in ax.get_xticklabels()] == [r["path"] for r in panel]


@pytest.mark.parametrize(
    "value, label", [(1234.4, "1234"), (100.0, "100"), (97.25, "97.2"), (9.171, "9.17"), (0.5, "0.5")]
)
def test_bar_labels_keep_three_digits_or_whole_numbers(value, label):
    assert plots.images_per_s_label(value) == label


@given(
    st.floats(1e-6, 1e6),
    st.floats(1.0, 1e4),
)
def test_log_steps_are_plain_and_cover_the_range(low, factor):
    high = low * factor
    ticks = plots.log_steps(low, high)
    assert ticks[0] <= low and ticks[-1] >= high and len(ticks) >= 2 and ticks == sorted(set(ticks))
    for tick in ticks:
        label = plots.plain_number(tick)
        assert PLAIN.match(label) and float(label) == pytest.approx(tick)
        assert float(f"{tick:e}".split("e")[0]) in (1.0, 2.0, 5.0)  # 1-2-5 steps


def test_log_steps_for_values_on_one_step():
    """All values equal (one N, one row): the axis reaches to the steps either side."""
    assert plots.log_steps(1.0, 1.0) == [0.5, 1.0, 2.0]
    assert plots.log_steps(11.4, 12.0) == [10.0, 20.0]
    assert plots.log_steps(0.001, 1000.0) == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]  # 6 decades: powers of 10


# --- %ceil: a share of the matmul ceiling over 100% is flagged ---------------------------------------------------

CEILING = dict(size=2048, median_s=0.2, iqr_s=0.001, gflop_per_s=85.9, start_gflop_per_s=85.9, end_gflop_per_s=71.0)


@pytest.mark.parametrize(
    "fraction, text", [(None, "-"), (0.5, "50%"), (1.0, "100%"), (1.001, ">100% (!)"), (1.29, ">100% (!)")]
)
def test_ceiling_share_flags_over_100_percent(fraction, text):
    assert report.ceiling_share(fraction) == text


def test_tables_flag_a_share_over_the_ceiling_and_explain_it():
    rows = attention_rows((50,))[:3]
    for r, fraction in zip(rows, (0.42, 1.25, 1.29), strict=True):
        r.update(gflop_per_s=fraction * CEILING["gflop_per_s"], ceiling_fraction=fraction, noise="")
    lines = report.attention_table(rows).splitlines()[3:]
    assert ["42%" in lines[0], ">100% (!)" in lines[1], ">100% (!)" in lines[2]] == [True, True, True]
    assert not any(share in line for line in lines for share in ("125%", "129%"))
    models = [dict(r, gflop_per_s=1.0, ceiling_fraction=f, optimizer=None, max_abs_diff_vs_einsum=0.0, noise="",
                   peak_bytes=2**20, time_ratio=1.0, time_ratio_low=0.9, time_ratio_high=1.1, ratio_unresolved=True,
                   iqr_s=0.0) for r, f in zip(model_rows()[:2], (1.27, 0.3), strict=True)]  # fmt: skip
    model_lines = report.model_table(models).splitlines()[3:]
    assert ">100% (!)" in model_lines[0] and "127%" not in model_lines[0] and " 30%" in model_lines[1]
    note = report.ceiling_note(rows + models, CEILING, "float32")
    said = (
        ">100% (!) in %ceil (3 rows): faster than the matmul ceiling, the median rate of torch.mm on two "
        "2048x2048 float32 matrices (the better of 85.9 GFLOP/s at the run's start and 71.0 at its end). A share "
        "over 100% is not a fact: the ceiling estimate read low (other processes used the cores while it was "
        "measured) or the row's timing is off under load; a small ceiling size (--smoke, --quick) also reads below "
        "the machine's peak. results.json and the CSV files keep the ratio as measured (ceiling_fraction)."
    )
    assert note == "\n" + textwrap.fill(said, report.TABLE_WIDTH)  # wrapped to the tables' width


def test_no_ceiling_note_when_every_share_is_real():
    rows = [dict(r, ceiling_fraction=f) for r, f in zip(attention_rows((50,)), (0.3, 1.0, None, 0.9), strict=False)]
    assert report.ceiling_note(rows, CEILING, "float32") is None
