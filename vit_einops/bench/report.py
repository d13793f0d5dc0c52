"""Where results go: a table on stdout, results.json, attention.csv / model.csv, and PNG plots.

The field lists below are the documented schema (benchmarks/README.md); every file is written atomically
(vit_einops._io), so a crashed run never leaves half a file.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from .._io import atomic_write_bytes
from .._plot import save_figure
from .attention import REFERENCE

SCHEMA_VERSION = 3  # 2: the noise columns, results['noisy'] and results['noise']; 3: others_cores, optimizer

ATTENTION_FIELDS = (
    "section", "mode", "path", "batch", "heads", "tokens", "head_dim", "dtype",
    "median_s", "iqr_s", "blocks", "gflop", "gflop_per_s", "ceiling_fraction",
    "peak_bytes", "attn_matrix_bytes", "time_ratio", "mem_ratio", "first_call_s",
    "p25_s", "p75_s", "iqr_ratio", "load_start", "load_end", "others_cores", "noisy", "noise", "attempts",
)  # fmt: skip
MODEL_FIELDS = (
    "model", "mode", "optimizer", "path", "batch", "image_size", "dtype",
    "median_s", "iqr_s", "blocks", "images_per_s", "gflop", "gflop_per_s", "ceiling_fraction",
    "peak_bytes", "max_abs_diff_vs_einsum", "time_ratio",
    "p25_s", "p75_s", "iqr_ratio", "load_start", "load_end", "others_cores", "noisy", "noise", "attempts",
)  # fmt: skip
PLOTS = ("attention_time.png", "attention_memory.png", "attention_ratio.png", "model_images_per_s.png")

MIB = 2**20


def write_text(path: Path, text: str, *, replace: bool = True) -> None:
    """``replace=False``: a file at ``path`` at the commit is refused (FileExistsError), never replaced."""
    atomic_write_bytes(path, text.encode(), replace=replace)


def write_json(path: Path, data: dict, *, replace: bool = True) -> None:
    write_text(path, json.dumps(data, indent=1) + "\n", replace=replace)


def write_csv(path: Path, rows: list[dict], fields: tuple[str, ...], *, replace: bool = True) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if r.get(k) is None else r[k]) for k in fields} for r in rows)
    write_text(path, buffer.getvalue(), replace=replace)


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def noise_mark(row: dict) -> str:
    """The table's noise column: "" for a trustworthy row, else "!" and what said so: load (other processes
    used the cores, by CPU time or by the load average), IQR."""
    if not row["noisy"]:
        return ""
    kinds = [kind for kind, words in (("load", "other processes"), ("IQR", "IQR")) if words in row["noise"]]
    return "!" + ",".join(kinds)


def noise_text(noise: dict) -> str:
    """The warning printed after the table and at the top of table.txt when the run was noisy."""
    return (
        "NOISY RUN: " + "; ".join(noise["reasons"]) + ". Rows marked ! are not trustworthy.\nAdvice: " + noise["advice"]
    )


def header_text(meta: dict, ceiling: dict, noise: dict | None = None) -> str:
    """The machine, versions, load and ceiling; with ``noise`` (the end of a noisy run), its warning first."""
    warning = [noise_text(noise)] if noise and noise["noisy"] else []
    return "\n".join(
        warning
        + [
            f"vit-einops bench  {meta['time_utc']}  torch {meta['torch']}  einops {meta['einops']}  "
            f"python {meta['python']}",
            f"threads {meta['threads']} (of {meta['cpu_count']} CPUs)  CPU capability {meta['cpu_capability']}  "
            f"bf16 hardware {', '.join(meta['bf16_hardware']) or 'none'}  {meta['cpu_model']}",
            f"BLAS {meta['blas']}  load average at start {meta['load_average']}"
            + (f", at the end {meta['load_average_end']}" if "load_average_end" in meta else "")
            + f"  dtype {meta['dtype']}",
            _others_text(meta),
            f"matmul ceiling: torch.mm {ceiling['size']}x{ceiling['size']} {ceiling['gflop_per_s']:.1f} GFLOP/s "
            f"(median {ceiling['median_s'] * 1e3:.1f} ms, IQR {ceiling['iqr_s'] * 1e3:.2f} ms"
            + (
                f"; the better of {ceiling['start_gflop_per_s']:.1f} at the start and "
                f"{ceiling['end_gflop_per_s']:.1f} at the end)"
                if "end_gflop_per_s" in ceiling
                else "; measured again at the end)"
            ),
        ]
    )


def _others_text(meta: dict) -> str:
    """The header's line on the other processes: their CPU use during the ceiling measurements, or why not."""
    if meta.get("others_cores") is None:
        return "other processes' CPU use: not measured (no /proc/stat); the load average judges the machine"
    end = meta.get("others_cores_end")
    return f"other processes' CPU use (/proc/stat, during the ceiling): {meta['others_cores']:.2f} cores at start" + (
        f", {end:.2f} at the end" if end is not None else ""
    )


