"""`vit-einops bench`: einsum, chunked and SDPA attention against each other and torch's layers, and whole models.

Writes table.txt, results.json, attention.csv, model.csv and PNG plots to --out (benchmarks/README.md has the schema).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..bench.names import DTYPES, MODEL_MODES, MODES, check_in_range, core_paths, layer_paths, model_paths
from ..presets import list_presets


def _checked(name: str, kind: type, value: str, bounds: tuple[float, float] | None = None):
    """Parse ``value`` as ``kind`` and check it is finite and within ``bounds`` (default RANGES[name]); argparse's
    error naming ``name`` and the value if not."""
    try:
        number = kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {value!r}"
        ) from None
    try:
        check_in_range(name, number, kind, bounds)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return number


def list_arg(kind, choices=None, name: str | None = None, bounds: tuple[float, float] | None = None):
    """argparse type: a comma-separated list of ints within ``bounds`` (default RANGES[name]; kind=int) or of names
    from ``choices``. The benchmarks/ scripts use it too."""

    def parse(text: str) -> tuple:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        if kind is int:
            return tuple(_checked(name, int, s, bounds) for s in items)
        unknown = [s for s in items if s not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; expected some of {', '.join(choices)}")
        return tuple(items)

    return parse


def number_arg(name: str, kind: type, bounds: tuple[float, float] | None = None):
    """argparse type: one ``kind`` within ``bounds`` (default RANGES[name]), finite. The benchmarks/ scripts use it
    too."""
    return lambda text: _checked(name, kind, text, bounds)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_mutually_exclusive_group()
    grid.add_argument(
        "--quick",
        action="store_const",
        dest="grid",
        const="quick",
        help="a small grid, well under a minute, no compile",
    )
    grid.add_argument(
        "--smoke",
        action="store_const",
        dest="grid",
        const="smoke",
        help="tiny shapes, one round, seconds (CI); numbers mean nothing",
    )
    parser.set_defaults(grid="default")
    parser.add_argument("--out", type=Path, help="output directory (default ./bench-results)")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (none either when stderr is no terminal)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an --out that holds an earlier run's files (one holding any other file is never replaced)",
    )
    parser.add_argument(
        "--device",
        help="cpu (default), cuda or cuda:N: CUDA events time the rounds, L2 is flushed between them",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="float32 (default); float16 and bfloat16 on a CPU with that dtype's matmul hardware, on CUDA "
        "float16 anywhere and bfloat16 from compute capability 8.0",
    )
    a = parser.add_argument_group("attention grid (comma-separated lists replace the grid's)")
    a.add_argument("--batches", type=list_arg(int, name="batches"), help="batch sizes (default 1)")
    a.add_argument("--tokens", type=list_arg(int, name="tokens"), help="tokens N (default 50,197,577,1025)")
    a.add_argument("--heads", type=list_arg(int, name="heads"), help="heads h (default 12)")
    a.add_argument("--head-dims", type=list_arg(int, name="head_dims"), help="head sizes D_h (default 64)")
    a.add_argument("--modes", type=list_arg(str, MODES), help=f"of {', '.join(MODES)}")
    a.add_argument(
        "--paths", dest="core_paths", type=list_arg(str, core_paths()), help=f"core paths, of {', '.join(core_paths())}"
    )
    a.add_argument(
        "--layer-paths", type=list_arg(str, layer_paths()), help=f"layer paths, of {', '.join(layer_paths())}"
    )
    a.add_argument(
        "--skip-layer", action="store_true", help="only the core section (no projections, no nn.MultiheadAttention)"
    )
    a.add_argument("--no-compile", action="store_true", help="do not torch.compile (the einsum path, flex_attention)")
    a.add_argument("--skip-attention", action="store_true", help="no attention grid")
    m = parser.add_argument_group("whole models")
    m.add_argument("--models", type=list_arg(str, list_presets()), help="presets (default vit_ti_16,vit_s_16,vit_b_16)")
    m.add_argument(
        "--model-batch", type=number_arg("model_batch", int), help="images per call (default 1; 32 is slow on 2 cores)"
    )
    m.add_argument("--model-modes", type=list_arg(str, MODEL_MODES), help=f"of {', '.join(MODEL_MODES)}")
    m.add_argument("--model-paths", type=list_arg(str, model_paths()), help=f"of {', '.join(model_paths())}")
    m.add_argument("--skip-model", action="store_true", help="no whole-model benchmark")
    t = parser.add_argument_group("timing")
    t.add_argument(
        "--rounds", type=number_arg("rounds", int), help="interleaved rounds of blocked_autorange per path (default 3)"
    )
    t.add_argument(
        "--min-run-time",
        type=number_arg("min_run_time", float),
        help="seconds per round and path, up to 60 (default 0.1)",
    )
    t.add_argument(
        "--retries",
        type=number_arg("retries", int),
        help="measure a grid point again, up to this often, while any of its rows is noisy (default 0)",
    )


def run(args: argparse.Namespace) -> int:
    from ..base.io import output_lock
    from ..bench.budget import check_grid_memory
    from ..bench.device import check_device, check_dtype
    from ..bench.runner import check_out, with_overrides
    from ..bench.runner import run as run_bench

    # The profiler that measures peak memory otherwise logs two lines to stderr on every use (kineto's USDT
    # level, 5); 6 silences kineto's log. Set before its first use; an explicit KINETO_LOG_LEVEL wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    options = with_overrides(
        args.grid,
        threads=args.threads,
        out=args.out,
        device=args.device,
        dtype=args.dtype,
        batches=args.batches,
        tokens=args.tokens,
        heads=args.heads,
        head_dims=args.head_dims,
        modes=args.modes,
        core_paths=args.core_paths,
        layer_paths=() if args.skip_layer else args.layer_paths,
        compile_skip_reason="skipped: --no-compile" if args.no_compile else None,
        attention=False if args.skip_attention else None,
        models=() if args.skip_model else args.models,
        model_batch=args.model_batch,
        model_modes=args.model_modes,
        model_paths=args.model_paths,
        rounds=args.rounds,
        min_run_time=args.min_run_time,
        retries=args.retries,
        force=args.force or None,
        progress=False if args.no_progress else None,
    )
    # Refused here, before the lock creates --out: a device without CUDA (when options were made), a bad --out, a
    # grid past the memory budget, a dtype the device has no hardware for (the matmul it measures is kept).
    check_out(options.out, options.force)
    check_grid_memory(options)
    check_dtype(options.dtype, check_device(options.device))
    out = Path(options.out)
    # A second bench into --out fails at once, naming this one; the lock records this run's temporaries, and taking
    # it removes those of an earlier killed run.
    with output_lock(out, parents=True):
        run_bench(options)
    return 0
