"""What the probe sites cost when nobody probes: a tiny ViT's forward on this checkout against another checkout.

    git worktree add /tmp/before <commit without probe sites>
    python benchmarks/probe_overhead.py --baseline /tmp/before --rounds 20 --out probe_overhead.json

Each round runs one short process per checkout (their order reversed every other round), each timing the same
model's forward (same config, seed and input) with torch.utils.benchmark's blocked_autorange over --min-run-time
seconds, and divides this checkout's median per call by the baseline's of the same round. Prints the median of the
per-round ratios with its bootstrap 95% interval (vit_einops.bench.paired) beside the absolute times. float32, no
grad, one thread, einsum kernel (the sdpa and chunked kernels run through the same sites).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import torch, torch.utils.benchmark as tb
from vit_einops import ViT
torch.set_num_threads(1)
torch.manual_seed(0)
model = ViT(image_size=32, patch_size=8, dim=48, depth={depth}, heads=4, mlp_dim=96, num_classes=5).eval()
x = torch.randn({batch}, 3, 32, 32)
with torch.inference_mode():
    timer = tb.Timer("model(x)", globals=dict(model=model, x=x))
    print(timer.blocked_autorange(min_run_time={min_run_time}).median)
"""


def time_forward(checkout: Path, args: argparse.Namespace) -> float:
    """The median seconds per forward of the tiny ViT, with ``checkout``'s vit_einops imported."""
    code = CHILD.format(depth=args.depth, batch=args.batch, min_run_time=args.min_run_time)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if result.returncode:
        raise SystemExit(f"{checkout}: {result.stderr.strip().splitlines()[-1]}")
    return float(result.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the package without probe sites")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the rounds as JSON here")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    from vit_einops.base.io import atomic_write_bytes
    from vit_einops.bench.paired import paired_ratio

    times: dict[str, list[float]] = {"probes": [], "baseline": []}
    for i in range(args.rounds):
        order = [("probes", here), ("baseline", args.baseline)]
        for name, checkout in order if i % 2 == 0 else order[::-1]:
            times[name].append(time_forward(checkout, args))
    ratio = paired_ratio(times["probes"], times["baseline"])
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    load = os.getloadavg()
    print(f"forward of a tiny ViT (depth {args.depth}, batch {args.batch}), {args.rounds} rounds, load {load}")
    print(f"  baseline {median['baseline'] * 1e6:.1f} us   with probe sites {median['probes'] * 1e6:.1f} us")
    print(f"  ratio {ratio.ratio:.3f} (95% interval {ratio.low:.3f} .. {ratio.high:.3f})")
    if args.out:
        record = {"times": times, "ratio": ratio.ratio, "low": ratio.low, "high": ratio.high, "depth": args.depth}
        atomic_write_bytes(args.out, json.dumps(record, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
