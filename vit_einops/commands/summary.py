"""`vit-einops summary PRESET` or `vit-einops summary --model MODEL`: the parameter count (shapes only, nothing
allocated for a preset) and torchsummary's table; for a model, also what its file records."""

from __future__ import annotations

import argparse

from ..presets import list_presets
from ._model import add_model_arguments

# The layer table needs real weights and one forward. By default it is printed up to ViT-B's size (86.6M
# parameters, about a second at 224 px); L and H need --table (1.2 and 2.5 GB of weights).
TABLE_MAX_PARAMETERS = 100_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "preset", nargs="?", choices=list_presets(timm_names=True), help="a preset from Table 1 (or its timm name)"
    )
    parser.add_argument(
        "--model",
        metavar="MODEL",
        help="summarise a model instead: a model file, a training run, or with --from a "
        "torchvision/timm file or a Hugging Face directory",
    )
    parser.add_argument(
        "--num-classes", type=int, help="a preset's classifier outputs (default: the preset's, 1000 for Table 1's)"
    )
    parser.add_argument(
        "--table",
        action=argparse.BooleanOptionalAction,
        help=f"print torchsummary's layer table (builds the weights and runs a forward); default: only for "
        f"models of up to {TABLE_MAX_PARAMETERS // 1_000_000}M parameters",
    )

    add_model_arguments(parser, positional=False)  # --image-size is also a preset's input size (default: its own)


def run(args: argparse.Namespace) -> int:
    from ..summary import count_parameters, meta_vit, summarize, zeroed_vit

    if (args.preset is None) == (args.model is None):
        raise ValueError("give a PRESET or --model MODEL (one of them)")
    if args.model is not None:
        return _summarize_model(args)
    # A timm family's own size and classes (DINOv2's 518 px, no classifier) unless asked otherwise.
    given = dict(image_size=args.image_size, num_classes=args.num_classes)
    overrides = {k: v for k, v in given.items() if v is not None}
    total = count_parameters(meta_vit(args.preset, **overrides))
    table = args.table if args.table is not None else total <= TABLE_MAX_PARAMETERS
    if table:
        model = zeroed_vit(args.preset, **overrides).eval()
        print(summarize(model, (model.config.in_channels, *model.config.image_size)), end="")
    elif args.table is None:
        print(f"(no layer table by default above {TABLE_MAX_PARAMETERS:,} parameters; --table prints it)")
    print(f"{args.preset}: {total:,} parameters")
    return 0


def _summarize_model(args: argparse.Namespace) -> int:
    import json

    from ..base.text import printable
    from ..summary import count_parameters, summarize
    from ._model import load_model_from_args

    model = load_model_from_args(args, args.model).eval()
    config = model.config
    total = count_parameters(model)
    if args.table or (args.table is None and total <= TABLE_MAX_PARAMETERS):
        print(summarize(model, (config.in_channels, *config.image_size)), end="")
    print(f"{printable(args.model)}: {total:,} parameters")
    print(f"  config        {json.dumps(config.to_dict())}")
    prep = model.preprocessing
    print(f"  preprocessing {json.dumps(prep.to_dict()) if prep is not None else 'none recorded'}")
    names = model.class_names
    shown = (
        "none recorded"
        if names is None
        else ", ".join(map(printable, names[:5])) + (f" ... ({len(names)})" if len(names) > 5 else "")
    )
    print(f"  class names   {shown}")
    print(f"  source        {json.dumps(model.source) if model.source is not None else 'unknown'}")
    return 0
