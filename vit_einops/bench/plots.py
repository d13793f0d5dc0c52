"""The bench's plots as matplotlib Figures: attention time, peak memory and ratios against N, and the models' images/s.

Every figure reads right for one N as for many: the x axis spans the measured N with room either side (a single N
would otherwise collapse it to a point), log axes are labelled with plain numbers at 1-2-5 steps (never 10^k or
"1.14x10^1"), and the panels sit in a constrained layout. Throughput bars start at zero on a linear axis, each
labelled with its value: on a log axis that does not start at zero, a 10% difference looks large.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy

from ..base.plot import new_figure, save_figure
from .attention import REFERENCE
from .report import MIB

PLOTS = ("attention_time.png", "attention_memory.png", "attention_ratio.png", "model_images_per_s.png")
# Log axes spanning more than this many decades get a tick at each power of ten only; fewer, at 1, 2 and 5 of
# each decade too (up to 3 decades: 10 labelled ticks at most).
DENSE_DECADES = 3.0
# How far the x axis reaches past the smallest and largest N, as a factor on the log scale: 1.25 for several N; a
# single N gets a factor 2 either side, so its points stand in the middle of a readable span.
N_MARGIN, SINGLE_N_MARGIN = 1.25, 2.0
Y_MARGIN = 1.05  # a point is never drawn on the frame, half hidden


def plain_number(value: float) -> str:
    """A tick label as a plain decimal: 1000, 20, 0.5, 0.002 (six significant digits at most)."""
    return numpy.format_float_positional(float(f"{value:.6g}"), trim="-")


def log_steps(low: float, high: float) -> list[float]:
    """Ticks for a log axis that shows ``low`` to ``high`` (both > 0): the 1-2-5 steps (only the powers of ten
    beyond DENSE_DECADES decades) from the largest step at or below ``low`` to the smallest at or above ``high``,
    so both ends of the axis are labelled and at least two ticks show."""
    dense = math.log10(high / low) <= DENSE_DECADES
    mantissas = (1.0, 2.0, 5.0) if dense else (1.0,)
    first, last = math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1
    # Rounded to 12 significant digits: 10**-2 * 5 is 0.05000000000000001, which must not sort past 0.05.
    steps = sorted(float(f"{m * 10.0**e:.12g}") for e in range(first, last + 1) for m in mantissas)
    bottom = max(s for s in steps if s <= low)
    top = min(s for s in steps if s >= high)
    if top == bottom:  # every value on one step: reach to the steps either side
        bottom, top = steps[steps.index(bottom) - 1], steps[steps.index(top) + 1]
    return [s for s in steps if bottom <= s <= top]


def _plain_log_y(ax) -> None:
    """Log y axis from a labelled tick below everything drawn to one above, plain numbers at each tick, no
    unlabelled minor ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    low, high = ax.dataLim.intervaly
    ax.set_yscale("log")
    ticks = log_steps(low / Y_MARGIN, high * Y_MARGIN)
    ax.set_ylim(ticks[0], ticks[-1])
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))
    ax.yaxis.set_minor_locator(NullLocator())


def _measured_n_x(ax, tokens: list[int]) -> None:
    """Log-scale x axis with a tick at each measured N and no others, reaching past the smallest and largest."""
    from matplotlib.ticker import FixedLocator, NullLocator

    margin = N_MARGIN if len(tokens) > 1 else SINGLE_N_MARGIN
    ax.set_xscale("log")
    ax.set_xlim(min(tokens) / margin, max(tokens) * margin)
    ax.xaxis.set_major_locator(FixedLocator(tokens))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(n) for n in tokens])


def ratio_label(value: float) -> str:
    """A resolved ratio's label on the ratio plot: "1.52x"."""
    return f"{value:.2f}x"


