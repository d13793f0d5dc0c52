"""`vit-einops faithfulness MODEL [--images DIR] [--methods NAME[:KEY=VALUE,...] ...] --out DIR`: how faithful each
explanation method's maps are to the model: deletion and insertion AUC (RISE), positive and negative perturbation
AUC (Chefer et al.), beside the random map, each a mean over the images with a 95% interval
(:mod:`vit_einops.inspect.faithfulness` states the convention).

The table goes to stdout; --out DIR receives faithfulness.json (the convention, every image's AUCs, the mean curves)
and faithfulness.png (the mean curves), written as one unit. Images go through the model's own preprocessing.
Without --images, a model trained on the digits is scored on the first --num-images test digits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ._model import (
    add_images_argument,
    add_model_arguments,
    add_target_arguments,
    files_read_by_model,
    image_files,
    is_digits_model,
    load_model_from_args,
)

OUT_FILES = frozenset(("faithfulness.json", "faithfulness.png"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_images_argument(parser, "default for a digits model: the test digits")
    parser.add_argument(
        "--num-images", type=int, default=100, help="score at most this many images (default %(default)s)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        metavar="NAME[:KEY=VALUE,...]",
        help="explanation methods and their parameters, e.g. relevance rollout:head_fusion=max (default: every "
        "method); the random map is always scored beside them",
    )
    parser.add_argument(
        "--steps", type=int, help="deletion's and insertion's steps, 1 to the patches (default: one patch a step)"
    )
    parser.add_argument(
        "--baseline",
        choices=("mean", "zero"),
        default="mean",
        help="what a removed patch becomes in the model's input: each channel's mean over the images, or 0 "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="perturbed copies per forward pass (default %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="ties in the maps, the random map, the intervals (default %(default)s)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="where faithfulness.json and .png go")
    parser.add_argument("--force", action="store_true", help="replace an earlier faithfulness report in --out")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar (none either when stderr is no TTY)")
    add_target_arguments(parser)


def parse_method(text: str) -> tuple[str, dict[str, Any]]:
    """ "rollout:head_fusion=max,residual=0.5" -> ("rollout", {"head_fusion": "max", "residual": 0.5}); a value is
    an int, else a float, else the string."""
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--methods {text!r}: expected NAME or NAME:KEY=VALUE,... (e.g. rollout:head_fusion=max)")
        params[key.strip()] = _value(value.strip())
    return name.strip(), params


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def run(args: argparse.Namespace) -> int:
    from ..base.checks import check_positive_int
    from ..base.io import check_output, output_lock

    check_positive_int("--num-images", args.num_images)
    methods = [parse_method(text) for text in args.methods] if args.methods else None
    check_output(args.out, [*files_read_by_model(args.model, args.source), *([args.images] if args.images else [])])
    with output_lock(args.out, parents=True):  # held from the first check to the commit
        return _faithfulness(args, methods)


def _faithfulness(args: argparse.Namespace, methods: Any) -> int:
    import json

    from ..base.io import atomic_write_bytes, check_directory_output, staged_directory
    from ..base.plot import save_figure
    from ..base.text import printable
    from ..base.threads import follow_free_cores, threads_summary
    from ..inputs import model_inputs as batch_of
    from ..inspect.faithfulness import chosen_methods, faithfulness
    from ._model import target_from_args

    check_directory_output(args.out, OUT_FILES, args.force)  # before the work; checked again at the commit
    chosen_methods(methods)  # an unknown method or parameter is refused before any model loads
    files = image_files(args.images)[: args.num_images] if args.images else None
    target = target_from_args(args)  # a bad target file is refused before any model loads
    model = load_model_from_args(args).eval()
    if files is not None:
        images = batch_of(model, files)
    elif is_digits_model(model):
        from ..train.data import load_digits

        # raw pixels in [0, 1], as the model was trained on them (preprocessed when it records no preprocessing)
        pixels = load_digits()[1].images[: args.num_images]
        images = batch_of(model, pixels, preprocessed=model.preprocessing is None)
    else:
        raise ValueError("give --images DIR: only a model trained on the digits has default images (the test digits)")
    follow_free_cores()
    start, cpu = time.perf_counter(), time.process_time()
    result = faithfulness(
        model, images, methods, target, preprocessed=True, steps=args.steps, baseline=args.baseline,
        batch_size=args.batch_size, seed=args.seed, progress=not args.no_progress and sys.stderr.isatty(),
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    report = json.dumps(result.to_json() | {"seconds": seconds, "cpu_seconds": cpu}, indent=1) + "\n"
    with staged_directory(args.out, owned=OUT_FILES, replace=args.force) as staging:
        atomic_write_bytes(staging / "faithfulness.json", report.encode(), replace=False)
        save_figure(result.plot(), staging / "faithfulness.png", replace=False)
    for line in result.table().splitlines():
        print(printable(line))
    print(
        f"{seconds:.1f} s ({cpu:.1f} s of CPU) for {result.images} images, {threads_summary()}; written to "
        f"{printable(args.out)}"
    )
    return 0
