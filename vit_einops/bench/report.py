"""Where results go: a table on stdout, results.json, attention.csv / model.csv (the plots: :mod:`.plots`).

The field lists below are the documented schema (benchmarks/README.md); :mod:`.results` reads it back, checked. The
run writes these files into a staging folder that replaces --out whole (vit_einops.base.io.staged_directory), so a
crashed run never leaves half a file, nor new files beside old ones.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..base.io import atomic_write_bytes
from .attention import REFERENCE

# 2: the noise columns, results['noisy'] and results['noise']; 3: others_cores, optimizer; 4: paired ratios (their
# interval, ratio_unresolved, rounds) and meta's threads_source; 5: each attention row's kernel, the torch kernel
# paths, and attention_unavailable (the paths refused at a point, with the reason)
SCHEMA_VERSION = 5

ATTENTION_FIELDS = (
    "section", "mode", "path", "kernel", "batch", "heads", "tokens", "head_dim", "dtype",
    "median_s", "iqr_s", "blocks", "gflop", "gflop_per_s", "ceiling_fraction",
    "peak_bytes", "attn_matrix_bytes", "time_ratio", "time_ratio_low", "time_ratio_high", "ratio_unresolved",
    "rounds", "mem_ratio", "first_call_s",
    "p25_s", "p75_s", "iqr_ratio", "load_start", "load_end", "others_cores", "noisy", "noise", "attempts",
)  # fmt: skip
MODEL_FIELDS = (
    "model", "mode", "optimizer", "path", "batch", "image_size", "dtype",
    "median_s", "iqr_s", "blocks", "images_per_s", "gflop", "gflop_per_s", "ceiling_fraction",
    "peak_bytes", "max_abs_diff_vs_einsum", "time_ratio", "time_ratio_low", "time_ratio_high", "ratio_unresolved",
    "rounds",
    "p25_s", "p75_s", "iqr_ratio", "load_start", "load_end", "others_cores", "noisy", "noise", "attempts",
)  # fmt: skip
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


UNRESOLVED = "?"
RATIO_WIDTH = 22


def ratio_cell(row: dict) -> str:
    """The table's time ratio and its 95% interval, "1.52 [1.40, 1.61]"; an unresolved ratio (its interval reaches
    1.0, or one round gave none) is followed by UNRESOLVED, "1.02? [0.95, 1.10]"; "-" without a reference."""
    if row["time_ratio"] is None:
        return "-"
    mark = UNRESOLVED if row["ratio_unresolved"] else ""
    if row["time_ratio_low"] is None:
        return f"{row['time_ratio']:.2f}{mark} [one round]"
    return f"{row['time_ratio']:.2f}{mark} [{row['time_ratio_low']:.2f}, {row['time_ratio_high']:.2f}]"


def unresolved_note(rows: list[dict]) -> str | None:
    """The footnote under the tables when some ratio is unresolved (None when none is)."""
    count = sum(1 for r in rows if r["ratio_unresolved"])
    if not count:
        return None
    return (
        f"\n{UNRESOLVED} after a time ratio ({count} {'row' if count == 1 else 'rows'}): unresolved. Its 95% interval "
        "(in brackets: the median of the per-round ratios, rounds resampled 2000 times) reaches 1.0, so these rounds "
        "cannot tell which path is faster. More --rounds narrow the interval; a quieter machine narrows it more."
    )


def noise_mark(row: dict) -> str:
    """The table's noise column: "" for a trustworthy row, else "!" and what said so: load (other processes
    used the cores, by CPU time or by the load average), IQR."""
    if not row["noisy"]:
        return ""
    kinds = [kind for kind, words in (("load", "other processes"), ("IQR", "IQR")) if words in row["noise"]]
    return "!" + ",".join(kinds)


def early_noise_text(reasons: list[str]) -> str:
    """The line a noisy run prints as soon as it knows, before its rows: what has been seen so far."""
    return (
        "NOISY RUN (so far): " + "; ".join(reasons) + ". Rows marked ! are not trustworthy; the verdict follows "
        "the tables."
    )


def noise_text(noise: dict) -> str:
    """The verdict printed after the tables and at the top of table.txt when the run was noisy."""
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
            f"threads {meta['threads']} (of {meta['cpu_count']} CPUs; from {meta['threads_source']})",
            f"CPU capability {meta['cpu_capability']}  bf16 hardware {', '.join(meta['bf16_hardware']) or 'none'}  "
            f"{meta['cpu_model']}",
            f"BLAS {meta['blas']}  load average at start {meta['load_average']}"
            + (f", at the end {meta['load_average_end']}" if "load_average_end" in meta else "")
            + f"  dtype {meta['dtype']}",
            *_gpu_text(meta),
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


def _gpu_text(meta: dict) -> list[str]:
    """The header's line on the GPU the run measured on (none on a CPU run)."""
    if "gpu" not in meta:
        return []
    return [
        f"device {meta['device']}: {meta['gpu']} (compute capability {meta['compute_capability']}, "
        f"{meta['gpu_memory_bytes'] / 2**30:.1f} GiB, L2 {meta['l2_bytes'] / 2**20:.1f} MiB, CUDA {meta['cuda']}); "
        f"timed with CUDA events, {meta['flush_bytes'] / 2**20:.0f} MiB written before each round to flush L2"
    ]


