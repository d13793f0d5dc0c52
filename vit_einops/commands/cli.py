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
from typing import NoReturn

from .. import __version__
from ..base.budget import BUILD_SECONDS, ENV_VAR, TIME_ENV_VAR, max_build_time, max_memory, parse_bytes, parse_seconds
from ..base.text import printable, printable_lines

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
    "faithfulness": (
        "vit_einops.commands.faithfulness",
        "train",
        "score explanation methods by deletion, insertion and positive/negative perturbation AUC, beside a random map",
    ),
    "decompose": (
        "vit_einops.commands.decompose",
        "train",
        "split a score exactly into each head's, MLP's and source patch's share (the residual stream read as a sum)",
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


_DEBUG_HELP = "show the traceback of an error (also VIT_EINOPS_TRACEBACK=1)"
TRACEBACK_VAR = "VIT_EINOPS_TRACEBACK"
_TRACEBACK_WORDS = {"": False, "0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors as every other error of the command line: one line, "vit-einops CMD: error:
    ...", exit status 2. What was typed is echoed with control characters escaped (:func:`printable`): an argument
    is a string from the user's shell, or from a script that pasted a file name into it."""

    command_parser: "Parser | None" = None  # the parser of the command being run (build_parser sets it)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {printable(message)}\n")


def _optional_missing(err: ModuleNotFoundError, extra: str | None) -> bool:
    """True if ``err`` is a missing third-party module that ``extra`` would install (not a bug of ours)."""
    return extra is not None and bool(err.name) and err.name.split(".")[0] != "vit_einops"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` only: the other commands' modules are not imported, so
    ``vit-einops --help`` (which needs only their names) never waits for torch."""
    parser = Parser(prog="vit-einops", description="A paper-faithful Vision Transformer in einops.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, extra, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Also after the command (`vit-einops predict ... --debug`); SUPPRESS keeps a --debug given before it.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
        if name != command:
            continue
        parser.command_parser = p
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
        p.add_argument(
            "--max-build-time",
            type=_build_time,
            metavar="TIME",
            help=f"refuse a model whose modules are estimated to take longer than TIME to build, e.g. 2min "
            f"(default: ${TIME_ENV_VAR}, else {BUILD_SECONDS:g}s); raise it to allow a deeper model",
        )
        p.add_argument(
            "--threads",
            type=_threads,
            metavar="N",
            help="torch's intra-op threads, 1 to the CPU count (default: $VIT_EINOPS_THREADS, else as many as the "
            "cores other processes leave free, checked again while the command runs)",
        )
    return parser


def _memory_size(text: str) -> int:
    """argparse type of --max-memory: a size such as 64GiB, 500MB or 1000000 (bytes)."""
    try:
        return parse_bytes(text, "--max-memory")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _build_time(text: str) -> float:
    """argparse type of --max-build-time: a time such as 30, 30s or 2min."""
    try:
        return parse_seconds(text, "--max-build-time")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _threads(text: str) -> int:
    """argparse type of --threads: a whole number from 1 to the CPU count."""
    from ..base.threads import check_threads

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    try:  # argparse's message begins "argument --threads: "
        return check_threads("threads", value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _command_name(argv: list[str]) -> str | None:
    """The command in ``argv``: its first word that is not an option (the top level's options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _parse(parser: Parser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``parser.parse_known_args(argv)``, but an argument no option or positional takes is reported before a
    missing one: argparse checks for missing arguments first, so ``explore --bogus-flag`` would say MODEL and --out
    are missing, not that --bogus-flag is no option. A first pass with nothing required finds the unknown ones."""
    parsers = [parser] if parser.command_parser is None else [parser, parser.command_parser]
    required = [action for p in parsers for action in p._actions if action.required]
    for action in required:
        action.required = False
    try:
        args, unknown = parser.parse_known_args(argv)
    finally:
        for action in required:
            action.required = True
    if unknown or args.command is None or hasattr(args, "_missing"):
        return args, unknown
    return parser.parse_known_args(argv)


def _traceback_requested() -> bool:
    """VIT_EINOPS_TRACEBACK: "1", "true" or "yes" (any case) shows tracebacks, "0", "false", "no" or unset/empty
    does not; any other value is a ValueError, so that a typo is never read as either."""
    value = os.environ.get(TRACEBACK_VAR, "")
    word = value.strip().lower()
    if word not in _TRACEBACK_WORDS:
        raise ValueError(
            f"{TRACEBACK_VAR} must be 1, true or yes (show tracebacks) or 0, false, no or empty (do not), got {value!r}"
        )
    return _TRACEBACK_WORDS[word]


def _user_error(err: BaseException) -> str | None:
    """The one-line message for an error the user's input caused, or None for a bug of ours.

    ValueError and TypeError are what our checks raise where input enters, naming the value; OSError is a file that
    cannot be read or written. Exhausted resources are caused by the input too (a size the machine cannot hold, JSON
    nested past Python's recursion limit), though no check of ours raised them, so the message says what ran out.
    """
    if isinstance(err, (ValueError, TypeError, OSError)):
        return str(err)
    if isinstance(err, RecursionError):
        return f"the input is nested too deeply to read ({err})"
    if isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError) and any(words in str(err) for words in _OUT_OF_MEMORY)
    ):
        return f"not enough memory for this input ({type(err).__name__}: {str(err) or 'no details'})"
    return None


# torch's words when an allocation fails (its OutOfMemoryError is a RuntimeError, as is the CPU allocator's error).
_OUT_OF_MEMORY = ("can't allocate memory", "out of memory")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; with no command at all, print the help and return 0.

    Every error the input causes prints one line, "vit-einops CMD: error: ...", and returns 2 (argparse's own,
    such as an unknown flag, exit with status 2); any other exception (a bug) prints "vit-einops CMD: internal error:
    ..." and returns 1. With --debug (or VIT_EINOPS_TRACEBACK=1, see :func:`_traceback_requested`) both raise, so the
    traceback shows. Strings from files or the command line in a message are printed with control characters escaped.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_name(argv))
    if not argv:
        parser.print_help()
        return 0
    # parse_known_args: a command whose extra is missing has no arguments defined, yet must still say why it
    # cannot run rather than reject the user's flags.
    args, unknown = _parse(parser, argv)
    if args.command is None:  # options but no command, e.g. `vit-einops -x`
        parser.error(
            f"a command is required (one of {', '.join(COMMANDS)}); unrecognized arguments: {' '.join(unknown)}"
        )
    extra = COMMANDS[args.command][1]
    missing = getattr(args, "_missing", None)
    if missing is None:
        if unknown:
            parser.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        try:
            debug = bool(getattr(args, "debug", False)) or _traceback_requested()
        except ValueError as err:
            print(f"vit-einops {args.command}: error: {printable(err)}", file=sys.stderr)
            return 2
        try:
            # The thread policy: chosen when the command's work begins (follow_free_cores), torch's count put back
            # when the command returns (tests and scripts call main in-process).
            from ..base.threads import thread_policy

            with max_memory(args.max_memory), max_build_time(args.max_build_time):
                with thread_policy(args.threads, lazy=True):
                    return importlib.import_module(args._module).run(args)
        except ModuleNotFoundError as err:  # commands that import their extra only when they run
            if not _optional_missing(err, extra):
                if debug:
                    raise
                return _internal_error(args.command, err)
            missing = err.name
        except Exception as err:
            if debug:
                raise
            message = _user_error(err)
            if message is None:
                return _internal_error(args.command, err)
            # Our messages name the value and what was expected, so the message is the answer; a traceback would
            # bury it. Line breaks of our own (a state dict's missing keys, one per line) are kept.
            print(f"vit-einops {args.command}: error: {printable_lines(message)}", file=sys.stderr)
            return 2
    print(
        f"vit-einops {args.command}: the optional dependency {missing!r} is not installed; "
        f"install it with: pip install 'vit-einops[{extra}]'",
        file=sys.stderr,
    )
    return 2


def _internal_error(command: str, err: BaseException) -> int:
    print(
        f"vit-einops {command}: internal error: {type(err).__name__}: {printable(err)} "
        "(run with --debug for the traceback)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