def _attention_figure(core: list[dict], kind: str):
    """One of the three attention figures (kind: time, memory, ratio): a panel per (batch, mode), a line per path
    against N, noisy points ringed red. Time: error bars from the quartiles (p25 to p75). Ratio: error bars the
    ratio's 95% interval; a resolved ratio is a filled point labelled with its value, an unresolved one (its
    interval reaches 1) a hollow point with no number."""
    batches = sorted({r["batch"] for r in core})
    modes = list(dict.fromkeys(r["mode"] for r in core))
    paths = list(dict.fromkeys(r["path"] for r in core))
    tokens = sorted({r["tokens"] for r in core})

    fig = new_figure(figsize=(5.2 * len(modes), 3.6 * len(batches)))
    axes = fig.subplots(len(batches), len(modes), squeeze=False, sharex=True)
    noisy_drawn = False
    for (i, b), (j, mode) in ((ib, jm) for ib in enumerate(batches) for jm in enumerate(modes)):
        ax = axes[i][j]
        panel = [r for r in core if (r["batch"], r["mode"]) == (b, mode)]
        for path in paths:
            pts = sorted((r for r in panel if r["path"] == path), key=lambda r: r["tokens"])
            if not pts:
                continue
            n = [r["tokens"] for r in pts]
            if kind == "time":
                y = [r["median_s"] * 1e3 for r in pts]
                err = [
                    [(r["median_s"] - r["p25_s"]) * 1e3 for r in pts],
                    [(r["p75_s"] - r["median_s"]) * 1e3 for r in pts],
                ]
            elif kind == "memory":
                y, err = [r["peak_bytes"] / MIB for r in pts], None
            else:
                pts = [r for r in pts if r["time_ratio"] is not None]
                n, y = [r["tokens"] for r in pts], [r["time_ratio"] for r in pts]
                err = [  # one round has no interval: no bar
                    [yy - (r["time_ratio_low"] or yy) for yy, r in zip(y, pts, strict=True)],
                    [(r["time_ratio_high"] or yy) - yy for yy, r in zip(y, pts, strict=True)],
                ]
            if not pts:
                continue
            marker = "none" if kind == "ratio" else "o"  # ratio points are drawn below, filled or hollow
            line = ax.errorbar(n, y, yerr=err, marker=marker, ms=4, capsize=3, label=path)[0]
            if kind == "ratio":
                colour = line.get_color()
                for nn, yy, r in zip(n, y, pts, strict=True):
                    hollow = r["ratio_unresolved"]
                    ax.plot(nn, yy, "o", ms=5, color=colour, markerfacecolor="white" if hollow else colour)
                    if not hollow and r["path"] != REFERENCE["core"]:
                        ax.annotate(ratio_label(yy), (nn, yy), xytext=(4, 3), textcoords="offset points",
                                    fontsize=6, color=colour)  # fmt: skip
                ax.plot(n, [r["mem_ratio"] for r in pts], marker="x", ls="--", color=colour)
            if kind != "memory":
                bad = [(nn, yy) for nn, yy, r in zip(n, y, pts, strict=True) if r["noisy"]]
                if bad:
                    ax.scatter(*zip(*bad, strict=True), s=90, facecolors="none", edgecolors="red", zorder=5,
                               label=None if noisy_drawn else "noisy (! in the table)")  # fmt: skip
                    noisy_drawn = True
        if kind == "memory":
            panel_tokens = sorted({r["tokens"] for r in panel})
            matrix = [max(r["attn_matrix_bytes"] for r in panel if r["tokens"] == t) / MIB for t in panel_tokens]
            ax.plot(panel_tokens, matrix, "k:", marker="_" if len(panel_tokens) == 1 else None, ms=12,
                    label="A = (b,h,n,n), analytic")  # fmt: skip
        if kind == "ratio":
            ax.axhline(1.0, color="grey", lw=0.8)
        _plain_log_y(ax)  # ratios too: 0.5x and 2x sit at the same distance from 1
        _measured_n_x(ax, tokens)
        ax.set_title(f"batch {b}, {mode}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.supxlabel("tokens N (the measured values)")
    fig.supylabel(
        {
            "time": "median time per call (ms)\nbars: p25 to p75",
            "memory": "peak memory (MiB)",
            "ratio": "over SDPA: time (solid, bars 95% interval;\nhollow: unresolved), memory (dashed)",
        }[kind],
        fontsize=10,
    )
    return fig


def images_per_s_label(value: float) -> str:
    """A bar's label: whole images/s from 100 up, three significant digits below."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _model_figure(model_rows: list[dict]):
    """A panel per (mode, model), a bar per path: images/s on a linear axis from zero, each bar labelled with its
    value, error bars from the quartiles of the time per call, noisy bars hatched. Each panel has its own scale:
    the presets differ tenfold, and one shared axis would flatten the small ones' bars."""
    models = list(dict.fromkeys(r["model"] for r in model_rows))
    modes = list(dict.fromkeys(r["mode"] for r in model_rows))
    paths = list(dict.fromkeys(r["path"] for r in model_rows))
    colours = {path: f"C{k}" for k, path in enumerate(paths)}
    fig = new_figure(figsize=(max(4.0, 0.9 * len(paths) + 0.6) * len(models), 3.0 * len(modes)))
    axes = fig.subplots(len(modes), len(models), squeeze=False)
    for (i, mode), (j, model) in ((im, jm) for im in enumerate(modes) for jm in enumerate(models)):
        ax = axes[i][j]
        rows = [r for path in paths for r in model_rows if (r["model"], r["mode"], r["path"]) == (model, mode, path)]
        heights = [r["images_per_s"] for r in rows]
        low = [h - r["batch"] / r["p75_s"] for h, r in zip(heights, rows, strict=True)]
        high = [r["batch"] / r["p25_s"] - h for h, r in zip(heights, rows, strict=True)]
        x = range(len(rows))
        bars = ax.bar(x, heights, 0.7, yerr=[low, high], capsize=3, color=[colours[r["path"]] for r in rows])
        for bar, r in zip(bars, rows, strict=True):
            if r["noisy"]:
                bar.set_hatch("//")
        tops = [h + up for h, up in zip(heights, high, strict=True)]
        for k, (h, top) in enumerate(zip(heights, tops, strict=True)):
            ax.annotate(images_per_s_label(h), (k, top), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        ax.set_yscale("linear")
        ax.set_ylim(0, max(tops, default=1.0) * 1.15 or 1.0)  # room above the highest label
        ax.set_xticks(list(x), [r["path"] for r in rows], fontsize=8)
        ax.set_title(f"{model}, {mode}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.supylabel(f"images/s (batch {model_rows[0]['batch']}), from zero")
    fig.suptitle("bars: p25 to p75 of the time per call\nhatched: noisy (! in the table)", fontsize=9)
    return fig


def figures(attention_rows: list[dict], model_rows: list[dict]) -> dict[str, object]:
    """The plots as matplotlib Figures, by file name (of PLOTS): time, peak memory and the ratios over SDPA
    against N for the core paths (a panel per batch and mode), and the models' images/s (a panel per mode and
    model). Nothing is written or shown; :func:`save_figures` writes them."""
    figs = {}
    core = [r for r in attention_rows if r["section"] == "core"]
    if core:
        for kind in ("time", "memory", "ratio"):
            figs[f"attention_{kind}.png"] = _attention_figure(core, kind)
    if model_rows:
        figs["model_images_per_s.png"] = _model_figure(model_rows)
    return figs


def save_figures(out: Path, figs: dict[str, object], *, replace: bool = True) -> list[Path]:
    """Write each figure to ``out / name`` as PNG (atomically; ``replace=False``: a file there at the commit is
    refused, never replaced); returns the files written."""
    return [save_figure(fig, out / name, dpi=110, replace=replace) for name, fig in figs.items()]
