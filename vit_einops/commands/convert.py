"""`vit-einops convert SRC DST --from torchvision --to vit-einops`: weights between formats, optionally resampled.

Formats: torchvision and timm state dicts (.safetensors, .pth, .bin), Hugging Face ``save_pretrained``
directories, and vit-einops model files (.safetensors carrying config, preprocessing and class names). The config
is read off the source; what its tensors cannot tell (heads, a non-square image, timm's pooling, activation and
LayerNorm eps) comes from the flags (``--arch TIMM_NAME`` names all of them for a timm file), and so does any change
to the preprocessing the model file records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..base.text import printable
from ..sources import SOURCES
from ._model import add_model_arguments, files_read_by_model, load_model_from_args, parse_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="the model to read (a file, or a directory with --from hf or a training run)")
    parser.add_argument("dst", help="where to write; a vit-einops file ends in .safetensors, --to hf is a directory")
    add_model_arguments(parser, positional=False)
    parser.add_argument(
        "--to", dest="target", choices=list(SOURCES), default="vit-einops", help="format of DST (default vit-einops)"
    )
    parser.add_argument(
        "--resample-to", type=parse_size, metavar="N|HxW", help="resample the position embedding to this image size"
    )
    parser.add_argument(
        "--resample-mode",
        choices=("torchvision", "timm"),
        default="timm",
        help="interpolation convention (default timm)",
    )
    parser.add_argument("--force", action="store_true", help="replace DST if it exists")


def run(args: argparse.Namespace) -> int:
    from ..base.io import check_output, output_lock

    src, dst = Path(args.src), Path(args.dst)
    check_output(dst, files_read_by_model(src, args.source))
    # Held from the first check to the commit: a second convert to DST fails at once, naming this one.
    with output_lock(dst, parents=args.target == "hf"):
        return _convert(args, src, dst)


def _convert(args: argparse.Namespace, src: Path, dst: Path) -> int:
    from ..interop import (
        resample_vit,
        save_hf,
        save_state_dict_file,
        timm_class,
        timm_kwargs,
        to_timm,
        to_torchvision,
        torchvision_kwargs,
    )
    from ..base.io import check_directory_output, check_file_output
    from ..interop.hf import HF_FILES, hf_processor
    from ..interop.hf_families import target_architecture
    from ..modelfile import save_vit

    if args.target == "hf":
        check_directory_output(dst, HF_FILES, args.force)
    else:
        check_file_output(dst, args.force, "pass --force to replace it")
    model = load_model_from_args(args, str(src))
    if args.resample_to is not None:
        preprocessing, class_names, source = model.preprocessing, model.class_names, model.source
        model = resample_vit(model, args.resample_to, mode=args.resample_mode)
        model.class_names, model.source = class_names, source
        if preprocessing is not None and preprocessing.output_size is not None:
            print("note: the preprocessing was made for the old size; set --resize/--crop for the new one")
        model.preprocessing = None if preprocessing is None or preprocessing.output_size else preprocessing
    if args.target == "vit-einops":
        save_vit(model, dst, overwrite=args.force)
        print(f"wrote {printable(dst)}: vit-einops, config {json.dumps(model.config.to_dict())}")
        if model.preprocessing is not None:
            print(f"  preprocessing {json.dumps(model.preprocessing.to_dict())}")
    elif args.target == "hf":
        save_hf(model, dst, overwrite=args.force)
        processor, why_not = hf_processor(model)
        files = "config.json, model.safetensors"
        if processor is not None:
            files += f", preprocessor_config.json for {processor['image_processor_type']}"
        print(f"wrote {printable(dst)}/: Hugging Face {target_architecture(model.config).architecture} ({files})")
        if processor is None:
            print(f"  no preprocessor_config.json: {printable(why_not)}")
        elif model.preprocessing.backend == "pil":
            print('  it resizes with PIL: load it with AutoImageProcessor.from_pretrained(DST, backend="pil")')
    else:
        if args.target == "torchvision":
            builder = f"torchvision.models.VisionTransformer(**{torchvision_kwargs(model.config)})"
            export = to_torchvision
        else:
            builder = f"{timm_class(model.config)}(**{timm_kwargs(model.config)})"
            export = to_timm
        save_state_dict_file(export(model), dst, overwrite=args.force)
        print(f"wrote {printable(dst)}: {args.target} state dict; build its model with {builder}")
    return 0
