"""`vit-einops train`: train a ViT on the bundled digits (default) or a folder of images; also under torchrun."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..base.text import printable
from ..network.kernels import ATTN_IMPLS, KERNELS
from ..presets import list_presets, preset_config

DIGITS = "digits"
# Folder names that say which split a folder is, not what the data is: `--data pizza_steak_sushi/train` is named
# after pizza_steak_sushi.
SPLIT_NAMES = ("train", "training", "test", "testing", "val", "valid", "validation")
# TrainConfig fields offered as --flags, with their help; defaults and types come from TrainConfig itself.
OPTIMISATION = {
    "epochs": "passes over the training set",
    "batch_size": "images per step and process",
    "lr": "peak learning rate, reached after warm-up",
    "weight_decay": "AdamW weight decay on the weight matrices",
    "warmup_epochs": "linear warm-up (capped at a fifth of the run), then cosine decay to 0",
    "clip_norm": "clip the global gradient norm at this",
    "label_smoothing": "label smoothing of the cross-entropy",
    "shift": "random translation augmentation in pixels",
    "seed": "seeds the initial weights, shuffling and dropout",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..train.config import DEFAULT_TEST_FRACTION, SAVE_INTERVAL, TrainConfig

    defaults = TrainConfig()
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", metavar="DIR", help="class-per-subfolder image folder (default: scikit-learn's bundled 8x8 digits)"
    )
    data.add_argument(
        "--test-data",
        metavar="DIR",
        help="test folder with the same class subfolders (default: a held-out split of --data)",
    )
    data.add_argument(
        "--test-fraction",
        type=float,
        default=DEFAULT_TEST_FRACTION,
        help="held-out fraction, stratified (default %(default)s)",
    )
    data.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="use only N training and N test images, every class in its share (smoke tests)",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--preset",
        default=DIGITS,
        choices=[DIGITS, *list_presets()],
        help="model size (default %(default)s: the small model made for the digits, D 64, L 4, h 4, 2x2 patches)",
    )
    model.add_argument(
        "--image-size",
        type=int,
        help="input size (default: 8 on the digits; on --data 32 for the digits model, 224 for the others)",
    )
    model.add_argument("--patch-size", type=int, help="patch size P (default from the preset)")
    for name in ("dim", "depth", "heads", "mlp-dim"):
        model.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")
    model.add_argument("--dropout", type=float, help="dropout (default 0)")
    model.add_argument(
        "--attn-impl", choices=ATTN_IMPLS, default="einsum", help="attention implementation (default %(default)s)"
    )
    opt = parser.add_argument_group("optimisation (the paper's Table 3 recipe, at small scale)")
    for field, help_text in OPTIMISATION.items():
        default = getattr(defaults, field)
        opt.add_argument(
            f"--{field.replace('_', '-')}",
            type=type(default),
            default=default,
            help=f"{help_text} (default %(default)s)",
        )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--out",
        metavar="DIR",
        help="checkpoint/, model.safetensors, metrics.jsonl, summary.json, curves.png, confusion.png (default: "
        "runs/NAME, NAME being the --data folder's name, or its parent's when the folder is named for a split ("
        f"{', '.join(SPLIT_NAMES)}): --data pizza_steak_sushi/train writes runs/pizza_steak_sushi; the digits write "
        "runs/digits)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from DIR/checkpoint; gives the uninterrupted run's result exactly (a run stopped before its "
        "first checkpoint starts again from epoch 1)",
    )
    run.add_argument(
        "--save-interval",
        type=float,
        default=SAVE_INTERVAL,
        metavar="SECONDS",
        help="checkpoint after an epoch once this long has passed since the last checkpoint (0: every epoch; the "
        "last epoch is always saved; default %(default)s)",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in a DIR that holds a run: only files the old run's manifest proves it wrote are "
        "replaced; any other file at a run's names is refused and listed, and files at other names are kept",
    )
    run.add_argument("--no-progress", action="store_true", help="no tqdm bars")


def _model_kwargs(args: argparse.Namespace) -> dict:
    from ..train.config import DIGITS_MODEL

    if args.preset == DIGITS:
        kwargs = dict(DIGITS_MODEL)
        if args.data:  # the same small model on RGB photos: 32x32 in 4x4 patches keeps the 8x8 grid cheap
            kwargs.update(image_size=32, patch_size=4, in_channels=3)
    else:
        kwargs = preset_config(args.preset, dropout=0.0)
        kwargs["image_size"] = 224 if args.data else 8
        kwargs["in_channels"] = 3 if args.data else 1
    for field in ("image_size", "patch_size", "dim", "depth", "heads", "mlp_dim", "dropout"):
        if getattr(args, field) is not None:
            kwargs[field] = getattr(args, field)
    _check_patches_fit(args, kwargs["image_size"], kwargs["patch_size"])
    return kwargs


def _check_patches_fit(args: argparse.Namespace, size: int, patch: int) -> None:
    """A preset's patches (14 px and up) cannot tile the 8x8 digits: say what to pass instead of a model traceback.

    Sizes below 1 are left to the model's own checks.
    """
    if size < 1 or patch < 1 or size % patch == 0:
        return
    fits = [str(p) for p in range(1, size + 1) if size % p == 0]
    choices = f"{', '.join(fits[:-1])} or {fits[-1]}" if len(fits) > 1 else fits[0]
    if args.data:
        hint = f"pass --patch-size {choices}, or an --image-size that is a multiple of {patch}"
    else:
        hint = f"the digits are 8x8 images, so pass --patch-size {choices}"
    raise ValueError(f"--preset {args.preset}: patch size {patch} does not divide image size {size}; {hint}")


def _check_run_arguments(args: argparse.Namespace) -> Path:
    """Everything checkable before any work: numbers, data folders, the output directory. Returns the output path."""
    from ..base.budget import check_memory
    from ..base.checks import check_nonnegative_float, check_positive_int
    from ..network.config import ViTConfig
    from ..network.sizes import check_forward_memory, check_model_build_time
    from ..train.config import TrainConfig
    from ..train.rundir import check_out_dir

    check_nonnegative_float("--save-interval", args.save_interval)
    if args.limit is not None:
        check_positive_int("--limit", args.limit)
    if not 0.0 < args.test_fraction < 1.0:  # false for nan too
        raise ValueError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    TrainConfig(**{field: getattr(args, field) for field in OPTIMISATION})
    model = ViTConfig(**{**_model_kwargs(args), "num_classes": 2})  # the data's classes are counted later
    (h, w), s = model.image_size, args.shift  # --shift pads every batch by s on each side, and copies it
    check_memory(
        2 * args.batch_size * model.in_channels * (h + 2 * s) * (w + 2 * s) * 4,
        f"--shift {s} (batches of {args.batch_size} padded to {h + 2 * s}x{w + 2 * s})",
    )
    check_model_build_time(model)
    # a training step's activations, before any data is read
    check_forward_memory(model, args.batch_size, fused=not KERNELS[args.attn_impl].forms_attention, grad=True)
    for flag, folder in (("--data", args.data), ("--test-data", args.test_data)):
        if folder is not None and not Path(folder).is_dir():
            raise ValueError(f"{flag} {folder!r} does not exist or is not a directory")
    out = Path(args.out) if args.out else default_out(args.data)
    check_out_dir(out, resume=args.resume, overwrite=args.overwrite)
    return out


def default_out(data: str | None) -> Path:
    """runs/NAME: the --data folder's name, or its parent's when the folder is named for a split; runs/digits."""
    if data is None:
        return Path("runs") / DIGITS
    folder = Path(data).resolve()
    while folder.name.lower() in SPLIT_NAMES and folder.parent != folder:
        folder = folder.parent
    return Path("runs") / (folder.name or "data")


def run(args: argparse.Namespace) -> int:
    out = _check_run_arguments(args)

    import torch

    from ..base.threads import threads_summary
    from ..network.model import ViT
    from ..preprocess import Preprocessing
    from ..train.config import TrainConfig
    from ..train.data import describe_data, load_split, stratified_subset
    from ..train.loop import init_distributed, train

    ctx = init_distributed()
    try:
        config = TrainConfig(**{field: getattr(args, field) for field in OPTIMISATION})
        info = describe_data(args.data, args.test_data, args.test_fraction)
        kwargs = _model_kwargs(args)
        train_set, test_set = load_split(info, kwargs["image_size"], kwargs.get("in_channels", 3))
        if args.limit is not None:
            info["limit"] = args.limit
            train_set = train_set.subset(stratified_subset(train_set.labels, args.limit))
            test_set = test_set.subset(stratified_subset(test_set.labels, args.limit))
        kwargs["num_classes"] = len(train_set.classes)  # a preset's 1000 ImageNet classes would not fit the data
        torch.manual_seed(config.seed)  # the same initial weights on every rank and every rerun
        model = ViT(**kwargs, attn_impl=args.attn_impl)
        # What the images went through (the digits: 8x8 grey already in [0, 1]), saved with the model.
        model.preprocessing = Preprocessing.plain(kwargs["image_size"], kwargs.get("in_channels", 3))
        model.source = {"library": "vit-einops", "trained_on": info["name"], "seed": config.seed}
        info["classes"] = train_set.classes
        result = train(
            model,
            train_set,
            test_set,
            config,
            out_dir=out,
            resume=args.resume,
            overwrite=args.overwrite,
            data_info=info,
            save_interval=args.save_interval,
            progress=not args.no_progress,
            ctx=ctx,
        )
        if ctx.is_main:
            last = result.records[-1]
            print(
                f"test accuracy {last['test_acc']:.4f} after {last['epoch']} epochs; wrote {printable(out)}/ "
                f"(model.safetensors, metrics.jsonl, summary.json, curves.png, confusion.png, checkpoint/); "
                f"{threads_summary()}"
            )
        if ctx.active:
            # Every rank tears down together: a rank that left while another still wrote its files and plots was
            # seen to abort in gloo (SIGABRT on rank 1) on a loaded machine.
            torch.distributed.barrier()
    finally:
        if ctx.active:
            torch.distributed.destroy_process_group()
    return 0
