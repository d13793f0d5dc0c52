"""`vit-einops summary PRESET`: torchsummary's table and the true parameter count."""

from __future__ import annotations

import argparse

from ..presets import create_vit, list_presets
from ..summary import count_parameters, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", choices=list_presets(), help="a preset from Table 1")
    parser.add_argument("--image-size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--num-classes", type=int, default=1000, help="classifier outputs (default 1000)")


def run(args: argparse.Namespace) -> int:
    model = create_vit(args.preset, image_size=args.image_size, num_classes=args.num_classes).eval()
    print(summarize(model, (model.config.in_channels, *model.config.image_size)), end="")
    print(f"{args.preset}: {count_parameters(model):,} parameters")
    return 0
