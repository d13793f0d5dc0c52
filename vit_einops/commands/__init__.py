"""Subcommands of the ``vit-einops`` command line (see vit_einops.commands.cli)."""
