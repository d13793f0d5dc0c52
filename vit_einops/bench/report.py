"""Where results go: a table on stdout, results.json, attention.csv / model.csv (the plots: :mod:`.plots`).

The field lists below are the documented schema (benchmarks/README.md); :mod:`.results` reads it back, checked. The
run writes these files into a staging folder that replaces --out whole (vit_einops.base.io.staged_directory), so a
crashed run never leaves half a file, nor new files beside old ones.
"""

from __future__ import annotations

import csv
import io
import json
import textwrap
from pathlib import Path

from ..base.io import atomic_write_bytes
from ..network.kernels import KERNELS
from .attention import REFERENCE
from .names import REFERENCE_KERNEL

# 2: the noise columns, results['noisy'] and results['noise']; 3: others_cores, optimizer; 4: paired ratios (their
# interval, ratio_unresolved, rounds) and meta's threads_source; 5: each attention row's kernel, the torch kernel
# paths, and attention_unavailable (the paths refused at a point, with the reason); 6: results['verdict'] (the
# paragraph printed first), meta's threads_used, compile's first_call_s_by_path; 7: results['overhead'] (the per-call
# overhead of a tiny ViT over plain torch ops)
SCHEMA_VERSION = 7

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
TABLE_WIDTH = 120  # every line of table.txt; each row's kernel is in results.json and the CSV files


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
    return "\n" + textwrap.fill(
        f"{UNRESOLVED} after a time ratio ({count} {'row' if count == 1 else 'rows'}): unresolved. Its 95% interval "
        "(in brackets: the median of the per-round ratios, rounds resampled 2000 times) reaches 1.0, so these rounds "
        "cannot tell which path is faster. More --rounds narrow the interval; a quieter machine narrows it more.",
        TABLE_WIDTH,
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
    return textwrap.fill(
        "NOISY RUN (so far): " + "; ".join(reasons) + ". Rows marked ! are not trustworthy; the noise report "
        "follows the tables.",
        TABLE_WIDTH,
    )


def noise_text(noise: dict) -> str:
    """The verdict printed after the tables and at the top of table.txt when the run was noisy."""
    verdict = "NOISY RUN: " + "; ".join(noise["reasons"]) + ". Rows marked ! are not trustworthy."
    return textwrap.fill(verdict, TABLE_WIDTH) + "\n" + textwrap.fill("Advice: " + noise["advice"], TABLE_WIDTH)


def overhead_text(row: dict) -> str:
    """The line printed after the verdict (row: vit_einops.bench.overhead.overhead_row): both times per call, the
    model's over the plain ops' with its interval, and the difference."""
    return textwrap.fill(
        f"Per-call overhead: a tiny ViT's forward call ({row['model']}, batch {row['batch']}) takes "
        f"{row['model_s'] * 1e6:.0f} us, the same math in plain torch ops {row['plain_s'] * 1e6:.0f} us: "
        f"{ratio_cell(row)} times as long ({row['overhead_s'] * 1e6:+.0f} us a call).",
        TABLE_WIDTH,
    )


def wrote_text(names: list[str], out: str, wall_s: float, plot_count: int, threads: str) -> str:
    """The run's last lines: how many files it wrote, its wall time and plots, then the folder (``out``, already
    printable) on its own line, the file names wrapped beneath it, and the thread count and why (``threads``), all
    within TABLE_WIDTH (only a folder name longer than that cannot be)."""
    return "\n".join(
        [f"wrote {len(names)} files (wall {wall_s:.0f} s, {plot_count} plots) to", f"  {out}/"]
        + textwrap.wrap(", ".join(names), TABLE_WIDTH, initial_indent="    ", subsequent_indent="    ",
                        break_long_words=False, break_on_hyphens=False)  # fmt: skip
        + textwrap.wrap(threads, TABLE_WIDTH, subsequent_indent="  ")
    )


def header_text(meta: dict, ceiling: dict, noise: dict | None = None) -> str:
    """The machine, versions, load and ceiling; with ``noise`` (the end of a noisy run), its warning first."""
    warning = [noise_text(noise)] if noise and noise["noisy"] else []
    lines = (
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
    return "\n".join(textwrap.fill(line, TABLE_WIDTH, subsequent_indent="  ") if len(line) > TABLE_WIDTH else line
                     for text in lines for line in text.splitlines())  # fmt: skip


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
    return "\n" + textwrap.fill(
        f"{CEILING_FLAG} in %ceil ({over} {'row' if over == 1 else 'rows'}): faster than the matmul ceiling, "
        f"the median rate of torch.mm on two {ceiling['size']}x{ceiling['size']} {dtype} matrices ({measured}). "
        "A share over 100% is not a fact: the ceiling estimate read low (other processes used the cores while it "
        "was measured) or the row's timing is off under load; a small ceiling size (--smoke, --quick) also reads "
        "below the machine's peak. results.json and the CSV files keep the ratio as measured (ceiling_fraction).",
        TABLE_WIDTH,
    )


def attention_table(rows: list[dict], unavailable: list[dict] = ()) -> str:
    """One block per (section, mode); times in ms, memory in MiB, ratios over the section's reference path; a path
    refused at a point (``unavailable``) says why in place of its numbers. The kernel each row ran and its IQR are
    in results.json and attention.csv (the noise column marks a wide IQR)."""
    lines = []
    everything = [*rows, *unavailable]
    for section, mode in dict.fromkeys((r["section"], r["mode"]) for r in everything):
        block = [r for r in rows if (r["section"], r["mode"]) == (section, mode)]
        refused = [r for r in unavailable if (r["section"], r["mode"]) == (section, mode)]
        lines.append(f"\nattention {section}, {mode} (ratios over {REFERENCE[section]})")
        lines.append(
            f"{'b':>3} {'h':>3} {'n':>5} {'d':>3}  {'path':<16}{'median ms':>10}{'GFLOP/s':>8}{'%ceil':>10}"
            f"{'peak MiB':>9}{'A MiB':>8}  {'time x [95% interval]':<{RATIO_WIDTH}}{'mem x':>6} noise"
        )
        for r in block:
            lines.append(
                f"{r['batch']:>3} {r['heads']:>3} {r['tokens']:>5} {r['head_dim']:>3}  {r['path']:<16}"
                f"{r['median_s'] * 1e3:>10.3f}{r['gflop_per_s']:>8.1f}{ceiling_share(r['ceiling_fraction']):>10}"
                f"{r['peak_bytes'] / MIB:>9.1f}{r['attn_matrix_bytes'] / MIB:>8.1f}"
                f"  {ratio_cell(r):<{RATIO_WIDTH}}{_num(r['mem_ratio'], '.2f'):>6} {noise_mark(r)}".rstrip()
            )
        for r in refused:
            lines.append(
                textwrap.fill(
                    f"{r['batch']:>3} {r['heads']:>3} {r['tokens']:>5} {r['head_dim']:>3}  {r['path']:<16}"
                    f"unavailable: {r['unavailable']}",
                    TABLE_WIDTH, subsequent_indent=" " * 36,
                )  # fmt: skip
            )
    return "\n".join(lines)


def model_table(rows: list[dict]) -> str:
    """The whole-model rows; GFLOP/s, the IQR and the batch (one per run, in the title) are in results.json and
    model.csv."""
    # The model column is as wide as its longest name (a preset with overrides, e.g. vit_ti_16+depth=1) plus a
    # space, so it never runs into the mode column.
    width = max(len("model"), *(len(r["model"]) for r in rows)) + 1
    optimizers = sorted({r["optimizer"] for r in rows if r["optimizer"]})
    batches = "/".join(str(b) for b in sorted({r["batch"] for r in rows}))
    step = f"; train_step: forward, cross-entropy, backward, one {' or '.join(optimizers)} step" if optimizers else ""
    title = f"whole model, batch {batches} (time x: over the same weights in torch's nn.TransformerEncoderLayer{step})"
    lines = ["", *textwrap.wrap(title, TABLE_WIDTH, break_on_hyphens=False)]
    lines.append(
        f"{'model':<{width}}{'mode':<11}{'path':<9}{'median ms':>10}{'img/s':>9}{'%ceil':>10}{'peak MiB':>10}"
        f"  {'time x [95% interval]':<{RATIO_WIDTH}}{'max|diff|':>10} noise"
    )
    for r in rows:
        lines.append(
            f"{r['model']:<{width}}{r['mode']:<11}{r['path']:<9}{r['median_s'] * 1e3:>10.1f}"
            f"{r['images_per_s']:>9.2f}{ceiling_share(r['ceiling_fraction']):>10}{r['peak_bytes'] / MIB:>10.1f}"
            f"  {ratio_cell(r):<{RATIO_WIDTH}}{r['max_abs_diff_vs_einsum']:>10.1e} {noise_mark(r)}".rstrip()
        )
    return "\n".join(lines)


MODE_WORDS = {"forward": "forward", "forward_backward": "forward+backward"}


def _verdict_ratio(row: dict) -> str:
    """ "2.31x [2.10, 2.50]"; "1.02x? [0.95, 1.10]" when unresolved; "(noisy)" after a noisy row's."""
    mark = UNRESOLVED if row["ratio_unresolved"] else ""
    low, high = row["time_ratio_low"], row["time_ratio_high"]
    interval = "one round" if low is None else f"{low:.2f}, {high:.2f}"
    return f"{row['time_ratio']:.2f}x{mark} [{interval}]" + (" (noisy)" if row["noisy"] else "")


def verdict_text(rows: list[dict], ceiling_gflop_per_s: float, oom_tokens: dict[str, int | None], limit: str) -> str:
    """The answer the bench prints first: each other kernel's time over SDPA's (the reference) at one point (the
    grid's largest N), forward and forward+backward, with their 95% intervals; each path's share of the matmul ceiling
    (``ceiling_gflop_per_s``); and the N from which einsum's attention matrix no longer fits ``limit`` (the memory
    budget, in words), per mode (``oom_tokens``; None: not below 2^24). ``rows``: the core rows of that point."""
    by = {(r["path"], r["mode"]): r for r in rows if r["section"] == "core"}
    modes = [m for m in MODE_WORDS if (REFERENCE_KERNEL, m) in by]
    point = next(iter(by.values()), None)
    verdict_paths = [k for k in KERNELS if k != REFERENCE_KERNEL]  # each kernel against the reference
    if point is None or not modes or not any((p, m) in by for p in verdict_paths for m in modes):
        return f"Verdict: none: the grid measures no other kernel's core path beside {REFERENCE_KERNEL} to compare."
    where = f"N {point['tokens']} (batch {point['batch']}, {point['heads']} heads of {point['head_dim']})"
    claims = []
    for path in verdict_paths:
        parts = [f"{_verdict_ratio(by[path, m])} {MODE_WORDS[m]}" for m in modes if (path, m) in by]
        if parts:
            claims.append(f"{path} takes {' and '.join(parts)}")
    shares = []
    for m in modes:
        cells = [f"{p} {by[p, m]['gflop_per_s'] / ceiling_gflop_per_s:.0%}" for p in (REFERENCE_KERNEL, *verdict_paths)
                 if (p, m) in by]  # fmt: skip
        shares.append(f"{MODE_WORDS[m]} {', '.join(cells)}")
    memory = []
    for m in modes:
        n = oom_tokens.get(m)
        memory.append(f"{MODE_WORDS[m]} from N {n:,}" if n is not None else f"{MODE_WORDS[m]} not below N 2^24")
    text = (
        f"Verdict: at {where}, against SDPA's time: {'; '.join(claims)}. "
        f"Share of the matmul ceiling ({ceiling_gflop_per_s:.1f} GFLOP/s): {'; '.join(shares)}. "
        f"einsum's attention matrix A ({point['attn_matrix_bytes'] / MIB:.1f} MiB here) outgrows {limit} at this "
        f"batch and heads: {', '.join(memory)}."
        + (f" {UNRESOLVED}: the interval reaches 1.0, the rounds cannot tell the paths apart." if any(
            r["ratio_unresolved"] for r in by.values()) else "")
    )  # fmt: skip
    return textwrap.fill(text, TABLE_WIDTH)
