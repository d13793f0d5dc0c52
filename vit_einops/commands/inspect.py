"""`vit-einops inspect --checkpoint CKPT`: attention maps, rollout, attention distance, position similarity and
embedding filters of a trained model, as PNG figures and raw arrays."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="CKPT",
        help="a checkpoint directory from `vit-einops train` (or its checkpoint.json)",
    )
    parser.add_argument(
        "--image",
        action="append",
        metavar="FILE",
        help="an image to draw attention for (repeatable; default: test images of the training data)",
    )
    parser.add_argument(
        "--num-images", type=int, default=6, help="test images drawn when no --image is given (default %(default)s)"
    )
    parser.add_argument(
        "--distance-images",
        type=int,
        default=512,
        help="test images the mean attention distance averages over (default %(default)s)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="where to write the figures (default: inspect/ beside the checkpoint)"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from .._checks import check_positive_int
    from ..inspect import write_report
    from ..train.checkpoint import load_checkpoint
    from ..train.data import load_image, load_split

    check_positive_int("--num-images", args.num_images)
    check_positive_int("--distance-images", args.distance_images)
    ckpt = load_checkpoint(args.checkpoint)
    model = ckpt.build_model()
    cfg = model.config
    out = Path(args.out) if args.out else ckpt.path.parent.parent / "inspect"
    data = ckpt.train_state.get("data") or {}
    test_set = load_split(data, cfg.image_size, cfg.in_channels)[1] if data else None
    classes = data.get("classes")
    if args.image:
        images = torch.stack([load_image(f, cfg.image_size, cfg.in_channels) for f in args.image])
        names = [Path(f).name for f in args.image]
    elif test_set is not None:
        # One image per class first, so the figure shows the model on different digits.
        firsts = [int((test_set.labels == c).nonzero()[0]) for c in range(len(test_set.classes))]
        chosen = firsts[: args.num_images]
        images = test_set.images[chosen]
        names = [f"label {test_set.classes[int(test_set.labels[i])]}" for i in chosen]
    else:
        raise ValueError(f"{ckpt.path} records no training data to draw test images from; pass --image FILE")
    distance_images = test_set.images[: args.distance_images] if test_set is not None and not args.image else images
    paths = write_report(model, images, out, distance_images=distance_images, titles=names, classes=classes)
    for name, path in paths.items():
        print(f"{name:>20}: {path}")
    return 0
