"""`vit-einops explore MODEL [MODEL_B] [--image IMG...] --out explore.html`: one self-contained HTML page to study a
model's attention interactively (layer, head, query patch, prefix tokens, rollout, relevance, every explanation
method with the parameters --rollout-fusion, --discard-ratio and --start-layer choose, DINO's mask, per-head
statistics), or two models' side by side on the same images.

MODEL is read as every command reads it (a model file, a training run, or with --from a torchvision/timm/HF
model; the reading and preprocessing flags apply to both models); images go through each model's own
preprocessing, and each pane shows them as its model saw them (resized and cropped, not normalised). Without
--image FILE or --images DIR: test digits for a model trained on the digits, else scikit-learn's two photos.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..base.text import printable
from ._model import (
    add_images_argument,
    add_method_arguments,
    add_model_arguments,
    add_target_arguments,
    default_images,
    files_read_by_model,
    image_files,
    is_digits_model,
    load_model_from_args,
    method_params_from_args,
    target_from_args,
    training_run,
)

DIGIT_IMAGES = 4  # test digits 0..3: a small model, a small page


def _size(text: str) -> int:
    """argparse type of --attention-budget: a size such as 24MB or 8MiB."""
    from ..base.budget import parse_bytes

    return parse_bytes(text, "--attention-budget")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="a vit-einops model file (.safetensors), a training run or checkpoint directory, a torchvision/timm "
        "weights file or a Hugging Face directory; a second MODEL is shown beside the first, on the same images",
    )
    add_model_arguments(parser, positional=False)
    parser.add_argument("--image", action="append", metavar="FILE", help="an image to explore (repeatable)")
    add_images_argument(parser, "explored after any --image")
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
    parser.add_argument(
        "--attention-budget",
        type=_size,
        metavar="SIZE",
        help="bytes of attention codes each model's pane may hold, e.g. 8MB (default 24MB): where every "
        "head's row of every query does not fit, the page keeps the mean of heads and the prefix tokens' rows, and "
        "says what it left out",
    )
    add_target_arguments(parser)
    add_method_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..base.io import check_output, output_lock

    if len(args.models) > 2:
        raise ValueError(f"explore shows one MODEL or two side by side, got {len(args.models)}")
    inputs = [path for model in args.models for path in files_read_by_model(model, args.source)]
    check_output(args.out, [*inputs, *(args.image or ()), *([args.images] if args.images else [])])
    with output_lock(args.out):  # held from the first check to the commit: a second writer fails at once
        return _explore(args)


def pane_name(path: str, source: str | None) -> str:
    """What a pane is titled: a training run's folder name (MODEL being the run, its checkpoint/ or its model file,
    whose own names are the same for every run), else MODEL's file or folder name."""
    run = training_run(path, source)
    return (run or Path(os.path.abspath(path))).name  # "." named by the folder it is


def _explore(args: argparse.Namespace) -> int:
    from ..base.io import check_file_output
    from ..base.threads import follow_free_cores, threads_summary
    from ..explore.page import check_explorer_memory, explorer_pane, write_panes
    from ..explore.payload import DEFAULT_ATTENTION_BUDGET
    from ..images import to_uint8

    if Path(args.out).is_dir():  # inspect's --out is a folder; explore's is the one page it writes
        page = Path(args.out) / "explore.html"
        raise ValueError(f"--out {args.out} is a folder; explore writes one HTML page: name it, e.g. --out {page}")
    check_file_output(args.out, args.force, "pass --force to replace it")  # before the work; again at the commit
    files = [*(args.image or ()), *(image_files(args.images) if args.images else ())]
    target = target_from_args(args)  # a bad target file is refused before any model loads
    method_params = method_params_from_args(args)
    models = [load_model_from_args(args, path).eval() for path in args.models]
    if not files and len({is_digits_model(model) for model in models}) > 1:
        raise ValueError(
            f"{args.models[0]} and {args.models[1]} have different default images (test digits for a digits model, "
            "sample photos otherwise): give --image FILE or --images DIR to explore both on the same images"
        )
    chosen = [default_images(model, files, DIGIT_IMAGES) for model in models]
    titles = chosen[0]["titles"]
    budget = args.attention_budget or DEFAULT_ATTENTION_BUDGET
    check_explorer_memory(  # the whole run's peak, before any pane is built
        [(model, len(images["inputs"]), images["inputs"].shape[-2:]) for model, images in zip(models, chosen)],
        top_k=args.top_k,
        target=target,
        budget=budget,
    )
    panes = []
    for path, model, images in zip(args.models, models, chosen, strict=True):
        follow_free_cores()
        panes.append(
            explorer_pane(
                model,
                images["inputs"],
                name=pane_name(path, args.source),
                preprocessed=True,
                class_names=model.class_names,
                pictures=[to_uint8(picture) for picture in images["display"]],
                top_k=args.top_k,
                bits=args.bits,
                target=target,
                method_params=method_params,
                attention_budget=budget,
            )
        )
    path = write_panes(panes, args.out, titles=titles, bits=args.bits, overwrite=args.force)
    both = ", 2 models side by side" if len(models) == 2 else ""
    over = "; some attention rows left out (over --attention-budget), as the page says" if any(
        pane["left_out"] for pane in panes
    ) else ""
    print(f"explorer: {printable(path)} ({path.stat().st_size / 1e6:.2f} MB, {len(titles)} images{both}{over}); "
          f"{threads_summary()}")
    return 0
