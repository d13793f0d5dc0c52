"""The ``vit-einops`` command: one subcommand per job, each defined in its own module.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Modules import lazily so `vit-einops summary` never loads matplotlib.
COMMANDS: dict[str, tuple[str, str]] = {
    "summary": ("vit_einops.commands.summary", "print a preset's layer table (torchsummary) and parameter count"),
    "bench": (
        "vit_einops.commands.bench",
        "benchmark einsum, chunked and SDPA attention and whole models (table, JSON/CSV, plots)",
    ),
    "train": (
        "vit_einops.commands.train",
        "train a ViT on the bundled digits or an image folder (also under torchrun)",
    ),
    "inspect": (
        "vit_einops.commands.inspect",
        "draw a trained model's attention maps, rollout, distances and embeddings",
    ),
    "convert": (
        "vit_einops.commands.convert",
        "convert torchvision / timm / vit-einops weight files, optionally to a new resolution",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vit-einops", description="A paper-faithful Vision Transformer in einops.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return importlib.import_module(args._module).run(args)


if __name__ == "__main__":
    sys.exit(main())
