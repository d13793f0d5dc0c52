"""One benchmark run: the machine header, the matmul ceiling, the attention grid, the models, then the files."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from tqdm import tqdm

from ..base.budget import limit_text
from ..base.io import check_directory_output, staged_directory
from ..base.text import printable
from ..base.threads import ThreadPolicy, check_threads, thread_policy
from ..network.config import ViTConfig
from ..network.kernels import KERNELS, check_kernel_runs
from ..network.sizes import parameter_count
from ..presets import preset_config
from . import plots, report
from .attention import CompiledPath, grid, measure_point
from .budget import check_grid_memory, einsum_memory_tokens
from .device import Meter, check_device, check_dtype
from .env import machine_info
from .measure import matmul_ceiling
from .model import measure_model
from .names import (
    COMPILED_PATHS, DTYPES, MODEL_MODES, MODES, RANGES, REFERENCE_KERNEL, check_in_range, core_paths, layer_paths,
    model_paths,
)  # fmt: skip
from .noise import LoadProbe, machine_verdict, noise_score, summary
from .overhead import measure_overhead


@dataclass
class BenchOptions:
    """Everything a run measures; the named grids below are presets of it."""

    attention: bool = True  # run the attention grid
    batches: tuple[int, ...] = (1,)  # --batches 1,8,32 for the large ones: batch 32 at N 1025 takes minutes
    heads: tuple[int, ...] = (12,)  # ViT-B's h and D_h: the shapes users run
    tokens: tuple[int, ...] = (50, 197, 577, 1025)  # 32/16, 224/16, 384/16, 512/16 images, class token included
    head_dims: tuple[int, ...] = (64,)
    modes: tuple[str, ...] = MODES
    core_paths: tuple[str, ...] | None = None  # None: every one whose kernel runs on device in dtype
    layer_paths: tuple[str, ...] | None = None  # None: every one whose kernel runs on device in dtype
    compile_skip_reason: str | None = None  # set: the compiled paths are not attempted, and their rows say this
    models: tuple[str, ...] = ("vit_ti_16", "vit_s_16", "vit_b_16")
    model_paths: tuple[str, ...] | None = None  # None: every one whose kernel runs on device in dtype
    model_modes: tuple[str, ...] = MODEL_MODES
    model_batch: int = 1
    model_overrides: dict = field(default_factory=dict)  # ViT keywords applied to every preset (smoke: depth)
    image_size: int = 224
    rounds: int = 3  # interleaved rounds of blocked_autorange per path
    min_run_time: float = 0.1  # seconds per blocked_autorange round
    ceiling_size: int = 2048
    ceiling_run_time: float = 1.0  # seconds of each matmul ceiling: the window whose CPU time says who else ran
    dtype: str = "float32"  # of DTYPES; a half dtype only where the device has hardware for it (device.check_dtype)
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    out: Path = field(default_factory=lambda: Path("bench-results"))
    retries: int = 0  # measure a grid point again (at most this often) while any of its rows is noisy
    threads: int | None = None  # torch threads; None: the cores free, followed between jobs (base.threads)
    force: bool = False  # replace ``out`` when it holds an earlier run's files (and nothing else)
    progress: bool = True  # the bar on stderr (tqdm; shown only where stderr is a terminal)

    def __post_init__(self) -> None:
        """Every numeric option finite and in RANGES, every name known: errors name the option and the value."""
        for f in fields(self):
            if f.name not in RANGES:
                continue
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            if isinstance(value, tuple) and not value:
                raise ValueError(f"{f.name} is empty; expected at least one value")
            for v in values:
                check_in_range(f.name, v, float if f.name in ("min_run_time", "ceiling_run_time") else int)
        choices = {
            "modes": MODES, "core_paths": core_paths(), "layer_paths": layer_paths(), "model_paths": model_paths(),
            "model_modes": MODEL_MODES,
        }  # fmt: skip
        for name, allowed in choices.items():
            unknown = [v for v in getattr(self, name) or () if v not in allowed]
            if unknown:
                raise ValueError(
                    f"{name}: unknown {', '.join(map(str, unknown))}; expected some of {', '.join(allowed)}"
                )
        if self.threads is not None:
            check_threads("threads", self.threads)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        self.device = str(check_device(self.device))  # CUDA where there is none: refused here, saying what is missing
        device = torch.device(self.device).type
        for name, every in (("core_paths", core_paths), ("layer_paths", layer_paths), ("model_paths", model_paths)):
            if getattr(self, name) is None:
                setattr(self, name, every(device, self.dtype))
            for kernel in (p.removeprefix("mha_") for p in getattr(self, name)):
                if kernel in KERNELS:  # a kernel asked for by name that cannot run here: refused by name
                    check_kernel_runs(kernel, device, self.dtype)


# The named grids, as BenchOptions's keywords (made into options by with_overrides, so that the paths are the
# registry's at that moment).
GRIDS: dict[str, dict] = {
    # A few minutes on an idle 2-core machine, most of it the models; benchmarks/README.md has the time and memory.
    "default": {},
    "quick": dict(
        tokens=(50, 197, 577),
        compile_skip_reason="skipped in --quick: a cold torch.compile takes tens of seconds (run the default grid)",
        models=("vit_ti_16",),
        rounds=2,
        min_run_time=0.05,
        ceiling_size=1024,
    ),
    # Seconds: every code path once on tiny shapes, for CI. Numbers from it mean nothing. One batch (of 2: batched
    # shapes) is one row of plot panels; two token counts make each plotted path a line with two measured ticks.
    "smoke": dict(
        batches=(2,),
        heads=(2,),
        tokens=(9, 17),
        head_dims=(8,),
        compile_skip_reason="skipped in --smoke: compiling takes tens of seconds",
        models=("vit_ti_16",),
        model_batch=2,
        model_overrides=dict(depth=1),  # one block of ViT-Ti: every path of the model, at a fraction of the work
        image_size=32,
        rounds=1,
        min_run_time=0.001,
        ceiling_size=128,
        ceiling_run_time=0.05,
    ),
}


def result_files() -> tuple[str, ...]:
    """The files a run writes into ``out``: an ``out`` that holds anything else is never replaced."""
    return ("table.txt", "results.json", "attention.csv", "model.csv", *plots.PLOTS)


def check_out(out: Path, force: bool) -> Path:
    """Check the output directory before anything is measured (nothing is created or changed here): what the
    commit checks again (:func:`vit_einops.base.io.staged_directory`), and that it can be created.

    Refused: ``out`` is a link or not a directory (a file, a FIFO); it holds files of an earlier run unless
    ``force``; it holds anything but a run's files (of :func:`result_files`), even with ``force``, as the whole
    folder is replaced; it lies under a file or in a directory that cannot be written.
    """
    out = Path(out)
    if out.name in ("", os.pardir):  # ".", "..", "/": the folder is swapped whole, so it needs a name in its parent
        raise ValueError(f"output {out} names no directory of its own; give --out a directory's name, e.g. results")
    # the staging directory and the lock go beside ``out``: its parent (or the first that exists) must take them
    parent = next((p for p in out.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise ValueError(f"output {out} cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"output {out} cannot be written: {parent} is not writable")
    check_directory_output(out, result_files(), force)
    return out


def measure_with_retries(measure: Callable[[], list[dict]], retries: int) -> list[dict]:
    """Rows of ``measure()``; while any row is noisy, measure again (at most ``retries`` times) and keep the
    least noisy attempt (fewest noisy rows, then the smallest worst IQR/median). Each row records ``attempts``."""
    best = measure()
    attempts = 1
    while attempts <= retries and any(r["noisy"] for r in best):
        again = measure()
        attempts += 1
        if noise_score(again) < noise_score(best):
            best = again
    for r in best:
        r["attempts"] = attempts
    return best


@dataclass(frozen=True)
class Job:
    """One step of a run: an attention grid point in one mode (``paths``: {"core": (...), "layer": (...)}) or one
    model (``what``: its preset). ``drop``: rows measured only as the reference of the others' ratios (each ratio is
    over its reference in the same rounds), whose own row an earlier job already has."""

    kind: str
    what: object
    mode: str | None = None
    paths: dict = field(default_factory=dict)
    drop: tuple = ()


def plan_jobs(options: BenchOptions, points: list) -> tuple[list[Job], list[Job]]:
    """(the verdict's jobs, the rest) in the order they run. The verdict: every kernel's core path (KERNELS) at
    the grid's largest N (its first point of that N), in every mode, measured first so that the answer comes in the
    run's first minute. Then every point's other paths, the models, and last the compiled paths (a cold
    torch.compile takes tens of seconds: it comes after everything else has been measured)."""
    plain = tuple(p for p in options.core_paths if p not in COMPILED_PATHS)
    compiled = tuple(p for p in options.core_paths if p in COMPILED_PATHS)
    chosen = tuple(p for p in KERNELS if p in plain)  # every kernel of the registry is in the verdict
    first = None
    if points and REFERENCE_KERNEL in chosen and len(chosen) > 1:
        first = max(points, key=lambda p: p.tokens)  # max keeps the first of equals
    verdict = [Job("attention", first, mode, {"core": chosen}) for mode in options.modes] if first else []
    rest = []
    for point in points:
        core, drop = plain, ()
        if point == first:
            left = [p for p in plain if p not in chosen]
            core = tuple(p for p in plain if p in left or (left and p == REFERENCE_KERNEL))
            drop = (("core", REFERENCE_KERNEL),)
        if core or options.layer_paths:
            rest += [Job("attention", point, mode, {"core": core, "layer": options.layer_paths}, drop)
                     for mode in options.modes]  # fmt: skip
    rest += [Job("model", name) for name in options.models]
    if compiled:
        reference = (REFERENCE_KERNEL,) if REFERENCE_KERNEL in plain and options.compile_skip_reason is None else ()
        drop = (("core", REFERENCE_KERNEL),) if reference else ()
        rest += [Job("attention", point, mode, {"core": (*reference, *compiled)}, drop)
                 for point in points for mode in options.modes]  # fmt: skip
    return verdict, rest


# The progress bar's guesses (its time left corrects itself as jobs end): the share of the matmul ceiling a path
# reaches, the extra calls of each path (a warm-up, the kernel's profile, the peak memory), a cold compile.
CEILING_SHARE_GUESS = 0.3
EXTRA_CALLS = 3
COMPILE_GUESS_S = 30.0


def job_cost(job: Job, options: BenchOptions, ceiling_gflop_per_s: float) -> float:
    """The seconds ``job`` is guessed to take, from its FLOPs and the run's matmul ceiling: each path's rounds of at
    least min_run_time (a call longer than that is one block), and its extra calls."""
    rate = ceiling_gflop_per_s * 1e9 * CEILING_SHARE_GUESS

    def paths_cost(count: int, flops: float) -> float:
        call = flops / rate
        return count * (options.rounds * max(options.min_run_time, call) + EXTRA_CALLS * call)

    if job.kind == "model":
        config = ViTConfig(**preset_config(job.what, image_size=options.image_size, **options.model_overrides))
        forward = 2 * parameter_count(config) * config.num_tokens * options.model_batch  # a multiply-add per weight
        return sum(paths_cost(len(options.model_paths), forward * (3 if mode == "train_step" else 1))
                   for mode in options.model_modes)  # fmt: skip
    cost = sum(paths_cost(len(paths), job.what.flops(section, job.mode)) for section, paths in job.paths.items())
    compiled = sum(p in COMPILED_PATHS for p in job.paths.get("core", ()))
    point = job.what
    first = (point.batch, point.heads, point.tokens) == (options.batches[0], options.heads[0], options.tokens[0])
    if compiled and first and options.compile_skip_reason is None:
        cost += compiled * COMPILE_GUESS_S  # the first point of a head size compiles (dynamic shapes after it)
    return cost


def _row_order(row: dict) -> tuple:
    """The tables' order: section, mode, then the grid's order of points, then the paths' order in names.py."""
    paths = core_paths() if row["section"] == "core" else layer_paths()
    return (
        row["section"] != "core", MODES.index(row["mode"]), row["heads"], row["head_dim"], row["batch"],
        row["tokens"], paths.index(row["path"]),
    )  # fmt: skip


def run(options: BenchOptions, stdout=None, probe: LoadProbe | None = None) -> dict:
    """Measure everything ``options`` asks for, print the table (to ``stdout``, default sys.stdout), write the
    files; returns the results dict. ``probe`` samples the machine (default: this one's; tests script it).

    The run uses ``options.threads`` torch threads (else VIT_EINOPS_THREADS), or as many as the cores free at its
    start, checked again between grid points (on a shared machine a thread more than the free cores waits at every
    barrier for a core; :mod:`vit_einops.base.threads`), and restores torch's thread count at its end. A noisy run
    says so once before its rows, as soon as it knows (the machine busy during the first ceiling, the first noisy
    row, or at the latest the run's noise report), and gives the noise report again after the tables."""
    out = check_out(options.out, options.force)  # before anything is measured
    check_grid_memory(options)
    meter = Meter(options.device)
    check_dtype(options.dtype, meter.device)
    with thread_policy(options.threads) as policy:
        return _run(options, out, stdout or sys.stdout, probe or LoadProbe(), policy, meter)


def _run(options: BenchOptions, out: Path, stdout, probe: LoadProbe, policy: ThreadPolicy, meter: Meter) -> dict:
    dtype = getattr(torch, options.dtype)
    started = time.perf_counter()
    source = policy.source if policy.fixed is not None else f"the cores free: {policy.source}; --threads fixes it"
    meta = {**machine_info(), **meter.describe(), "threads_source": source, "dtype": options.dtype}
    meta["options"] = _jsonable(asdict(options))
    threads = torch.get_num_threads()
    # The matmul ceilings at the start and at the end are the run's own check of the machine: windows of busy
    # threads with no compiling in them (inductor compiles in worker processes, which would read as others), whose
    # CPU time says whether other processes were running; without /proc/stat, the load at the run's start and end.
    before = probe.sample()
    start_ceiling = matmul_ceiling(dtype, options.ceiling_size, options.ceiling_run_time, meter.device, meter.time)
    after = probe.sample()
    start_cpu = probe.cpu_use(before, after)
    meta["others_cores"] = None if start_cpu is None else round(start_cpu.others_cores, 2)
    start_busy = machine_verdict(
        (meta["load_average"][0], after.load),
        threads,
        probe.cpu_count,
        running_s=(0.0, after.running_s),
        cpu=start_cpu,
    )
    print(report.header_text(meta, start_ceiling), file=stdout, flush=True)
    announced = start_busy.noisy  # the noisy verdict is printed once before the rows, as soon as it is known
    if start_busy.noisy:
        print(report.early_noise_text(["the machine is busy: " + "; ".join(start_busy.reasons)]), file=stdout)

    points = grid(options.batches, options.heads, options.tokens, options.head_dims) if options.attention else []
    verdict_jobs, jobs = plan_jobs(options, points)
    compiled: dict[int, dict[str, CompiledPath]] = {}  # head_dim -> path -> its compiled function
    first_calls = []
    attention_rows: list[dict] = []
    unavailable_rows: list[dict] = []  # a path refused at a point: the reason, no timing
    model_rows: list[dict] = []

    def measure(job: Job) -> list[dict]:
        """The job's rows, each with its attempts; the attention rows and refusals filed, the first calls noted."""
        nonlocal announced
        if job.kind == "model":
            rows = measure_with_retries(
                lambda: measure_model(
                    job.what, options.model_batch, dtype, options.model_paths, options.model_modes,
                    options.rounds, options.min_run_time, options.image_size,
                    options.model_overrides, probe, meter,
                ),
                options.retries,
            )  # fmt: skip
            model_rows.extend(rows)
        else:
            point = job.what
            if any(p in COMPILED_PATHS for p in job.paths.get("core", ())) and point.head_dim not in compiled:
                compiled[point.head_dim] = {
                    path: CompiledPath(path, point.head_dim, dtype, options.compile_skip_reason)
                    for path in COMPILED_PATHS
                    if path in options.core_paths
                }
            rows = measure_with_retries(
                lambda: measure_point(
                    point, job.mode, dtype, job.paths, compiled.get(point.head_dim, {}), options.rounds,
                    options.min_run_time, probe, meter,
                ),
                options.retries,
            )  # fmt: skip
            rows = [r for r in rows if (r["section"], r["path"]) not in job.drop]
            attention_rows.extend(r for r in rows if "unavailable" not in r)
            unavailable_rows.extend(r for r in rows if "unavailable" in r)
            first_calls.extend(
                dict(path=r["path"], mode=job.mode, batch=point.batch, tokens=point.tokens, seconds=r["first_call_s"])
                for r in rows
                if r.get("first_call_s") is not None
            )
        noisy = [r for r in rows if r.get("noisy")]
        if noisy and not announced:  # above the progress bar, long before the tables
            tqdm.write(report.early_noise_text([f"{_row_name(noisy[0])}: {noisy[0]['noise']}"]), file=stdout)
            announced = True
        meter.release()
        policy.follow()  # between grid points: the cores other processes left free now
        return rows

    # The verdict first: every kernel at the grid's largest N, a few seconds; then the rest.
    verdict = None
    if verdict_jobs:
        point = verdict_jobs[0].what
        print(
            f"Measuring {', '.join(verdict_jobs[0].paths['core'])} at N {point.tokens} first, for the verdict; the "
            "rest of the grid follows it.",
            file=stdout, flush=True,
        )  # fmt: skip
        verdict_rows = [r for job in verdict_jobs for r in measure(job) if "unavailable" not in r]
        oom = {
            job.mode: einsum_memory_tokens(point.batch, point.heads, point.head_dim, job.mode, dtype.itemsize)
            for job in verdict_jobs
        }
        for r in verdict_rows:
            r["ceiling_fraction"] = r["gflop_per_s"] / start_ceiling["gflop_per_s"]
        verdict = report.verdict_text(verdict_rows, start_ceiling["gflop_per_s"], oom, limit_text())
        print("\n" + verdict + "\n", file=stdout, flush=True)
    # A fraction of a second: right after the verdict, as part of the answer a newcomer reads first.
    overhead = measure_overhead(dtype, options.rounds, options.min_run_time, meter)
    print(report.overhead_text(overhead) + "\n", file=stdout, flush=True)
    costs = [job_cost(job, options, start_ceiling["gflop_per_s"]) for job in jobs]
    progress = tqdm(
        total=sum(costs), file=sys.stderr, dynamic_ncols=True, disable=None if options.progress else True,
        desc="vit-einops bench", bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} so far, {remaining} left",
    )  # fmt: skip
    with progress:
        for job, cost in zip(jobs, costs, strict=True):
            measure(job)
            progress.update(cost)
    if any(c.fn is not None for by_path in compiled.values() for c in by_path.values()):
        for c in (c for by_path in compiled.values() for c in by_path.values()):
            c.fn = None  # the CompiledPath records stay: their skip reasons go into results.json
        torch.compiler.reset()
    attention_rows.sort(key=_row_order)
    unavailable_rows.sort(key=_row_order)
    # Measured again at the end: other processes on the machine lower a single measurement, never raise it,
    # so the better of the two is the ceiling every row is a fraction of.
    before = probe.sample()
    end_ceiling = matmul_ceiling(dtype, options.ceiling_size, options.ceiling_run_time, meter.device, meter.time)
    end_cpu = probe.cpu_use(before, probe.sample())
    ceiling = dict(
        max(start_ceiling, end_ceiling, key=lambda c: c["gflop_per_s"]),
        start_gflop_per_s=start_ceiling["gflop_per_s"],
        end_gflop_per_s=end_ceiling["gflop_per_s"],
    )
    for r in attention_rows + model_rows:
        r["ceiling_fraction"] = r["gflop_per_s"] / ceiling["gflop_per_s"]

    skip_reasons = sorted({c.skip_reason for by_path in compiled.values() for c in by_path.values() if c.skip_reason})
    compile_info = dict(
        attempted=bool(points)
        and any(p in options.core_paths for p in COMPILED_PATHS)
        and options.compile_skip_reason is None,
        skip_reason="; ".join(skip_reasons) or None,
        first_calls=first_calls,
        total_first_call_s=sum(c["seconds"] for c in first_calls),
        first_call_s_by_path={
            path: sum(c["seconds"] for c in first_calls if c["path"] == path)
            for path in dict.fromkeys(c["path"] for c in first_calls)
        },
    )
    meta["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["others_cores_end"] = None if end_cpu is None else round(end_cpu.others_cores, 2)
    run_cpu = start_cpu + end_cpu if start_cpu is not None and end_cpu is not None else None
    meta["busy_measure"] = "load_average" if run_cpu is None else "cpu_time"
    meta["cpu_windows"] = None if run_cpu is None else [asdict(start_cpu), asdict(end_cpu)]
    meta["wall_s"] = time.perf_counter() - started
    noise = summary(
        attention_rows + model_rows,
        (meta["load_average"][0], meta["load_average_end"][0]),
        threads,
        probe.cpu_count,
        running_s=(0.0, meta["wall_s"]),
        cpu=run_cpu,
        at_start=start_busy,
        most_threads=max(policy.used),
    )
    meta["noisy"] = noise["noisy"]
    meta["threads_used"] = list(policy.used)
    results = dict(
        schema=report.SCHEMA_VERSION, meta=meta, noisy=noise["noisy"], noise=noise, verdict=verdict,
        overhead=overhead, matmul_ceiling=ceiling,
        compile=compile_info, attention=attention_rows, attention_unavailable=unavailable_rows, model=model_rows,
    )  # fmt: skip
    notes = [
        report.unresolved_note(attention_rows + model_rows),
        report.ceiling_note(attention_rows + model_rows, ceiling, options.dtype),
    ]
    body = "\n".join(
        [_compile_text(compile_info)]
        + ([report.attention_table(attention_rows, unavailable_rows)] if attention_rows or unavailable_rows else [])
        + ([report.model_table(model_rows)] if model_rows else [])
        + [note for note in notes if note]
    )
    if noise["noisy"] and not announced:  # known only now (the machine busy at the end): still before the rows
        print(report.early_noise_text(noise["reasons"]), file=stdout)
    print(body, file=stdout)  # the header was printed before the progress bar
    # table.txt: the header as it stands at the end (the better ceiling, the load at the end), the verdict and the
    # overhead as printed, then the body.
    table = (report.header_text(meta, ceiling, noise) + "\n" + (f"\n{verdict}\n" if verdict else "")
             + f"\n{report.overhead_text(overhead)}\n\n" + body)  # fmt: skip
    # Written as one unit: a run that fails part-way (a full disk) leaves the earlier run's folder as it was, or no
    # folder; what is at ``out`` is checked again at the commit (a link, a file or foreign files are never replaced).
    with staged_directory(out, owned=result_files(), replace=options.force) as staging:
        report.write_text(staging / "table.txt", table + "\n", replace=False)
        report.write_json(staging / "results.json", results, replace=False)
        if attention_rows:
            report.write_csv(staging / "attention.csv", attention_rows, report.ATTENTION_FIELDS, replace=False)
        if model_rows:
            report.write_csv(staging / "model.csv", model_rows, report.MODEL_FIELDS, replace=False)
        written_plots = plots.save_figures(staging, plots.figures(attention_rows, model_rows), replace=False)
        written = sorted(entry.name for entry in staging.iterdir())
    if noise["noisy"]:
        print("\n" + report.noise_text(noise), file=stdout)
    wrote = report.wrote_text(written, printable(out), meta["wall_s"], len(written_plots), policy.describe())
    print("\n" + wrote, file=stdout)
    return results


def _row_name(row: dict) -> str:
    """Which measurement a row is, in the table's words: "attention core forward b 1 h 12 n 50 d 64 einsum"."""
    if "section" in row:
        return (
            f"attention {row['section']} {row['mode']} b {row['batch']} h {row['heads']} n {row['tokens']} "
            f"d {row['head_dim']} {row['path']}"
        )
    return f"{row['model']} {row['mode']} {row['path']}"


def _compile_text(info: dict) -> str:
    """The compiled paths' line, then a row per path with its first calls' seconds (compile included)."""
    if not info["attempted"] or info["skip_reason"]:
        return f"torch.compile of the einsum path and flex_attention: {info['skip_reason'] or 'not requested'}"
    rows = [
        f"  {path:<16}{seconds:>8.1f} s over {sum(c['path'] == path for c in info['first_calls'])} first calls"
        for path, seconds in info["first_call_s_by_path"].items()
    ]
    line = (
        f"torch.compile of the einsum path and flex_attention, measured last: {len(info['first_calls'])} first "
        f"calls (compile included, not in the timings) took {info['total_first_call_s']:.1f} s in all"
    )
    return "\n".join([textwrap.fill(line, report.TABLE_WIDTH), *rows])


def _jsonable(options: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}


def with_overrides(grid_name: str, **overrides) -> BenchOptions:
    """The named grid with every non-None override applied."""
    return BenchOptions(**{**GRIDS[grid_name], **{k: v for k, v in overrides.items() if v is not None}})
