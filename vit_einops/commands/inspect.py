"""`vit-einops inspect MODEL [--image IMG...]`: attention maps, rollout, every explanation method (rollout with
--rollout-fusion and --discard-ratio, gradient rollout, relevance from --start-layer, Grad-CAM), attention
distance, position similarity, embedding filters, the prefix tokens' attention share, token norms and DINO's view
(the last layer's class attention per head and the patches holding 60% of it) of any ViT (a model file, a training
run, or with --from a torchvision/timm/HF model), class, distillation and register tokens named, as PNG figures and
raw arrays.

Images (--image FILE, --images DIR) go through the model's own preprocessing; no training data is read when images
are given. Without them, a model trained on the digits is shown test digits, and any other model scikit-learn's two
photos.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from ._model import (
    add_images_argument,
    add_method_arguments,
    add_model_arguments,
    add_target_arguments,
    default_images,
    files_read_by_model,
    image_files,
    load_model_from_args,
    method_params_from_args,
    target_from_args,
    training_run,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, optional=True)
    parser.add_argument("--checkpoint", metavar="CKPT", help="same as MODEL (the older spelling)")
    parser.add_argument("--image", action="append", metavar="FILE", help="an image to draw attention for (repeatable)")
    add_images_argument(parser, "drawn after any --image, at most --num-images of them")
    parser.add_argument("--layer", type=int, default=-1, help="the layer whose heads are drawn (default: the last)")
    parser.add_argument(
        "--num-images",
        type=int,
        default=6,
        help="images drawn from --images DIR, or test digits when no image is given (default %(default)s)",
    )
    parser.add_argument(
        "--distance-images",
        type=int,
        default=512,
        help="test digits the mean attention distance averages over (default %(default)s)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where to write the figures (default: a training run's inspect/; for any other MODEL, NAME-inspect in "
        "the current directory, never inside or beside MODEL)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an earlier report in --out (a folder holding other files never)"
    )
    parser.add_argument(
        "--arrays",
        choices=("figures", "full", "none"),
        default="figures",
        help="what arrays.npz holds: figures, the arrays the figures draw (default; small); full, also every "
        "layer's attention maps, float32 (layers x images x heads x tokens^2 x 4 bytes: 540 MB for one image of "
        "DINOv2-S at 518 px); none, no arrays.npz",
    )
    add_target_arguments(parser)
    add_method_arguments(parser)


def default_out(model_path: Path, source: str | None = None) -> Path:
    """Where the report goes without --out: a training run's own inspect/ folder (MODEL being the run, its
    checkpoint/, checkpoint/checkpoint.json or the run's model.safetensors); for any other MODEL, NAME-inspect in the
    current directory, NAME being the file's stem or the folder's name. Any other MODEL is an input, often one in a
    hub or torch.hub cache, so nothing is written inside or beside it unless --out says so."""
    run = training_run(model_path, source)
    if run is not None:
        return run / "inspect"
    absolute = Path(os.path.abspath(model_path))  # "." and ".." named by the folder they are
    name = absolute.name if absolute.is_dir() else absolute.stem
    return Path(f"{name or 'model'}-inspect")


def run(args: argparse.Namespace) -> int:
    from ..base.checks import check_positive_int
    from ..base.io import check_output, output_lock

    if (args.model is None) == (args.checkpoint is None):
        raise ValueError("give the model once: vit-einops inspect MODEL (or --checkpoint MODEL)")
    path = Path(args.model or args.checkpoint)
    check_positive_int("--num-images", args.num_images)
    check_positive_int("--distance-images", args.distance_images)
    out = Path(args.out) if args.out else default_out(path, args.source)
    folder = [args.images] if args.images else []
    try:
        check_output(out, [*files_read_by_model(path, args.source), *(args.image or ()), *folder])
    except ValueError as err:
        if args.out:
            raise
        raise ValueError(f"{err}, with --out DIR (this is the default output for MODEL)") from None
    with output_lock(out, parents=True):  # held from the first check to the commit: a second writer fails at once
        return _inspect(args, path, out)


def _inspect(args: argparse.Namespace, path: Path, out: Path) -> int:
    from ..base.io import check_directory_output
    from ..base.text import printable
    from ..inspect import write_report
    from ..base.budget import check_peak_memory, format_bytes
    from ..base.threads import follow_free_cores, threads_summary
    from ..inspect.methods import TARGET_NEEDED, unexplained
    from ..inspect.report import REPORT_FILES, attention_maps_bytes, report_memory

    check_directory_output(out, REPORT_FILES, args.force)  # before the work; checked again at the commit
    files = [*(args.image or ()), *(image_files(args.images)[: args.num_images] if args.images else ())]
    target = target_from_args(args)  # a bad target file is refused before any model loads
    method_params = method_params_from_args(args)
    model = load_model_from_args(args, str(path))
    depth = model.config.depth
    if not -depth <= args.layer < depth:
        raise ValueError(f"--layer {args.layer} is out of range for a model of {depth} layers (0..{depth - 1}, or -1)")
    images = default_images(model, files, args.num_images, args.distance_images)
    # Every layer's attention of every image is recorded at once, (depth, b, h, n, n): the run's peak, before it.
    b = len(images["inputs"])
    config = replace(model.config, image_size=tuple(images["inputs"].shape[-2:]))
    check_peak_memory(
        report_memory(config, b, target=target is not None, arrays=args.arrays),
        f"inspect of {b} image{'s' * (b > 1)} at {config.num_tokens:,} tokens",
    )
    follow_free_cores()
    paths = write_report(
        model,
        images["inputs"],
        out,
        distance_images=images["distance"],
        titles=images["titles"],
        classes=model.class_names,
        layer=args.layer,
        display_images=images["display"],
        overwrite=args.force,
        target=target,
        method_params=method_params,
        arrays=args.arrays,
    )
    # What a figure leaves out is said where the files are listed, as the figure says it. arrays.npz can be the
    # largest file by far: its size is said, and what --arrays would change.
    notes = {}
    left_out = unexplained(model, target)
    if left_out:
        notes["methods"] = f" (without {', '.join(left_out)}: they {TARGET_NEEDED})"
    if not model.patch_embed.layout(config.image_size).prefix:
        notes["prefix_share"] = " (a note only: this model has no prefix tokens, no class token nor registers)"
    if "arrays" in paths:
        left_out = f"; --arrays full adds every layer's attention maps, {format_bytes(attention_maps_bytes(config, b))}"
        notes["arrays"] = f" ({format_bytes(paths['arrays'].stat().st_size)}{left_out * (args.arrays != 'full')})"
    for name, path in paths.items():
        print(f"{name:>20}: {printable(path)}{notes.get(name, '')}")
    if "arrays" not in paths:
        print(f"{'arrays':>20}: none written (--arrays none)")
    print(threads_summary())
    return 0
