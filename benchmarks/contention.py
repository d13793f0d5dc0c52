"""The chunked attention path against SDPA on a shared machine: quiet, with one busy process beside it, with two.

    python benchmarks/contention.py                          # b 1,8; N 577,1025; h 12, D_h 64; forward
    python benchmarks/contention.py --busy 0,1 --cycles 3 --rounds 8 --out contention.json

Busy processes (vit_einops.bench.busy) are Python loops (``while True: pass``) that this script starts for each
condition and kills after it (on SIGTERM and Ctrl-C too); each also ends by itself once this script is gone or after
--busy-limit seconds, so none outlives a killed run. A busy process that ended before its condition did (--busy-limit
too short) is an error: that condition was not measured beside it. The conditions take turns --cycles times (quiet,
one busy, two busy, quiet, ...), so that whatever else the machine does while the script runs falls on every
condition alike.

Within a condition, for each (b, N), the paths take turns round by round (their order reversed every other round):
each round times every path over at least --window seconds (whole calls, at least one) and divides each path's time
per call by SDPA's in the same round. Per path the script prints the median of those per-round ratios, its
bootstrap 95% interval (vit_einops.bench.paired) and the lowest and highest round, beside the load averages before
and after. Paths: ``sdpa`` (the reference), ``chunked`` (chunked_attention as it runs by default) and
``chunked-in-turn`` (the path's blocks one after another, each op split between torch's threads: how it runs with
dropout; --in-turn adds it). Forward only, float32, no grad.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

from vit_einops.base.io import write_file
from vit_einops.base.text import printable
from vit_einops.bench.busy import (
    BUSY_LIMIT_S, Terminated, add_out_arguments, check_busy, guarded, start_busy, stop,
)  # fmt: skip
from vit_einops.bench.env import machine_info
from vit_einops.bench.names import RANGES
from vit_einops.bench.paired import paired_ratio
from vit_einops.commands.bench import list_arg, number_arg
from vit_einops.network.chunk_plan import chunk_elements, plan_for
from vit_einops.network.chunked import _chunked_forward, chunked_attention

MAX_BUSY = 256  # busy processes per condition: past a few per core it measures the scheduler, not the paths


def paths(q, k, v, in_turn: bool) -> dict:
    """name -> a call computing softmax(q k^T / sqrt(D_h)) v; "sdpa" first (the reference)."""
    b, h, n, d = q.shape
    scale = d**-0.5
    fns = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "chunked": lambda: chunked_attention(q, k, v, scale=scale),
    }
    if in_turn:
        plan = plan_for(q, n, chunk_elements())
        q_, k_, v_ = (t.reshape(b * h, n, d) for t in (q, k, v))
        fns["chunked-in-turn"] = lambda: _chunked_forward(q_, k_, v_, None, plan, scale, 0.0, 0)
    return fns


def per_call_s(fn, window: float) -> float:
    """Seconds per call of ``fn``, over whole calls filling at least ``window`` seconds (at least one call)."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return elapsed / calls


def rounds_of(fns: dict, rounds: int, window: float) -> dict[str, list[float]]:
    """Each path's seconds per call in each round, the paths taking turns (reversed every other round)."""
    for fn in fns.values():
        fn()  # warm-up: allocations, the plan's cache, the worker threads
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[name].append(per_call_s(fns[name], window))
    return times