def attention_table(rows: list[dict]) -> str:
    """One block per (section, mode); times in ms, memory in MiB, ratios over the section's reference path."""
    lines = []
    for section, mode in dict.fromkeys((r["section"], r["mode"]) for r in rows):
        block = [r for r in rows if (r["section"], r["mode"]) == (section, mode)]
        lines.append(f"\nattention {section}, {mode} (ratios over {REFERENCE[section]})")
        lines.append(
            f"{'b':>3} {'h':>3} {'n':>5} {'d':>3}  {'path':<16}{'median ms':>11}{'IQR ms':>9}{'GFLOP/s':>9}{'%ceil':>7}"
            f"{'peak MiB':>10}{'A MiB':>9}{'time x':>8}{'mem x':>7}  noise"
        )
        for r in block:
            lines.append(
                f"{r['batch']:>3} {r['heads']:>3} {r['tokens']:>5} {r['head_dim']:>3}  {r['path']:<16}"
                f"{r['median_s'] * 1e3:>11.3f}{r['iqr_s'] * 1e3:>9.3f}{r['gflop_per_s']:>9.1f}"
                f"{_num(r['ceiling_fraction'], '.0%'):>7}{r['peak_bytes'] / MIB:>10.1f}"
                f"{r['attn_matrix_bytes'] / MIB:>9.1f}"
                f"{_num(r['time_ratio'], '.2f'):>8}{_num(r['mem_ratio'], '.2f'):>7}  {noise_mark(r)}"
            )
    return "\n".join(lines)


def model_table(rows: list[dict]) -> str:
    # The model column is as wide as its longest name (a preset with overrides, e.g. vit_ti_16+depth=1) plus a
    # space, so it never runs into the mode column.
    width = max(len("model"), *(len(r["model"]) for r in rows)) + 1
    optimizers = sorted({r["optimizer"] for r in rows if r["optimizer"]})
    step = f"; train_step: forward, cross-entropy, backward, one {' or '.join(optimizers)} step" if optimizers else ""
    lines = [f"\nwhole model (time x: over the same weights in torch's nn.TransformerEncoderLayer{step})"]
    lines.append(
        f"{'model':<{width}}{'mode':<11}{'path':<9}{'batch':>5}{'median ms':>11}{'IQR ms':>9}{'img/s':>8}"
        f"{'GFLOP/s':>9}{'%ceil':>7}{'peak MiB':>10}{'time x':>8}{'max|diff|':>11}  noise"
    )
    for r in rows:
        lines.append(
            f"{r['model']:<{width}}{r['mode']:<11}{r['path']:<9}{r['batch']:>5}{r['median_s'] * 1e3:>11.1f}"
            f"{r['iqr_s'] * 1e3:>9.1f}{r['images_per_s']:>8.2f}{r['gflop_per_s']:>9.1f}{r['ceiling_fraction']:>7.0%}"
            f"{r['peak_bytes'] / MIB:>10.1f}{_num(r['time_ratio'], '.2f'):>8}{r['max_abs_diff_vs_einsum']:>11.1e}"
            f"  {noise_mark(r)}"
        )
    return "\n".join(lines)


def _quartile_ratio(row: dict, ref: dict) -> tuple[float, float]:
    """The spread of time_ratio: from the row's p25 over the reference's p75 to its p75 over their p25."""
    return row["p25_s"] / ref["p75_s"], row["p75_s"] / ref["p25_s"]


