"""The MODEL argument every command that takes a model shares (predict, inspect, convert, summary, explore).

MODEL is a vit-einops model file, a training run or checkpoint directory, a torchvision or timm state-dict file,
or a Hugging Face ``save_pretrained`` directory; its form is recognised from it (``--from`` names it instead). The
preprocessing flags override what the model records (the library's convention for converted weights, the training
recipe for models trained here).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ..base.text import printable
from ..network.config import ACTIVATIONS
from ..preprocess import CONVENTIONS
from ..sources import SOURCES


def parse_size(text: str) -> int | tuple[int, int]:
    """ "224" -> 224; "224x320" (or "224,320") -> (224, 320)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[x,]\s*(\d+)\s*)?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size N or HxW (e.g. 224 or 224x320), got {text!r}")
    return int(m[1]) if m[2] is None else (int(m[1]), int(m[2]))


def parse_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers (e.g. 0.5,0.5,0.5), got {text!r}") from None


def add_model_arguments(parser: argparse.ArgumentParser, *, positional: bool = True, optional: bool = False) -> None:
    """MODEL (a positional; ``optional`` lets it be left out, ``positional=False`` leaves it to the caller), then the
    flags that say how to read it and how to preprocess images for it."""
    if positional:
        parser.add_argument(
            "model",
            nargs="?" if optional else None,
            metavar="MODEL",
            help="a vit-einops model file (.safetensors), a training run or checkpoint directory, "
            "a torchvision/timm weights file or a Hugging Face directory",
        )
    group = parser.add_argument_group("reading MODEL")
    group.add_argument(
        "--from", dest="source", choices=list(SOURCES), help="MODEL's format (default: recognised from MODEL)"
    )
    group.add_argument("--heads", type=int, help="attention heads of a torchvision/timm MODEL (default: Table 1's)")
    group.add_argument(
        "--image-size",
        type=parse_size,
        metavar="N|HxW",
        help="image size of a torchvision/timm MODEL, N or HxW (default: square, from its positions)",
    )
    group.add_argument(
        "--global-pool",
        choices=("token", "avg", "map"),
        help="timm MODEL's global_pool (default: the --arch's, else map if MODEL has attn_pool, else token)",
    )
    group.add_argument(
        "--act", choices=ACTIVATIONS, help="timm MODEL's activation, where no --arch fits it (default: the --arch's)"
    )
    group.add_argument(
        "--layer-norm-eps",
        type=float,
        metavar="EPS",
        help="timm MODEL's LayerNorm eps, where no --arch fits it (default: the --arch's)",
    )
    group.add_argument(
        "--arch",
        metavar="TIMM_NAME",
        help="timm MODEL's architecture, e.g. vit_small_patch14_reg4_dinov2 or vit_base_patch16_clip_224.openai: "
        "the heads, activation, LayerNorm eps and pooling no tensor holds (MODEL must fit it; default: the one "
        "MODEL's tensors fit, MODEL refused where several that differ fit)",
    )
    prep = parser.add_argument_group("preprocessing (default: what MODEL records)")
    prep.add_argument("--preprocessing", choices=CONVENTIONS, help="a library's convention at the model's size")
    prep.add_argument("--resize", type=parse_size, metavar="N|HxW", help="shorter side N, or exactly HxW")
    prep.add_argument("--crop", type=parse_size, metavar="N|HxW", help="centre crop")
    prep.add_argument("--crop-pct", type=float, help="timm's crop_pct: resize the shorter side to crop / crop_pct")
    prep.add_argument("--interpolation", choices=("nearest", "bilinear", "bicubic"))
    prep.add_argument("--mean", type=parse_floats, metavar="M[,M,M]", help="per-channel mean")
    prep.add_argument("--std", type=parse_floats, metavar="S[,S,S]", help="per-channel std")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The backbone targets (:mod:`vit_einops.inspect.targets`): what relevance is for on a model without a
    classifier, at most one."""
    group = parser.add_argument_group(
        "relevance target (for a model without a classifier; at most one)"
    ).add_mutually_exclusive_group()
    group.add_argument(
        "--target-embedding",
        metavar="FILE",
        help="an embedding of the model's output size (.pt, .npy or .safetensors): relevance for the cosine "
        "similarity of the output to it",
    )
    group.add_argument(
        "--target-image", metavar="PATH", help="an image: relevance for the cosine similarity to its output"
    )
    group.add_argument(
        "--target-patch",
        metavar="ROW,COL",
        help="a patch of the grid: relevance for the mean cosine similarity of the patch tokens to its token",
    )


def target_from_args(args: argparse.Namespace) -> Any:
    """The backbone target the flags of :func:`add_target_arguments` name, or None."""
    from ..inspect.targets import EmbeddingTarget, ImageTarget, load_embedding, parse_patch

    if args.target_embedding is not None:
        return EmbeddingTarget(load_embedding(args.target_embedding))
    if args.target_image is not None:
        return ImageTarget(args.target_image)
    if args.target_patch is not None:
        return parse_patch(args.target_patch)
    return None


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """The explanation methods' parameters (:data:`vit_einops.inspect.METHODS`) a user picks on the command line."""
    group = parser.add_argument_group("explanation methods")
    group.add_argument(  # the value is checked by the method (METHODS["rollout"]), as from Python
        "--rollout-fusion", metavar="FUSION", help="how attention rollout fuses the heads: mean, max or min (default mean)"
    )
    group.add_argument(
        "--discard-ratio",
        type=float,
        metavar="R",
        help="rollout and gradient rollout: the lowest fraction R of each layer's fused map set to 0, the class "
        "token's own entry kept (vit-explain's discard_ratio; default 0 for rollout, 0.9 for gradient rollout)",
    )
    group.add_argument(
        "--start-layer",
        type=int,
        metavar="L",
        help="relevance: the first layer (0-based) that enters it, skipping the early layers (default 0)",
    )


