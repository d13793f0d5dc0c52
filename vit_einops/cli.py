"""The ``vit-einops`` command: one subcommand per job, each defined in its own module.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; only the module of the command
being run is imported, and command modules import torch inside ``run``, so ``--help`` is fast. Each may need an optional extra
(matplotlib, tqdm, scikit-learn...); a command whose extra is missing says which one to install, and the other
commands keep working.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from ._budget import ENV_VAR, max_memory, parse_bytes

# name -> (module, the pip extra it needs or None, one-line help).
COMMANDS: dict[str, tuple[str, str | None, str]] = {
    "summary": (
        "vit_einops.commands.summary",
        None,
        "count a preset's parameters (without allocating them) and print its torchsummary layer table",
    ),
    "bench": (
        "vit_einops.commands.bench",
        "bench",
        "benchmark einsum, chunked and SDPA attention and whole models (table, JSON/CSV, plots)",
    ),
    "train": (
        "vit_einops.commands.train",
        "train",
        "train a ViT on the bundled digits or an image folder (also under torchrun)",
    ),
    "inspect": (
        "vit_einops.commands.inspect",
        "train",
        "draw any ViT's attention maps, rollout, distances and embeddings for images",
    ),
    "convert": (
        "vit_einops.commands.convert",
        None,
        "convert torchvision / timm / Hugging Face / vit-einops weights, optionally to a new resolution",
    ),
    "predict": (
        "vit_einops.commands.predict",
        None,
        "the top classes of images under any ViT, through the model's own preprocessing",
    ),
    "explore": (
        "vit_einops.commands.explore",
        "explore",
        "write an interactive attention explorer: one self-contained HTML page (layers, heads, rollout, relevance)",
    ),
}


def _optional_missing(err: ModuleNotFoundError, extra: str | None) -> bool:
    """True if ``err`` is a missing third-party module that ``extra`` would install (not a bug of ours)."""
    return extra is not None and bool(err.name) and err.name.split(".")[0] != "vit_einops"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` only: the other commands' modules are not imported, so
    ``vit-einops --help`` (which needs only their names) never waits for torch."""
    parser = argparse.ArgumentParser(prog="vit-einops", description="A paper-faithful Vision Transformer in einops.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, extra, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name != command:
            continue
        try:
            command_module = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if not _optional_missing(err, extra):
                raise
            p.set_defaults(_missing=err.name)
            continue
        p.set_defaults(_module=module)
        command_module.add_arguments(p)
        p.add_argument(
            "--max-memory",
            type=_memory_size,
            metavar="SIZE",
            help=f"refuse work estimated to need more memory than SIZE, e.g. 64GiB (default: ${ENV_VAR}, else the "
            "memory this machine has available); raise it to allow a larger model, image or grid",
        )
    return parser


def _memory_size(text: str) -> int:
    """argparse type of --max-memory: a size such as 64GiB, 500MB or 1000000 (bytes)."""
    try:
        return parse_bytes(text, "--max-memory")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _command_name(argv: list[str]) -> str | None:
    """The command in ``argv``: its first word that is not an option (the top level's options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; with no command at all, print the help and return 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_name(argv))
    if not argv:
        parser.print_help()
        return 0
    # parse_known_args: a command whose extra is missing has no arguments defined, yet must still say why it
    # cannot run rather than reject the user's flags.
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:  # options but no command, e.g. `vit-einops -x`
        parser.error(
            f"a command is required (one of {', '.join(COMMANDS)}); unrecognized arguments: {' '.join(unknown)}"
        )
    extra = COMMANDS[args.command][1]
    missing = getattr(args, "_missing", None)
    if missing is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        try:
            with max_memory(args.max_memory):
                return importlib.import_module(args._module).run(args)
        except ModuleNotFoundError as err:  # commands that import their extra only when they run
            if not _optional_missing(err, extra):
                raise
            missing = err.name
        except (ValueError, TypeError, OSError) as err:
            # Bad input (a value, a file): our errors name the value and what was expected, so the message is the
            # answer; a traceback would bury it. VIT_EINOPS_TRACEBACK=1 shows it anyway.
            if os.environ.get("VIT_EINOPS_TRACEBACK"):
                raise
            print(f"vit-einops {args.command}: error: {err}", file=sys.stderr)
            return 2
    print(
        f"vit-einops {args.command}: the optional dependency {missing!r} is not installed; "
        f"install it with: pip install 'vit-einops[{extra}]'",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