def _measured_n_ticks(ax, tokens: list[int]) -> None:
    """Log-scale x axis with a tick at each measured N and no others (the default log ticks are 10^k)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(tokens))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(n) for n in tokens])


def _attention_figure(core: list[dict], kind: str):
    """One of the three attention figures (kind: time, memory, ratio): a panel per (batch, mode), a line per path
    against N, error bars from the quartiles (p25 to p75) where the value is a timing, noisy points ringed red."""
    from matplotlib.figure import Figure

    batches = sorted({r["batch"] for r in core})
    modes = list(dict.fromkeys(r["mode"] for r in core))
    paths = list(dict.fromkeys(r["path"] for r in core))

    def key(r):
        return r["batch"], r["mode"], r["tokens"], r["heads"], r["head_dim"]

    reference = {key(r): r for r in core if r["path"] == REFERENCE["core"]}
    fig = Figure(figsize=(5.2 * len(modes), 3.4 * len(batches)), layout="constrained")
    axes = fig.subplots(len(batches), len(modes), squeeze=False, sharex=True)
    noisy_drawn = False
    for (i, b), (j, mode) in ((ib, jm) for ib in enumerate(batches) for jm in enumerate(modes)):
        ax = axes[i][j]
        panel = [r for r in core if (r["batch"], r["mode"]) == (b, mode)]
        tokens = sorted({r["tokens"] for r in panel})
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
                refs = [reference.get(key(r)) for r in pts]
                pts, refs = (
                    zip(*[(r, ref) for r, ref in zip(pts, refs, strict=True) if ref], strict=True)
                    if any(refs)
                    else ((), ())
                )
                n, y = [r["tokens"] for r in pts], [r["time_ratio"] for r in pts]
                spread = [_quartile_ratio(r, ref) for r, ref in zip(pts, refs, strict=True)]
                err = [
                    [yy - lo for yy, (lo, _) in zip(y, spread, strict=True)],
                    [hi - yy for yy, (_, hi) in zip(y, spread, strict=True)],
                ]
            line = ax.errorbar(n, y, yerr=err, marker="o", ms=4, capsize=3, label=path)[0]
            if kind == "ratio":
                ax.plot(n, [r["mem_ratio"] for r in pts], marker="x", ls="--", color=line.get_color())
            if kind != "memory":
                bad = [(nn, yy) for nn, yy, r in zip(n, y, pts, strict=True) if r["noisy"]]
                if bad:
                    ax.scatter(*zip(*bad, strict=True), s=90, facecolors="none", edgecolors="red", zorder=5,
                               label=None if noisy_drawn else "noisy (! in the table)")  # fmt: skip
                    noisy_drawn = True
        if kind == "memory":
            ax.plot(tokens, [max(r["attn_matrix_bytes"] for r in panel if r["tokens"] == t) / MIB for t in tokens],
                    "k:", label="A = (b,h,n,n), analytic")  # fmt: skip
        if kind == "ratio":
            ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_yscale("log")  # ratios too: 0.5x and 2x sit at the same distance from 1
        if kind == "ratio":  # plain numbers at 1-2-5 steps rather than 10^k with unlabelled minor ticks
            from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        _measured_n_ticks(ax, tokens)
        ax.set_title(f"batch {b}, {mode}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.supxlabel("tokens N (the measured values)")
    fig.supylabel(
        {
            "time": "median time per call (ms)\nbars: p25 to p75",
            "memory": "peak memory (MiB)",
            "ratio": "over SDPA: time (solid, bars p25 to p75)\nand peak memory (dashed)",
        }[kind]
    )
    return fig


def _model_figure(model_rows: list[dict]):
    """images/s per (model, mode), a bar per path, error bars from the quartiles of the time per call."""
    from matplotlib.figure import Figure

    groups = list(dict.fromkeys((r["model"], r["mode"]) for r in model_rows))
    paths = list(dict.fromkeys(r["path"] for r in model_rows))
    fig = Figure(figsize=(max(6.0, 1.7 * len(groups)), 4.2), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(paths)
    for k, path in enumerate(paths):
        rows = [next((r for r in model_rows if (r["model"], r["mode"], r["path"]) == (*g, path)), None) for g in groups]
        x = [i + k * width for i, r in enumerate(rows) if r]
        rows = [r for r in rows if r]
        heights = [r["images_per_s"] for r in rows]
        err = [[h - r["batch"] / r["p75_s"] for h, r in zip(heights, rows, strict=True)],
               [r["batch"] / r["p25_s"] - h for h, r in zip(heights, rows, strict=True)]]  # fmt: skip
        bars = ax.bar(x, heights, width, yerr=err, capsize=2, label=path)
        for bar, r in zip(bars, rows, strict=True):
            if r["noisy"]:
                bar.set_hatch("//")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], [f"{m}\n{mode}" for m, mode in groups], fontsize=8)
    ax.set_ylabel(f"images/s (batch {model_rows[0]['batch']}); bars: p25 to p75")
    ax.set_yscale("log")
    ax.legend(fontsize=8, title="hatched: noisy", title_fontsize=7)
    return fig


def figures(attention_rows: list[dict], model_rows: list[dict]) -> dict[str, object]:
    """The plots as matplotlib Figures, by file name (of PLOTS): time, peak memory and the ratios over SDPA
    against N for the core paths (a panel per batch and mode), and the models' images/s. Nothing is written or
    shown; :func:`save_figures` writes them."""
    figs = {}
    core = [r for r in attention_rows if r["section"] == "core"]
    if core:
        for kind in ("time", "memory", "ratio"):
            figs[f"attention_{kind}.png"] = _attention_figure(core, kind)
    if model_rows:
        figs["model_images_per_s.png"] = _model_figure(model_rows)
    return figs


def save_figures(out: Path, figs: dict[str, object], *, replace: bool = True) -> list[Path]:
    """Write each figure to ``out / name`` as PNG (atomically); returns the files written."""
    return [save_figure(fig, out / name, dpi=110, replace=replace) for name, fig in figs.items()]
