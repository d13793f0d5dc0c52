"""`vit-einops explore MODEL [--image IMG...] --out explore.html`: one self-contained HTML page to study a model's
attention interactively (layer, head, query patch, rollout, relevance, per-head statistics).

MODEL is read as every command reads it (a model file, a training run, or with --from a torchvision/timm/HF
model); images go through the model's own preprocessing, and the page shows them as the model saw them (resized
and cropped, not normalised). Without --image: test digits for a model trained on the digits, else scikit-learn's
two photos.
"""

from __future__ import annotations

import argparse

from .._text import printable
from ._model import add_model_arguments, default_images, load_model_from_args, model_inputs

DIGIT_IMAGES = 4  # test digits 0..3: a small model, a small page


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--image", action="append", metavar="FILE", help="an image to explore (repeatable)")
    parser.add_argument("--out", required=True, metavar="HTML", help="the page to write, e.g. explore.html")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument(
        "--top-k", type=int, default=5, help="top classes listed, each with a relevance map (default %(default)s)"
    )
    parser.add_argument(
        "--bits",
        type=int,
        default=8,
        help="bits per stored attention weight, 2..8: fewer make a smaller, coarser page (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from .._io import check_output, output_lock

    check_output(args.out, [*model_inputs(args.model, args.source), *(args.image or ())])
    with output_lock(args.out):  # held from the first check to the commit: a second writer fails at once
        return _explore(args)


def _explore(args: argparse.Namespace) -> int:
    from .._io import check_file_output
    from ..explore import write_explorer
    from ..images import to_uint8
    from ..sizes import check_forward_memory

    check_file_output(args.out, args.force, "pass --force to replace it")  # before the work; again at the commit
    model = load_model_from_args(args).eval()
    images = default_images(model, args.image, DIGIT_IMAGES)
    # The page holds every layer's attention of every image, quantised from a float64 copy.
    check_forward_memory(model.config, len(images["inputs"]), keep_attention=True, itemsize=8)
    inputs = images["inputs"]
    path = write_explorer(
        model,
        inputs,
        args.out,
        preprocessed=True,
        titles=images["titles"],
        class_names=model.class_names,
        pictures=[to_uint8(picture) for picture in images["display"]],
        top_k=args.top_k,
        bits=args.bits,
        overwrite=args.force,
    )
    print(f"explorer: {printable(path)} ({path.stat().st_size / 1e6:.2f} MB, {len(inputs)} images)")
    return 0