def _others_text(meta: dict) -> str:
    """The header's line on the other processes: their CPU use during the ceiling measurements, or why not."""
    if meta.get("others_cores") is None:
        return "other processes' CPU use: not measured (no /proc/stat); the load average judges the machine"
    end = meta.get("others_cores_end")
    return f"other processes' CPU use (/proc/stat, during the ceiling): {meta['others_cores']:.2f} cores at start" + (
        f", {end:.2f} at the end" if end is not None else ""
    )


CEILING_FLAG = ">100% (!)"


def ceiling_share(fraction: float | None) -> str:
    """The %ceil column: the row's GFLOP/s as a share of the matmul ceiling, or CEILING_FLAG above 100% (a share
    the ceiling estimate cannot support; :func:`ceiling_note` says why it reads so)."""
    if fraction is None:
        return "-"
    return CEILING_FLAG if fraction > 1 else format(fraction, ".0%")


def ceiling_note(rows: list[dict], ceiling: dict, dtype: str) -> str | None:
    """The footnote under the tables when some row reads above the ceiling (None when none does): what the
    ceiling is, and why such a share is not a fact."""
    over = sum(1 for r in rows if r["ceiling_fraction"] is not None and r["ceiling_fraction"] > 1)
    if not over:
        return None
    measured = (
        f"the better of {ceiling['start_gflop_per_s']:.1f} GFLOP/s at the run's start and "
        f"{ceiling['end_gflop_per_s']:.1f} at its end"
        if "end_gflop_per_s" in ceiling
        else f"{ceiling['gflop_per_s']:.1f} GFLOP/s"
    )
    return (
        f"\n{CEILING_FLAG} in %ceil ({over} {'row' if over == 1 else 'rows'}): faster than the matmul ceiling, "
        f"the median rate of torch.mm on two {ceiling['size']}x{ceiling['size']} {dtype} matrices ({measured}). "
        "A share over 100% is not a fact: the ceiling estimate read low (other processes used the cores while it "
        "was measured) or the row's timing is off under load; a small ceiling size (--smoke, --quick) also reads "
        "below the machine's peak. results.json and the CSV files keep the ratio as measured (ceiling_fraction)."
    )


def attention_table(rows: list[dict], unavailable: list[dict] = ()) -> str:
    """One block per (section, mode); times in ms, memory in MiB, ratios over the section's reference path, the
    kernel the profiler saw run; a path refused at a point (``unavailable``) says why in place of its numbers."""
    lines = []
    everything = [*rows, *unavailable]
    for section, mode in dict.fromkeys((r["section"], r["mode"]) for r in everything):
        block = [r for r in rows if (r["section"], r["mode"]) == (section, mode)]
        refused = [r for r in unavailable if (r["section"], r["mode"]) == (section, mode)]
        width = max([len("kernel"), *(len(r["kernel"]) for r in block)]) + 2
        lines.append(f"\nattention {section}, {mode} (ratios over {REFERENCE[section]})")
        lines.append(
            f"{'b':>3} {'h':>3} {'n':>5} {'d':>3}  {'path':<16}{'median ms':>11}{'IQR ms':>9}{'GFLOP/s':>9}"
            f"{'%ceil':>10}{'peak MiB':>10}{'A MiB':>9}  {'time x [95% interval]':<{RATIO_WIDTH}}{'mem x':>7}"
            f"  {'kernel':<{width}}noise"
        )
        for r in block:
            lines.append(
                f"{r['batch']:>3} {r['heads']:>3} {r['tokens']:>5} {r['head_dim']:>3}  {r['path']:<16}"
                f"{r['median_s'] * 1e3:>11.3f}{r['iqr_s'] * 1e3:>9.3f}{r['gflop_per_s']:>9.1f}"
                f"{ceiling_share(r['ceiling_fraction']):>10}{r['peak_bytes'] / MIB:>10.1f}"
                f"{r['attn_matrix_bytes'] / MIB:>9.1f}"
                f"  {ratio_cell(r):<{RATIO_WIDTH}}{_num(r['mem_ratio'], '.2f'):>7}  {r['kernel']:<{width}}"
                f"{noise_mark(r)}".rstrip()
            )
        for r in refused:
            lines.append(
                f"{r['batch']:>3} {r['heads']:>3} {r['tokens']:>5} {r['head_dim']:>3}  {r['path']:<16}"
                f"unavailable: {r['unavailable']}"
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
        f"{'GFLOP/s':>9}{'%ceil':>10}{'peak MiB':>10}  {'time x [95% interval]':<{RATIO_WIDTH}}{'max|diff|':>11}  noise"
    )
    for r in rows:
        lines.append(
            f"{r['model']:<{width}}{r['mode']:<11}{r['path']:<9}{r['batch']:>5}{r['median_s'] * 1e3:>11.1f}"
            f"{r['iqr_s'] * 1e3:>9.1f}{r['images_per_s']:>8.2f}{r['gflop_per_s']:>9.1f}"
            f"{ceiling_share(r['ceiling_fraction']):>10}{r['peak_bytes'] / MIB:>10.1f}  {ratio_cell(r):<{RATIO_WIDTH}}"
            f"{r['max_abs_diff_vs_einsum']:>11.1e}  {noise_mark(r)}"
        )
    return "\n".join(lines)
