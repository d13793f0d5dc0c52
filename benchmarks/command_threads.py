"""Four commands on a shared machine: their time at the thread policy's default against each fixed thread count,
quiet and beside one busy process.

    python benchmarks/command_threads.py --out command_threads.json   # about 6 minutes on an idle 2-core machine
    python benchmarks/command_threads.py --repeats 3 --out command_threads.json          # each time a median of 3
    python benchmarks/command_threads.py --smoke                      # CI: tiny sizes, one repetition, no goals

Untimed first, in a temporary folder: a digits model trained for a few epochs, and test digits written as PNG files.
Then, timed, on that model: ``faithfulness``, ``inspect``, ``explore`` (on the PNG folder) and ``train`` (the
digits, from scratch), at the sizes of SIZES (each about 5 to 15 s on one idle core). Each run is a fresh process
that times ``vit_einops.commands.cli.main`` alone (the imports take the same time at any thread count), with
VIT_EINOPS_THREADS unset: at the policy's default (no --threads) and at each --threads 1 to the CPUs (--max-threads
lowers the largest; --threads at the CPUs is torch's own default count, what the commands used before the policy).
``--smoke`` runs the commands in this process instead, at tiny sizes: its times mean nothing.

Conditions: quiet (no process started by this script; the default only), then busy: one Python loop
(vit_einops.bench.busy) beside every run, started before the condition's first run and stopped after its last, also
on Ctrl-C, SIGTERM or a failed run, and ending by itself if this script is killed. ``--repeats R`` runs all of it R
times in turn; each time is then the median of its R runs.

The table: per command, the quiet time at the default, the busy time at the default and the counts the policy used,
the fastest fixed count beside the busy process and its time, the default's time over that one's (goal: at most
1.25) and the busy default's over the quiet one (goal: at most 2, one of two cores being gone); above it the CPU
model and the load average at the start. ``--out`` (written atomically) keeps every run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import vit_einops
from vit_einops.base.io import write_file
from vit_einops.base.text import printable
from vit_einops.base.threads import ENV_VAR
from vit_einops.bench.busy import (
    BUSY_LIMIT_S, Terminated, add_out_arguments, check_busy, guarded, start_busy, stop,
)  # fmt: skip
from vit_einops.bench.env import machine_info
from vit_einops.commands.bench import number_arg
from vit_einops.commands.cli import main as cli_main

COMMANDS = ("faithfulness", "inspect", "explore", "train")
DEFAULT_GOAL = 1.25  # the default's time beside one busy process over the best fixed count's there
QUIET_GOAL = 2.0  # the default's time beside one busy process over its quiet time
TABLE_WIDTH = 120
# Per size: the setup's training, the digits written for explore, and each timed command's own arguments.
SIZES = {
    "full": dict(
        setup=["--epochs", "3"],
        digits=128,
        faithfulness=["--num-images", "40"],
        inspect=["--num-images", "12", "--distance-images", "1000"],
        explore=[],
        train=["--epochs", "6"],
    ),
    "smoke": dict(
        setup=["--limit", "96", "--epochs", "1"],
        digits=1,
        faithfulness=["--num-images", "2", "--methods", "rollout", "--steps", "2"],
        inspect=["--num-images", "1", "--distance-images", "2", "--arrays", "none"],
        explore=["--top-k", "1"],
        train=["--limit", "96", "--epochs", "1"],
    ),
}
MARK = "command_threads seconds:"  # the child's last line: the seconds cli.main took
CHILD = f"""import sys, time
from vit_einops.commands.cli import main
start = time.perf_counter()
code = main(sys.argv[1:])
print("\\n{MARK}", repr(time.perf_counter() - start))
sys.exit(code)
"""
THREADS = re.compile(r"threads: ([0-9]+(?:, then [0-9]+)*) \(")  # base.threads' summary: "threads: 2, then 1 (..."


def command_argv(command: str, work: Path, out: Path, sizes: dict) -> list[str]:
    """The command line of one timed run: on the setup's model, writing under ``out`` (a new folder per run)."""
    model = str(work / "setup" / "model.safetensors")
    return {
        "faithfulness": ["faithfulness", model, "--out", str(out), "--no-progress"],
        "inspect": ["inspect", model, "--out", str(out)],
        "explore": ["explore", model, "--images", str(work / "digits"), "--out", str(out / "explore.html")],
        "train": ["train", "--out", str(out), "--no-progress"],
    }[command] + sizes[command]


@contextlib.contextmanager
def unset_threads_variable() -> Iterator[None]:
    """VIT_EINOPS_THREADS unset within the block (so the default is the policy's), put back after."""
    value = os.environ.pop(ENV_VAR, None)
    try:
        yield
    finally:
        if value is not None:
            os.environ[ENV_VAR] = value


