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
from .._plot import pyplot, save_figure
from .attention import REFERENCE

SCHEMA_VERSION = 1

ATTENTION_FIELDS = (
    "section", "mode", "path", "batch", "heads", "tokens", "head_dim", "dtype",
    "median_s", "iqr_s", "blocks", "gflop", "gflop_per_s", "ceiling_fraction",
    "peak_bytes", "attn_matrix_bytes", "time_ratio", "mem_ratio", "first_call_s",
)  # fmt: skip
MODEL_FIELDS = (
    "model", "mode", "path", "batch", "image_size", "dtype",
    "median_s", "iqr_s", "blocks", "images_per_s", "gflop", "gflop_per_s", "ceiling_fraction",
    "peak_bytes", "max_abs_diff_vs_einsum", "time_ratio",
)  # fmt: skip
PLOTS = ("attention_time.png", "attention_memory.png", "attention_ratio.png", "model_images_per_s.png")

MIB = 2**20


def write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=1) + "\n")


def write_csv(path: Path, rows: list[dict], fields: tuple[str, ...]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if r.get(k) is None else r[k]) for k in fields} for r in rows)
    write_text(path, buffer.getvalue())


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def header_text(meta: dict, ceiling: dict) -> str:
    return "\n".join(
        [
            f"vit-einops bench  {meta['time_utc']}  torch {meta['torch']}  einops {meta['einops']}  "
            f"python {meta['python']}",
            f"threads {meta['threads']} (of {meta['cpu_count']} CPUs)  CPU capability {meta['cpu_capability']}  "
            f"bf16 hardware {', '.join(meta['bf16_hardware']) or 'none'}  {meta['cpu_model']}",
            f"BLAS {meta['blas']}  load average at start {meta['load_average']}"
            + (f", at the end {meta['load_average_end']}" if "load_average_end" in meta else "")
            + f"  dtype {meta['dtype']}",
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


def attention_table(rows: list[dict]) -> str:
    """One block per (section, mode); times in ms, memory in MiB, ratios over the section's reference path."""
    lines = []
    for section, mode in dict.fromkeys((r["section"], r["mode"]) for r in rows):
        block = [r for r in rows if (r["section"], r["mode"]) == (section, mode)]
        lines.append(f"\nattention {section}, {mode} (ratios over {REFERENCE[section]})")
        lines.append(
            f"{'b':>3} {'h':>3} {'n':>5} {'d':>3}  {'path':<16}{'median ms':>11}{'IQR ms':>9}{'GFLOP/s':>9}{'%ceil':>7}"
            f"{'peak MiB':>10}{'A MiB':>9}{'time x':>8}{'mem x':>7}"
        )
        for r in block:
            lines.append(
                f"{r['batch']:>3} {r['heads']:>3} {r['tokens']:>5} {r['head_dim']:>3}  {r['path']:<16}"
                f"{r['median_s'] * 1e3:>11.3f}{r['iqr_s'] * 1e3:>9.3f}{r['gflop_per_s']:>9.1f}"
                f"{_num(r['ceiling_fraction'], '.0%'):>7}{r['peak_bytes'] / MIB:>10.1f}"
                f"{r['attn_matrix_bytes'] / MIB:>9.1f}"
                f"{_num(r['time_ratio'], '.2f'):>8}{_num(r['mem_ratio'], '.2f'):>7}"
            )
    return "\n".join(lines)


def model_table(rows: list[dict]) -> str:
    lines = ["\nwhole model (time x: over the same weights in torch's nn.TransformerEncoderLayer)"]
    lines.append(
        f"{'model':<10}{'mode':<11}{'path':<9}{'batch':>5}{'median ms':>11}{'IQR ms':>9}{'img/s':>8}{'GFLOP/s':>9}"
        f"{'%ceil':>7}{'peak MiB':>10}{'time x':>8}{'max|diff|':>11}"
    )
    for r in rows:
        lines.append(
            f"{r['model']:<10}{r['mode']:<11}{r['path']:<9}{r['batch']:>5}{r['median_s'] * 1e3:>11.1f}"
            f"{r['iqr_s'] * 1e3:>9.1f}{r['images_per_s']:>8.2f}{r['gflop_per_s']:>9.1f}{r['ceiling_fraction']:>7.0%}"
            f"{r['peak_bytes'] / MIB:>10.1f}{_num(r['time_ratio'], '.2f'):>8}{r['max_abs_diff_vs_einsum']:>11.1e}"
        )
    return "\n".join(lines)


def plot(out: Path, attention_rows: list[dict], model_rows: list[dict]) -> list[Path]:
    """Time, peak memory and the ratios over SDPA against N for the core paths (one panel per batch and mode),
    and the models' images/s; returns the files written."""
    plt = pyplot()
    written = []
    core = [r for r in attention_rows if r["section"] == "core"]
    if core:
        batches = sorted({r["batch"] for r in core})
        modes = list(dict.fromkeys(r["mode"] for r in core))
        paths = list(dict.fromkeys(r["path"] for r in core))
        specs = (
            ("attention_time.png", "median time (ms)", lambda r: r["median_s"] * 1e3, True),
            ("attention_memory.png", "peak memory (MiB)", lambda r: r["peak_bytes"] / MIB, True),
            ("attention_ratio.png", "time / SDPA time (solid), memory / SDPA memory (dashed)", None, False),
        )
        for name, ylabel, value, log in specs:
            fig, axes = plt.subplots(
                len(batches), len(modes), figsize=(5.5 * len(modes), 3.6 * len(batches)), squeeze=False
            )
            for (i, b), (j, mode) in ((ib, jm) for ib in enumerate(batches) for jm in enumerate(modes)):
                ax = axes[i][j]
                for path in paths:
                    pts = sorted(
                        (r for r in core if (r["batch"], r["mode"], r["path"]) == (b, mode, path)),
                        key=lambda r: r["tokens"],
                    )
                    if not pts:
                        continue
                    n = [r["tokens"] for r in pts]
                    if value is None:
                        line = ax.plot(n, [r["time_ratio"] for r in pts], marker="o", label=path)[0]
                        ax.plot(n, [r["mem_ratio"] for r in pts], marker="x", ls="--", color=line.get_color())
                    else:
                        ax.plot(n, [value(r) for r in pts], marker="o", label=path)
                if name == "attention_memory.png":
                    pts = sorted(
                        {r["tokens"]: r for r in core if (r["batch"], r["mode"]) == (b, mode)}.values(),
                        key=lambda r: r["tokens"],
                    )
                    ax.plot(
                        [r["tokens"] for r in pts],
                        [r["attn_matrix_bytes"] / MIB for r in pts],
                        "k:",
                        label="A = (b,h,n,n), analytic",
                    )
                if value is None:
                    ax.axhline(1.0, color="grey", lw=0.8)
                ax.set_xscale("log")
                if log:
                    ax.set_yscale("log")
                ax.set_title(f"batch {b}, {mode}")
                ax.set_xlabel("tokens N")
                ax.set_ylabel(ylabel)
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
            fig.tight_layout()
            written.append(save_figure(fig, out / name, dpi=110))
    if model_rows:
        groups = list(dict.fromkeys((r["model"], r["mode"]) for r in model_rows))
        paths = list(dict.fromkeys(r["path"] for r in model_rows))
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
        width = 0.8 / len(paths)
        for k, path in enumerate(paths):
            heights = [
                next((r["images_per_s"] for r in model_rows if (r["model"], r["mode"], r["path"]) == (*g, path)), 0)
                for g in groups
            ]
            ax.bar([i + k * width for i in range(len(groups))], heights, width, label=path)
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(groups))], [f"{m}\n{mode}" for m, mode in groups], fontsize=8
        )
        ax.set_ylabel(f"images/s (batch {model_rows[0]['batch']})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(save_figure(fig, out / "model_images_per_s.png", dpi=110))
    return written
