"""`vit-einops predict MODEL IMAGE... [--top-k K] [--json]`: the top classes of each image, through the model's
own preprocessing. An image that cannot be read is named on its own stderr line, the others are still predicted,
and the exit status is 2."""

from __future__ import annotations

import argparse
import json

from ._model import add_model_arguments, load_model_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any size and mode)")
    parser.add_argument("--top-k", type=int, default=5, help="classes shown per image (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per image) instead of a table")


def run(args: argparse.Namespace) -> int:
    import sys

    from ..base.checks import check_positive_int
    from ..base.text import printable
    from ..base.threads import follow_free_cores, threads_summary
    from ..images import open_image
    from ..prediction import predict

    check_positive_int("--top-k", args.top_k)
    model = load_model_from_args(args)
    # One unreadable file costs its own result, not every image's: each is named on its own stderr line.
    opened, failed = {}, []
    for image in args.images:
        try:
            opened[image] = open_image(image)
        except ValueError as err:
            failed.append(f"vit-einops predict: error: {printable(err)}")
    follow_free_cores()
    results = predict(model, list(opened.values()), top_k=args.top_k) if opened else []
    if args.json:
        print(
            json.dumps(
                [{"image": image, "top": [p._asdict() for p in top]} for image, top in zip(opened, results)],
                indent=1,
            )
        )
    else:
        # File and class names are data: printed with control characters escaped, so none can forge a result line.
        for image, top in zip(opened, results):
            print(printable(image))
            for p in top:
                index = "" if model.class_names is None else f"  ({p.index})"
                print(f"  {p.probability:7.2%}  {printable(p.label)}{index}")
    for line in failed:
        print(line, file=sys.stderr)
    if opened:  # the summary, on stderr: stdout is the predictions (JSON with --json), for scripts
        print(threads_summary(), file=sys.stderr)
    return 2 if failed else 0
