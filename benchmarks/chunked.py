"""The chunked attention path against SDPA and against its own floor: where its time goes, grid point by grid point.

    python benchmarks/chunked.py --threads 1                   # b 1,8,32; N 50,197,577,1025; fwd and fwd+bwd
    python benchmarks/chunked.py --threads 2 --batches 1,8 --budgets 32768,131072,1048576   # block-size sweep

For each (b, N, mode) it times, interleaved (torch.utils.benchmark, the paths taking turns): SDPA, the chunked
path at its default block size (and at each --budgets size), and the chunked path's *floor*: its block products
and softmax timed one at a time on the same block shapes, each on hot buffers with no Python between them,
summed over the blocks of the plan. The floor is what an unfused GEMM + softmax + GEMM sequence costs on this
machine; chunked / floor is the overhead of the path itself (Python, slicing, the loop), floor / SDPA is the
price of not fusing the softmax into the products, which no unfused path can get under.

Forward floor per block: S = q k^T (baddbmm, K = D_h), softmax in place, A v (bmm). Forward + backward adds
per block: S again and its softmax (not when the path keeps A: one block and N <= D_h), dv += A^T dO,
dP = dO v^T, dS = A (dP - delta) (two elementwise passes), dq = dS k, dk += dS^T q; and once per call:
delta = rowsum(dO * O).

Forward rows also time the "loop": the path's products and softmax over its real blocks with every view made in
advance, so the data moves as in the path but no Python runs between ops; chunked / loop is the Python alone, and
loop / floor what reading the real blocks from memory adds to the hot-block floor.

Every row carries the load average, the cores other processes used while it was timed (CPU time from /proc/stat;
the load average alone can read ~1 on an idle virtual machine) and the IQR/median of each timing;
vit_einops.bench.noise flags noisy rows (by CPU time where /proc/stat can be read, else by the load).
Writes a JSON file (--out) with every number. Model: 12 heads, D_h 64, float32 unless told otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from vit_einops.base.io import atomic_write_bytes
from vit_einops.bench.env import machine_info
from vit_einops.bench.measure import time_interleaved
from vit_einops.bench.noise import LoadProbe, NoiseVerdict, judge
from vit_einops.network.chunk_plan import default_chunk_elements, plan_for
from vit_einops.network.chunked import chunked_attention


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(",") if s.strip())


def floor_calls(q, k, v, grad_out, budget: int, backward: bool) -> dict[str, tuple[object, int]]:
    """name -> (a call running one op on one block shape, how many blocks of that shape the plan has)."""
    b, h, n, d = q.shape
    m = k.shape[2]
    scale = d**-0.5
    plan = plan_for(q, m, budget)  # the blocks chunked_attention cuts
    q_, k_, v_, do_ = (t.reshape(b * h, -1, t.shape[-1]) for t in (q, k, v, grad_out))
    shapes = collections.Counter(zip(plan.rows, plan.queries))
    calls = {}
    for (g, c), count in shapes.items():
        qb, kb, vb, dob = q_[:g, :c], k_[:g], v_[:g], do_[:g, :c]
        s, ds = torch.empty(g, c, m), torch.empty(g, c, m)
        o, gq, gk, gv = torch.empty(g, c, d), torch.empty(g, c, d), torch.zeros(g, m, d), torch.zeros(g, m, d)
        delta = torch.randn(g, c, 1)
        torch.softmax(torch.baddbmm(s, qb, kb.transpose(1, 2), beta=0, alpha=scale, out=s), -1, out=s)
        tag = f"{g}x{c}x{m}"
        ops = {
            "qk": lambda qb=qb, kb=kb, s=s: torch.baddbmm(s, qb, kb.transpose(1, 2), beta=0, alpha=scale, out=s),
            "softmax": lambda s=s: torch.softmax(s, -1, out=s),
            "av": lambda s=s, vb=vb, o=o: torch.bmm(s, vb, out=o),
        }
        if backward:
            ops |= {
                "dv": lambda s=s, dob=dob, gv=gv: gv.baddbmm_(s.transpose(1, 2), dob),
                "dp": lambda dob=dob, vb=vb, ds=ds: torch.bmm(dob, vb.transpose(1, 2), out=ds),
                "ds": lambda ds=ds, s=s, delta=delta: ds.sub_(delta).mul_(s),
                "dq": lambda ds=ds, kb=kb, gq=gq: torch.baddbmm(gq, ds, kb, beta=0, alpha=scale, out=gq),
                "dk": lambda ds=ds, qb=qb, gk=gk: gk.baddbmm_(ds.transpose(1, 2), qb, alpha=scale),
            }
        # Backward recomputes qk and softmax (those blocks count twice), unless the path keeps A: one block and
        # m <= d (chunked.py's _ChunkedAttention).
        recompute = backward and not (len(plan.blocks) == 1 and m <= d)
        for op, fn in ops.items():
            calls[f"floor/{op}@{tag}"] = (fn, count * (2 if recompute and op in ("qk", "softmax") else 1))
    if backward:
        out = torch.empty_like(grad_out)
        calls["floor/delta"] = (lambda: (grad_out * out).sum(-1, keepdim=True), 1)
    return calls


def forward_loop(q, k, v, budget: int):
    """The chunked forward's products and softmax over the plan's real blocks, with every block's views made in
    advance: what the path costs with the data moving as it does but no Python between the ops. Unlike the floor
    (hot blocks) it pays for reading q, k, v from memory; chunked / loop is the Python and view-making alone."""
    b, h, n, d = q.shape
    plan = plan_for(q, n, budget)
    q_, k_, v_ = (t.detach().reshape(b * h, n, d) for t in (q, k, v))
    out = torch.empty_like(q_)
    buffer = plan.scores_buffer(q_, n)
    blocks = list(
        zip(
            plan.query_blocks(q_),
            plan.key_blocks(k_.transpose(1, 2)),
            plan.key_blocks(v_),
            plan.query_blocks(out),
            plan.score_blocks(buffer, n),
        )
    )
    scale = d**-0.5

    def run():
        for q_block, k_t, v_block, out_block, scores in blocks:
            torch.baddbmm(scores, q_block, k_t, beta=0.0, alpha=scale, out=scores)
            torch.softmax(scores, dim=-1, out=scores)
            torch.bmm(scores, v_block, out=out_block)

    return run


def measure(b, n, mode, args, probe: LoadProbe) -> dict:
    h, d = args.heads, args.head_dim
    block = default_chunk_elements()  # for the --threads set now, whatever chunk_plan.chunk_elements() planned first
    g = torch.Generator().manual_seed(0)
    backward = mode == "forward_backward"
    q, k, v = (torch.randn(b, h, n, d, generator=g).requires_grad_(backward) for _ in range(3))
    grad_out = torch.randn(b, h, n, d, generator=g)

    def step(fn):
        if not backward:
            return fn
        return lambda: torch.autograd.grad(fn(), (q, k, v), grad_out)

    paths = {
        "sdpa": step(lambda: F.scaled_dot_product_attention(q, k, v)),
        "chunked": step(lambda: chunked_attention(q, k, v, scale=d**-0.5, max_elements=block)),
    }
    for budget in args.budgets:
        paths[f"chunked@{budget}"] = step(
            lambda budget=budget: chunked_attention(q, k, v, scale=d**-0.5, max_elements=budget)
        )
    with torch.no_grad():
        floor = floor_calls(q.detach(), k.detach(), v.detach(), grad_out, block, backward)
    fns = dict(paths) | {name: fn for name, (fn, _) in floor.items()}
    if not backward:
        fns["loop"] = forward_loop(q, k, v, block)
    with torch.enable_grad() if backward else torch.inference_mode():
        start = probe.sample()
        timings = time_interleaved(fns, rounds=args.rounds, min_run_time=args.min_run_time)
        end = probe.sample()
    cpu = probe.cpu_use(start, end)
    row = dict(
        batch=b,
        tokens=n,
        mode=mode,
        load=[round(start.load, 2), round(end.load, 2)],
        others_cores=None if cpu is None else round(cpu.others_cores, 2),
    )
    sdpa = timings["sdpa"].median_s
    row["sdpa_ms"] = sdpa * 1e3
    for name in paths:
        row[f"{name}_ratio"] = timings[name].median_s / sdpa
        row[f"{name}_min_ratio"] = timings[name].min_s / timings["sdpa"].min_s
    floor_s = sum(timings[name].median_s * count for name, (_, count) in floor.items())
    floor_min_s = sum(timings[name].min_s * count for name, (_, count) in floor.items())
    row["floor_min_ratio"] = floor_min_s / timings["sdpa"].min_s
    row["chunked_over_floor_min"] = timings["chunked"].min_s / floor_min_s
    parts: dict[str, float] = {}
    for name, (_, count) in floor.items():
        op = name.split("/")[1].split("@")[0]
        parts[op] = parts.get(op, 0.0) + timings[name].median_s * count
    if "loop" in timings:
        row["loop_ratio"] = timings["loop"].median_s / sdpa
        row["loop_min_ratio"] = timings["loop"].min_s / timings["sdpa"].min_s
    row["floor_ratio"] = floor_s / sdpa
    row["chunked_over_floor"] = timings["chunked"].median_s / floor_s
    row["floor_parts_ms"] = {op: s * 1e3 for op, s in parts.items()}
    verdict: NoiseVerdict = judge(
        {name: timings[name] for name in paths}, (start.load, end.load), torch.get_num_threads(), cpu=cpu
    )
    row["noisy"] = verdict.noisy
    row["noise"] = verdict.reasons
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batches", type=ints, default=(1, 8, 32))
    parser.add_argument("--tokens", type=ints, default=(50, 197, 577, 1025))
    parser.add_argument("--modes", default="forward,forward_backward")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--budgets", type=ints, default=(), help="extra block sizes (scores) to time the path at")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-run-time", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for every number")
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")
    args = parser.parse_args(argv)
    if args.out and (args.out.exists() or args.out.is_symlink()) and not args.force:
        parser.error(f"--out {args.out} already exists; pass --force to replace it")
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info()
    probe = LoadProbe()
    print(
        f"{info['cpu_model']}  {info['cpu_capability']}  threads {info['threads']}  torch {info['torch']}  "
        f"default block {default_chunk_elements()} scores  load {info['load_average']}",
        flush=True,
    )
    extra = "".join(f"{'@' + str(bud):>10}" for bud in args.budgets)
    print(
        f"{'b':>3}{'N':>6} {'mode':<17}{'sdpa ms':>9}{'chunked':>9}{'floor':>8}{'ch/floor':>9}{extra}"
        f"{'min: chunked':>14}{'floor':>7}{'ch/floor':>9}  floor parts ms; load; others' cores; noise"
    )
    print("  (ratios to SDPA of medians; 'min:' the same of each path's fastest block, steadier on a shared machine)")
    rows = []
    for mode in args.modes.split(","):
        for b in args.batches:
            for n in args.tokens:
                r = measure(b, n, mode, args, probe)
                rows.append(r)
                sweep = "".join(f"{r[f'chunked@{bud}_ratio']:>10.2f}" for bud in args.budgets)
                parts = " ".join(f"{op} {ms:.2f}" for op, ms in r["floor_parts_ms"].items())
                print(
                    f"{b:>3}{n:>6} {mode:<17}{r['sdpa_ms']:>9.2f}{r['chunked_ratio']:>8.2f}x{r['floor_ratio']:>7.2f}x"
                    f"{r['chunked_over_floor']:>8.2f}x{sweep}{r['chunked_min_ratio']:>13.2f}x"
                    f"{r['floor_min_ratio']:>6.2f}x{r['chunked_over_floor_min']:>8.2f}x  {parts}; load {r['load']}"
                    + (f"; loop {r['loop_ratio']:.2f}x, min {r['loop_min_ratio']:.2f}x" if "loop_ratio" in r else "")
                    + f"; others {r['others_cores']}"
                    + (f"; NOISY: {'; '.join(r['noise'])}" if r["noisy"] else ""),
                    flush=True,
                )
    if args.out:
        record = {"meta": info, "default_block": default_chunk_elements(), "rows": rows}
        atomic_write_bytes(args.out, (json.dumps(record, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