def run_in_child(argv: list[str], timeout: float) -> tuple[float, str]:
    """(the seconds cli.main took, its stdout) in a fresh process importing this script's vit_einops."""
    root = str(Path(vit_einops.__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True,
                            timeout=timeout)  # fmt: skip
    if result.returncode:
        last = (result.stderr.strip().splitlines() or ["(no error output)"])[-1]
        raise RuntimeError(f"{' '.join(argv[:1])} exited with status {result.returncode}: {printable(last)}")
    lines = [line for line in result.stdout.splitlines() if line.startswith(MARK)]
    return float(lines[-1].removeprefix(MARK)), result.stdout


def run_in_process(argv: list[str], timeout: float) -> tuple[float, str]:
    """(the seconds cli.main took, its stdout) in this process (--smoke; ``timeout`` unused: tiny sizes)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with unset_threads_variable(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        start = time.perf_counter()
        code = cli_main(argv)
        seconds = time.perf_counter() - start
    if code:
        last = (stderr.getvalue().strip().splitlines() or ["(no error output)"])[-1]
        raise RuntimeError(f"{argv[0]} exited with status {code}: {printable(last)}")
    return seconds, stdout.getvalue()


def threads_used(stdout: str) -> str:
    """The counts the run's thread policy used, from the command's summary line ("2, then 1"); "?" without one."""
    found = THREADS.findall(stdout)
    return found[-1] if found else "?"


def setup(work: Path, sizes: dict, run: Callable[[list[str], float], tuple[float, str]], timeout: float) -> None:
    """The model every timed run reads, and the test digits explore draws (PNG files), in ``work``."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    run(["train", *sizes["setup"], "--out", str(work / "setup"), "--no-progress", "--threads", "1"], timeout)
    (work / "digits").mkdir()
    images = load_digits().images  # 8x8 grey, 0..16
    for i in range(sizes["digits"]):
        pixels = (images[-1 - i] * (255 / 16)).round().astype(np.uint8)
        Image.fromarray(pixels, "L").save(work / "digits" / f"{i:03d}.png")


def settings(condition: str, counts: int) -> list[str]:
    """The thread settings timed in a condition: the default, and beside the busy process each fixed count."""
    return ["default"] if condition == "quiet" else ["default", *map(str, range(1, counts + 1))]


def measure(args: argparse.Namespace, counts: int, stdout) -> dict:
    """Every run (quiet first, then busy; all of it ``args.repeats`` times); returns the record of every run."""
    sizes = SIZES["smoke" if args.smoke else "full"]
    run = run_in_process if args.smoke else run_in_child
    records = []
    with tempfile.TemporaryDirectory(prefix="command-threads-") as folder:
        work = Path(folder)
        setup(work, sizes, run, args.timeout)
        for repeat in range(args.repeats):
            for condition in ("quiet", "busy"):
                started = time.monotonic()
                processes = start_busy(1, args.busy_limit) if condition == "busy" else []
                try:
                    if processes:
                        time.sleep(0.2)  # the busy loop running before the first run
                    for command in args.commands:
                        for setting in settings(condition, counts):
                            out = work / "out" / f"{command}-{condition}-{setting}-{repeat}"
                            out.mkdir(parents=True)
                            argv = command_argv(command, work, out, sizes)
                            argv += [] if setting == "default" else ["--threads", setting]
                            load = os.getloadavg()[0]
                            seconds, printed = run(argv, args.timeout)
                            used = threads_used(printed)
                            records.append(dict(
                                command=command, condition=condition, threads=setting, repeat=repeat,
                                seconds=seconds, threads_used=used, load_before=round(load, 2),
                            ))  # fmt: skip
                            print(f"  {command:<13}{condition:<6}{setting:>8}{seconds:>9.2f} s  threads used {used}",
                                  file=stdout, flush=True)  # fmt: skip
                    check_busy(processes, args.busy_limit, time.monotonic() - started)
                finally:
                    stop(processes)
    return dict(runs=records)


def summarize(runs: list[dict], commands: tuple[str, ...], counts: int) -> list[dict]:
    """One row per command from its runs: the median time of each (condition, setting), the best fixed count beside
    the busy process, and the two ratios with whether each meets its goal."""

    def median(command: str, condition: str, setting: str) -> float:
        return statistics.median(r["seconds"] for r in runs if (r["command"], r["condition"], r["threads"]) ==
                                 (command, condition, setting))  # fmt: skip

    rows = []
    for command in commands:
        quiet, busy = median(command, "quiet", "default"), median(command, "busy", "default")
        fixed = {count: median(command, "busy", str(count)) for count in range(1, counts + 1)}
        best = min(fixed, key=fixed.get)
        used = [r["threads_used"] for r in runs if (r["command"], r["condition"], r["threads"]) ==
                (command, "busy", "default")]  # fmt: skip
        rows.append(dict(
            command=command, quiet_s=quiet, busy_s=busy, busy_threads_used=used, fixed_busy_s=fixed,
            best_fixed=best, best_fixed_s=fixed[best], default_over_best=busy / fixed[best],
            busy_over_quiet=busy / quiet, meets_default_goal=busy / fixed[best] <= DEFAULT_GOAL,
            meets_quiet_goal=busy / quiet <= QUIET_GOAL,
        ))  # fmt: skip
    return rows


def check_rows(rows: list[dict], commands: tuple[str, ...], counts: int) -> None:
    """The table's shape: a row per command in order, a time for each fixed count, every time and ratio a finite
    number above 0; a RuntimeError saying what is missing (no timing goal: --smoke's times mean nothing)."""
    if [r["command"] for r in rows] != list(commands):
        raise RuntimeError(f"the table's rows are {[r['command'] for r in rows]}, expected {list(commands)}")
    for r in rows:
        numbers = [r["quiet_s"], r["busy_s"], r["default_over_best"], r["busy_over_quiet"], *r["fixed_busy_s"].values()]
        if list(r["fixed_busy_s"]) != list(range(1, counts + 1)) or not all(0 < x < float("inf") for x in numbers):
            raise RuntimeError(f"{r['command']}: a time or ratio is missing or not a positive number: {r}")


def table_text(rows: list[dict], meta: dict) -> str:
    """The table, every line within TABLE_WIDTH: the machine and the load first, then a row per command."""
    load = ", ".join(f"{x:.2f}" for x in meta["load_average"])
    head = textwrap.wrap(
        f"{meta['cpu_model']} ({meta['cpu_count']} CPUs); load average at the start {load}; torch {meta['torch']}; "
        f"each time the median of {meta['repeats']} run{'s' if meta['repeats'] > 1 else ''}; seconds of cli.main "
        "(imports excluded)",
        TABLE_WIDTH,
    )
    default_goal, quiet_goal = f"default/best (goal <= {DEFAULT_GOAL:g})", f"busy/quiet (goal <= {QUIET_GOAL:g})"
    columns = (f"{'command':<13}{'quiet s':>8}{'busy s':>8}{'used':>9}{'best fixed':>11}{'its s':>8}"
               f"{default_goal:>30}{quiet_goal:>27}")  # fmt: skip
    lines = [*head, "", columns]
    for r in rows:
        used = ";".join(dict.fromkeys(u.replace(", then ", ">") for u in r["busy_threads_used"]))  # each once
        default_mark = "ok" if r["meets_default_goal"] else "OVER"
        quiet_mark = "ok" if r["meets_quiet_goal"] else "OVER"
        lines.append(
            f"{r['command']:<13}{r['quiet_s']:>8.2f}{r['busy_s']:>8.2f}{used:>9}{r['best_fixed']:>11}"
            f"{r['best_fixed_s']:>8.2f}{r['default_over_best']:>25.2f} {default_mark:<4}"
            f"{r['busy_over_quiet']:>22.2f} {quiet_mark:<4}"
        )
    lines.append(textwrap.fill(
        "busy: beside one busy process; used: the counts the default chose there (2>1: 2, then 1); best fixed: the "
        "fastest --threads N there.", TABLE_WIDTH,
    ))  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=number_arg("repeats", int, (1, 100)), default=1,
                        help="times every run is repeated (in turn); each time is the median")  # fmt: skip
    parser.add_argument("--commands", type=commands_arg, default=COMMANDS,
                        help=f"some of {','.join(COMMANDS)} (default: all)")  # fmt: skip
    parser.add_argument("--max-threads", type=number_arg("max_threads", int, (1, os.cpu_count() or 1)),
                        help="the largest fixed count timed (default: the CPUs)")  # fmt: skip
    parser.add_argument("--timeout", type=number_arg("timeout", float, (1.0, 86_400.0)), default=900.0,
                        help="seconds one run may take before the script stops")  # fmt: skip
    parser.add_argument("--busy-limit", type=number_arg("busy_limit", float, BUSY_LIMIT_S), default=7200.0,
                        help="seconds the busy process lives at most")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes in this process: checks the script, no goals")
    add_out_arguments(parser, "every run and row")
    args = parser.parse_args(argv)
    try:
        with guarded(args.out, args.force):
            info = machine_info()
            counts = args.max_threads or info["cpu_count"]
            meta = dict(info, load_average=list(os.getloadavg()), repeats=args.repeats, smoke=args.smoke,
                        commands=list(args.commands), fixed_counts=counts)  # fmt: skip
            started = time.monotonic()
            record = measure(args, counts, sys.stdout)
            rows = summarize(record["runs"], args.commands, counts)
            check_rows(rows, args.commands, counts)
            meta.update(wall_s=time.monotonic() - started, load_average_end=list(os.getloadavg()))
            print("\n" + table_text(rows, meta))
            if args.out:
                data = json.dumps(dict(meta=meta, rows=rows, **record), indent=1) + "\n"
                write_file(args.out, data.encode(), replace=args.force)
    except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired) as error:
        parser.error(printable(error))
    except Terminated as signal_name:  # the busy process was stopped on the way here
        print(f"{parser.prog}: stopped by {signal_name}; its busy process was ended", file=sys.stderr)
        return 143
    return 0


def commands_arg(text: str) -> tuple[str, ...]:
    """argparse type of --commands: a comma-separated subset of COMMANDS, each once."""
    names = tuple(n.strip() for n in text.split(","))
    unknown = [n for n in names if n not in COMMANDS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(COMMANDS)}, each once, got {text!r}")
    return names


if __name__ == "__main__":
    sys.exit(main())