def summary(times: dict[str, list[float]]) -> dict:
    """Per path: the paired ratio to SDPA (median of the rounds' ratios, 95% interval) and the rounds' range."""
    ref = times["sdpa"]
    out = {"sdpa_ms": sorted(ref)[len(ref) // 2] * 1e3}
    for name, ts in times.items():
        if name != "sdpa":
            ratios = [t / s for t, s in zip(ts, ref, strict=True)]
            p = paired_ratio(ts, ref)
            out[name] = dict(ratio=p.ratio, low=p.low, high=p.high, min=min(ratios), max=max(ratios), rounds=ratios)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=list_arg(int, name="batches"), default=(1, 8))
    parser.add_argument("--tokens", type=list_arg(int, name="tokens"), default=(577, 1025))
    parser.add_argument("--heads", type=number_arg("heads", int), default=12)
    parser.add_argument("--head-dim", type=number_arg("head_dim", int, RANGES["head_dims"]), default=64)
    parser.add_argument(
        "--busy",
        type=list_arg(int, name="busy", bounds=(0, MAX_BUSY)),
        default=(0, 1, 2),
        help="busy processes beside the run, per condition",
    )
    parser.add_argument(
        "--cycles", type=number_arg("cycles", int, (1, 1000)), default=2, help="times the conditions take turns"
    )
    parser.add_argument(
        "--rounds", type=number_arg("rounds", int), default=6, help="rounds per (condition, b, N) in each cycle"
    )
    parser.add_argument(
        "--window",
        type=number_arg("window", float, RANGES["min_run_time"]),
        default=0.05,
        help="seconds each path is timed for per round",
    )
    parser.add_argument(
        "--busy-limit",
        type=number_arg("busy_limit", float, BUSY_LIMIT_S),
        default=600.0,
        help="seconds a busy process lives at most",
    )
    parser.add_argument("--in-turn", action="store_true", help="also time the blocks in turn, ops on all threads")
    add_out_arguments(parser, "every number")
    args = parser.parse_args(argv)
    try:
        with guarded(args.out, args.force):
            record = measure(args)
            if args.out:
                write_file(args.out, (json.dumps(record, indent=1) + "\n").encode(), replace=args.force)
    except (OSError, ValueError) as error:
        parser.error(printable(error))
    except Terminated as signal_name:  # the busy processes were stopped on the way here
        print(f"{parser.prog}: stopped by {signal_name}; its busy processes were ended", file=sys.stderr)
        return 128 + signal.SIGTERM
    return 0


def measure(args: argparse.Namespace) -> dict:
    """Every condition, cycle and shape as ``args`` say; prints the table and returns the record of every number."""
    info = machine_info()
    print(f"{info['cpu_model']}  threads {info['threads']}  torch {info['torch']}  load {os.getloadavg()}", flush=True)
    g = torch.Generator().manual_seed(0)
    shapes = [(b, n) for b in args.batches for n in args.tokens]
    inputs = {s: [torch.randn(s[0], args.heads, s[1], args.head_dim, generator=g) for _ in range(3)] for s in shapes}
    times: dict = {}
    loads: dict = {}
    with torch.inference_mode():
        for _ in range(args.cycles):
            for busy in args.busy:
                started = time.monotonic()
                processes = start_busy(busy, args.busy_limit)
                try:
                    if busy:
                        time.sleep(0.2)  # the busy loops running before the first round
                    for shape in shapes:
                        before = os.getloadavg()[0]
                        run = rounds_of(paths(*inputs[shape], args.in_turn), args.rounds, args.window)
                        for name, ts in run.items():
                            times.setdefault((busy, shape), {}).setdefault(name, []).extend(ts)
                        loads.setdefault((busy, shape), []).append((round(before, 2), round(os.getloadavg()[0], 2)))
                    check_busy(processes, args.busy_limit, time.monotonic() - started)
                finally:
                    stop(processes)
    rows = []
    print(f"{'busy':>4}{'b':>3}{'N':>6}{'sdpa ms':>9}  path: median of per-round ratios [95% interval] (range); loads")
    for (busy, (b, n)), run in times.items():
        row = dict(busy=busy, batch=b, tokens=n, loads=loads[busy, (b, n)], **summary(run))
        rows.append(row)
        cells = "  ".join(
            f"{name} {row[name]['ratio']:.2f}x [{row[name]['low']:.2f}, {row[name]['high']:.2f}] "
            f"({row[name]['min']:.2f}-{row[name]['max']:.2f})"
            for name in run
            if name != "sdpa"
        )
        print(f"{busy:>4}{b:>3}{n:>6}{row['sdpa_ms']:>9.1f}  {cells}  load {row['loads']}", flush=True)
    return {"meta": info, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}


if __name__ == "__main__":
    sys.exit(main())