def method_params_from_args(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """{method name: its parameters} the flags of :func:`add_method_arguments` set, each checked by its method."""
    from ..inspect import METHODS

    chosen = {
        "rollout": {"head_fusion": args.rollout_fusion, "discard_ratio": args.discard_ratio},
        "gradient-rollout": {"discard_ratio": args.discard_ratio},
        "relevance": {"start_layer": args.start_layer},
    }
    params = {name: {k: v for k, v in values.items() if v is not None} for name, values in chosen.items()}
    for name, values in params.items():
        METHODS[name].resolve(values)  # a bad value is refused before any model loads
    return {name: values for name, values in params.items() if values}


def load_model_from_args(args: argparse.Namespace, path: str | None = None) -> Any:
    """The ViT that ``args`` describe, its preprocessing overridden by the flags."""
    from ..sources import detect_source, load_model

    path = path if path is not None else args.model
    source = args.source or detect_source(path)
    kwargs: dict[str, Any] = {"heads": args.heads, "image_size": args.image_size}
    timm_only = {
        "global_pool": args.global_pool, "arch": args.arch, "act": args.act, "layer_norm_eps": args.layer_norm_eps
    }
    given = [f"--{k.replace('_', '-')}" for k, v in {**kwargs, **timm_only}.items() if v is not None]
    if source == "timm":
        kwargs |= {key: value for key, value in timm_only.items() if value is not None}
    elif source == "torchvision":
        if timm_flags := [flag for flag in given if flag[2:].replace("-", "_") in timm_only]:
            raise ValueError(
                f"{' and '.join(timm_flags)} describe{'s' * (len(timm_flags) == 1)} timm files; {printable(path)} is "
                f"torchvision's, whose ViT always pools the class token (--heads and --image-size describe it)"
            )
    elif given:
        raise ValueError(
            f"{', '.join(given)} describe{'s' * (len(given) == 1)} torchvision/timm files; "
            f"a vit-einops or Hugging Face model states its own"
        )
    else:
        kwargs = {}
    model = load_model(path, source=source, **kwargs)
    model.preprocessing = preprocessing_from_args(args, model)
    return model


def files_read_by_model(path: str | Path, source: str | None = None) -> list[Path]:
    """The files and directories that loading MODEL ``path`` reads: what no output of the command may be, hold,
    or lie inside (:func:`vit_einops.base.io.check_output`).

    A training run directory (:func:`training_run`) gives its model file and checkpoint, not itself, so that the
    run's own folder can take the command's outputs (inspect writes runs/x/inspect); a Hugging Face weights file
    brings the config files read beside it; any other path, a Hugging Face directory among them, is itself.
    ``source`` None (recognised from the file) counts as every form.
    """
    path = Path(path)
    if path.is_dir() and training_run(path, source) == path:
        return [path / "model.safetensors", path / "checkpoint", path / "checkpoint.json"]
    if source in (None, "vit-einops") and path.name == "checkpoint.json":
        return [path.parent]
    if source in (None, "hf") and not path.is_dir():
        return [path, path.parent / "config.json", path.parent / "preprocessor_config.json"]
    return [path]


def training_run(path: str | Path, source: str | None = None) -> Path | None:
    """The training run directory that MODEL ``path`` names, or None: the run itself, its ``checkpoint/`` folder,
    that folder's ``checkpoint.json``, or the run's ``model.safetensors``.

    A run is a folder that `vit-einops train` wrote: it holds ``checkpoint/``, and no ``config.json``. A folder with
    a config.json may be a Hugging Face model (``source`` None counts as every form), and a model is only ever an
    input, often one in a hub cache: a command writes inside a run's folder, never inside a model's.
    """
    if source not in (None, "vit-einops"):
        return None
    path = Path(path)
    if path.name == "checkpoint.json":
        path = path.parent
    if _is_run(path):
        return path
    if path.name in ("checkpoint", "model.safetensors") and _is_run(path.parent):
        return path.parent
    return None


def _is_run(folder: Path) -> bool:
    return folder.is_dir() and (folder / "checkpoint").is_dir() and not (folder / "config.json").exists()


def preprocessing_from_args(args: argparse.Namespace, model: Any) -> Any:
    """The model's preprocessing with the command line's overrides applied."""
    import dataclasses

    from ..preprocess import Preprocessing

    config = model.config
    crop = config.image_size
    base = model.preprocessing
    if args.preprocessing is not None:
        base = Preprocessing.convention(args.preprocessing, crop, config.in_channels)
    changes: dict[str, Any] = {}
    if args.crop_pct is not None:  # timm's resize and crop, on any convention; Preprocessing.timm checks crop_pct
        timm = Preprocessing.timm(crop=args.crop or crop, crop_pct=args.crop_pct)
        changes |= {"resize": timm.resize, "crop": timm.crop}
    for name in ("resize", "crop", "interpolation", "mean", "std"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = (value, value) if name == "crop" and isinstance(value, int) else value
    if changes:
        if base is None:
            base = Preprocessing.plain(crop, config.in_channels)
        base = dataclasses.replace(base, **changes)
    if base is not None:
        base.check_fits(crop, config.in_channels)
    return base


def add_images_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """--images DIR, a folder of images (read by :func:`image_files`); ``default`` says what is used without it."""
    parser.add_argument(
        "--images",
        metavar="DIR",
        help=f"a folder of images (its image files in name order; hidden files and other files skipped); {default}",
    )


def image_files(folder: str | Path) -> list[Path]:
    """The image files of ``folder`` (--images DIR) in name order (hidden entries and files of other suffixes
    skipped)."""
    from ..train.data import IMAGE_SUFFIXES

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--images {str(folder)!r} is not a directory")
    files = sorted(
        p for p in folder.iterdir() if not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise ValueError(f"--images {str(folder)!r} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    return files


def is_digits_model(model: Any) -> bool:
    """A model shaped like vit-einops train's digits model: 8x8 grey images, 10 classes."""
    config = model.config
    return tuple(config.image_size) == (8, 8) and config.in_channels == 1 and config.num_classes == 10


def default_images(model: Any, files: list[str] | None, num_digits: int, distance_digits: int = 0) -> dict[str, Any]:
    """The images a study command shows, as a dict:

    - ``inputs`` (b, C, H, W): what the model is run on, through its own preprocessing;
    - ``display`` (b, C, H, W) in [0, 1]: the same images resized and cropped but not normalised (what it saw);
    - ``titles``: one per image; ``distance``: more test digits to average attention distances over, or None.

    ``files`` given: those files. Otherwise test digits (one per class first) for a digits model, and scikit-learn's
    two sample photos for any other model. No training data is read from where a checkpoint says it was.
    """
    from ..images import sample_images
    from ..inputs import model_inputs_and_pictures

    if not files and is_digits_model(model):
        from ..train.data import load_digits

        test = load_digits()[1]
        chosen = [int((test.labels == c).nonzero()[0]) for c in range(len(test.classes))][:num_digits]
        pictures = test.images[chosen]  # raw pixels in [0, 1], as the model was trained on them
        titles = [f"test digit, label {test.classes[int(test.labels[i])]}" for i in chosen]
        distance = test.images[:distance_digits] if distance_digits else None
    elif files:
        pictures, titles, distance = list(files), [Path(f).name for f in files], None
    else:
        (pictures, titles), distance = sample_images(), None
    # Only the digits are float tensors: raw pixels, unless the model records no preprocessing to put them through
    # (training fed them to it as they are).
    preprocessed = model.preprocessing is None
    inputs, display = model_inputs_and_pictures(model, pictures, preprocessed=preprocessed)
    return {
        "inputs": inputs,
        "display": display,
        "titles": titles,
        "distance": distance,
    }
