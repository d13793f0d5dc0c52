"""`vit-einops convert SRC DST --from torchvision --to vit-einops`: weights between key layouts, optionally resampled.

Formats: torchvision and timm state dicts (.safetensors, .pth, .bin), and vit-einops files (.safetensors with the
ViTConfig in their metadata). The config is read off the source's tensors; what tensors cannot tell (heads, a
non-square image, timm's pooling) comes from the flags.
"""

from __future__ import annotations

import argparse
import json

FORMATS = ("torchvision", "timm", "vit-einops")


def _size(values: list[int] | None) -> int | tuple[int, int] | None:
    """argparse's "H [W]" as an int (square) or an (H, W) pair."""
    if values is None:
        return None
    if len(values) > 2:
        raise ValueError(f"a size is H or H W, got {len(values)} numbers: {values}")
    return values[0] if len(values) == 1 else (values[0], values[1])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="weights file to read (.safetensors, .pth, .bin)")
    parser.add_argument("dst", help="file to write; a vit-einops file must end in .safetensors")
    parser.add_argument("--from", dest="source", choices=FORMATS, required=True, help="key layout of SRC")
    parser.add_argument(
        "--to", dest="target", choices=FORMATS, default="vit-einops", help="key layout of DST (default vit-einops)"
    )
    parser.add_argument(
        "--heads", type=int, help="attention heads (not stored in any tensor; default: Table 1's for the width)"
    )
    parser.add_argument(
        "--image-size",
        type=int,
        nargs="+",
        metavar="N",
        help="SRC's image size, H or H W (default: square, from its positions)",
    )
    parser.add_argument(
        "--global-pool", choices=("token", "avg"), default="token", help="timm SRC's global_pool (default token)"
    )
    parser.add_argument(
        "--resample-to",
        type=int,
        nargs="+",
        metavar="N",
        help="resample the position embedding to this image size, H or H W",
    )
    parser.add_argument(
        "--resample-mode",
        choices=("torchvision", "timm"),
        default="timm",
        help="interpolation convention (default timm)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: `vit-einops --help` and the other commands must not need safetensors.
    from ..interop import (
        load_timm,
        load_torchvision,
        load_vit,
        resample_vit,
        save_state_dict_file,
        save_vit,
        timm_kwargs,
        to_timm,
        to_torchvision,
        torchvision_kwargs,
    )

    inferred = dict(heads=args.heads, image_size=_size(args.image_size))
    if args.source == "torchvision":
        model = load_torchvision(args.src, **inferred)
    elif args.source == "timm":
        model = load_timm(args.src, global_pool=args.global_pool, **inferred)
    else:
        if any(v is not None for v in inferred.values()):
            raise ValueError(
                "--heads and --image-size describe torchvision/timm sources; a vit-einops file stores its config"
            )
        model = load_vit(args.src)
    if args.resample_to is not None:
        model = resample_vit(model, _size(args.resample_to), mode=args.resample_mode)
    if args.target == "vit-einops":
        save_vit(model, args.dst)
        print(f"wrote {args.dst}: vit-einops, config {json.dumps(model.config.to_dict())}")
    else:
        export, kwargs = (
            (to_torchvision, torchvision_kwargs) if args.target == "torchvision" else (to_timm, timm_kwargs)
        )
        save_state_dict_file(export(model), args.dst)
        print(f"wrote {args.dst}: {args.target} state dict; build its model with {kwargs(model.config)}")
    return 0
