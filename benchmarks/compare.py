"""How far two bench runs' ratios moved: the same rows of two results.json, each ratio's change from the first run.

    python benchmarks/compare.py quiet/results.json busy/results.json            # every row, then the summary
    python benchmarks/compare.py quiet/results.json busy/results.json --within 0.25 --quiet

A row is a (section, mode, path, batch, heads, tokens, head dim) of the attention grid or a (model, mode, path) of
the models, present and timed in both runs; the reference paths (ratio 1 by definition) are left out. Its change is
the second run's time ratio over the first's, less 1. The summary counts the rows whose change is within
``--within`` (default 0.25: "stays within 25%") and names the worst; each run's threads and the other processes'
cores at its start and end say what the two runs were measured under. Each file is checked first
(vit_einops.bench.results): anything but a bench run's results, a ratio that is not a finite positive number
included, is one error line naming the file and the field.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit_einops.base.text import printable
from vit_einops.bench.results import ROW_KEYS, read_results


def ratios(results: dict) -> dict[tuple, float]:
    """Every timed row's time ratio, by its key; not the reference paths' (ratio 1 with the interval [1, 1]).
    ``results`` is checked (vit_einops.bench.results): each ratio is null or a finite positive number."""
    rows = {}
    for section, key in ROW_KEYS.items():
        for row in results[section]:
            ratio = row.get("time_ratio")
            if ratio is not None and not (row.get("time_ratio_low") == row.get("time_ratio_high") == ratio == 1.0):
                rows[(section, *(row[k] for k in key))] = ratio
    return rows


def compare(first: dict, second: dict, within: float) -> dict:
    """The rows of both runs with their two ratios and the change, and the summary."""
    a, b = ratios(first), ratios(second)
    rows = [
        dict(row=" ".join(map(str, key)), first=a[key], second=b[key], change=b[key] / a[key] - 1)
        for key in a
        if key in b
    ]
    if not rows:
        raise ValueError("the two runs have no timed row in common; compare runs of the same grid")
    worst = max(rows, key=lambda r: abs(r["change"]))
    return dict(
        rows=rows,
        within=within,
        rows_within=sum(abs(r["change"]) <= within for r in rows),
        worst=worst,
        runs=[_conditions(run) for run in (first, second)],
    )


def _conditions(results: dict) -> dict:
    meta = results["meta"]
    return dict(
        threads=meta["threads"],
        others_cores=[meta.get("others_cores"), meta.get("others_cores_end")],
        wall_s=meta.get("wall_s"),
        cpu_model=meta.get("cpu_model"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="results.json of the reference run (the quiet one)")
    parser.add_argument("second", type=Path, help="results.json of the run compared with it")
    parser.add_argument("--within", type=float, default=0.25, help="the change counted as holding (default 0.25)")
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    args = parser.parse_args(argv)
    if not 0 < args.within < 10:
        parser.error(f"--within {args.within} is not a fraction between 0 and 10")
    try:
        # a missing file, a FIFO, not JSON, not a bench run's results: one line naming the file and what is wrong
        first, second = (read_results(path) for path in (args.first, args.second))
        result = compare(first, second, args.within)
    except (OSError, ValueError) as error:
        parser.error(printable(error))
    if not args.quiet:
        for r in result["rows"]:
            print(f"{printable(r['row']):<55} {r['first']:6.2f} -> {r['second']:6.2f}  {r['change']:+7.1%}")
    for name, run in zip((args.first, args.second), result["runs"], strict=True):
        others = ", ".join("-" if c is None else f"{c:.2f}" for c in run["others_cores"])
        print(
            f"{printable(name)}: {run['threads']} threads, others {others} cores (start, end), "
            f"wall {run['wall_s']:.0f} s"
        )
    worst = result["worst"]
    print(
        f"{result['rows_within']} of {len(result['rows'])} ratios within {result['within']:.0%} of the first run's; "
        f"the most moved: {printable(worst['row'])} {worst['first']:.2f} -> {worst['second']:.2f} "
        f"({worst['change']:+.1%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
