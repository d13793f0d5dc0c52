"""`vit-einops explore MODEL --image IMG... --out explore.html`: one self-contained HTML page to study a model's
attention interactively (layer, head, query patch, rollout, relevance, per-head statistics)."""

from __future__ import annotations

import argparse
from pathlib import Path

SOURCES = ("torchvision", "timm", "hf")
DIGIT_IMAGES = 4  # one test digit of each of the first classes: a small model, a small page


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a vit-einops model file (.safetensors), a training run or checkpoint directory, "
        "or with --from a torchvision/timm/Hugging Face file or directory",
    )
    parser.add_argument("--from", dest="source", choices=SOURCES, help="MODEL is a foreign file of this library")
    parser.add_argument(
        "--image",
        action="append",
        metavar="FILE",
        help="an image to explore (repeatable; default: test digits for a digits model, else scikit-learn's two "
        "sample photos)",
    )
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


def _is_digits_model(model) -> bool:
    cfg = model.config
    return cfg.in_channels == 1 and tuple(cfg.image_size) == (8, 8)


def _shown(x, preprocessing):
    """The model input (C, H, W) with its normalisation undone: the resized, cropped picture the model sees."""
    import torch

    mean = torch.tensor(preprocessing.mean, dtype=torch.float64).view(-1, 1, 1)
    std = torch.tensor(preprocessing.std, dtype=torch.float64).view(-1, 1, 1)
    pixels = (x.double() * std + mean).mul(255).round().clamp(0, 255).to(torch.uint8)
    return pixels[0].numpy() if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).numpy()  # (H, W, C)


def _default_images(model):
    """(inputs, titles, pictures or None) when no --image is given."""
    import torch

    if _is_digits_model(model):
        from ..train.data import load_digits

        test = load_digits()[1]
        chosen = [int((test.labels == c).nonzero()[0]) for c in range(min(DIGIT_IMAGES, len(test.classes)))]
        # The digits are stored in [0, 1] already, exactly as the model was trained on them.
        return test.images[chosen], [f"test digit, label {test.classes[int(test.labels[i])]}" for i in chosen], None
    from PIL import Image
    from sklearn.datasets import load_sample_images

    bunch = load_sample_images()
    preprocessing = model.transforms()
    inputs = torch.stack([preprocessing(Image.fromarray(a)) for a in bunch.images])
    titles = [Path(f).name for f in bunch.filenames]
    return inputs, titles, [_shown(x, preprocessing) for x in inputs]


def run(args: argparse.Namespace) -> int:
    import torch

    from ..explore import write_explorer
    from ..modelfile import load_model
    from ..preprocess import open_image

    model = load_model(args.model, source=args.source).eval()
    if args.image:
        preprocessing = model.transforms()
        inputs = torch.stack([preprocessing(open_image(f)) for f in args.image])
        titles = [Path(f).name for f in args.image]
        pictures = [_shown(x, preprocessing) for x in inputs]
    else:
        inputs, titles, pictures = _default_images(model)
    path = write_explorer(
        model,
        inputs,
        args.out,
        titles=titles,
        class_names=model.class_names,
        pictures=pictures,
        top_k=args.top_k,
        bits=args.bits,
        overwrite=args.force,
    )
    print(f"explorer: {path} ({path.stat().st_size / 1e6:.2f} MB, {len(inputs)} images)")
    return 0
