"""`vit-einops summary PRESET`: the parameter count (shapes only, nothing allocated) and torchsummary's table."""

from __future__ import annotations

import argparse

from ..presets import list_presets

# The layer table needs real weights and one forward. By default it is printed up to ViT-B's size (86.6M
# parameters, about a second at 224 px); L and H need --table (1.2 and 2.5 GB of weights).
TABLE_MAX_PARAMETERS = 100_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "preset", choices=list_presets(timm_names=True), help="a preset from Table 1 (or its timm name)"
    )
    parser.add_argument("--image-size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--num-classes", type=int, default=1000, help="classifier outputs (default 1000)")
    parser.add_argument(
        "--table",
        action=argparse.BooleanOptionalAction,
        help=f"print torchsummary's layer table (builds the weights and runs a forward); default: only for "
        f"models of up to {TABLE_MAX_PARAMETERS // 1_000_000}M parameters",
    )


def run(args: argparse.Namespace) -> int:
    from ..summary import count_parameters, meta_vit, summarize, zeroed_vit

    overrides = dict(image_size=args.image_size, num_classes=args.num_classes)
    total = count_parameters(meta_vit(args.preset, **overrides))
    table = args.table if args.table is not None else total <= TABLE_MAX_PARAMETERS
    if table:
        model = zeroed_vit(args.preset, **overrides).eval()
        print(summarize(model, (model.config.in_channels, *model.config.image_size)), end="")
    elif args.table is None:
        print(f"(no layer table by default above {TABLE_MAX_PARAMETERS:,} parameters; --table prints it)")
    print(f"{args.preset}: {total:,} parameters")
    return 0
