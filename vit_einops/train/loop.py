"""The training loop: the paper's recipe (Table 3) at small scale, on one process or many under torchrun.

Recipe: AdamW (beta1 0.9, beta2 0.999), linear warm-up then cosine decay, gradient clipping at global norm 1,
dropout from the model config, optional label smoothing.

Determinism: the model is initialised under ``torch.manual_seed(seed)`` by the caller; at the start of every
epoch the shuffling order is a function of (seed, epoch) (``DistributedSampler.set_epoch``) and the global RNG
that drives dropout is reseeded from (seed, epoch, rank). The random state at an epoch boundary is thus fully
determined by numbers the checkpoint records, for every rank, so a resumed run repeats an uninterrupted one
bit for bit without saving per-rank generator states that rank 0 could not see. A caller's DataLoader that
shuffles from the global RNG is reseeded with it; one with its own generator is not (see ``data.Batches``).

Crash safety: checkpoint.json is the one commit point and holds every epoch's record; metrics.jsonl and
model.safetensors are rewritten from it after each commit and on resume, so a kill at any moment loses no epoch.
Every write is announced in the run's manifest first (``rundir.RunDir.record``), so that whatever a kill leaves is
provably ours.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..base.checks import INT64_MAX, check_nonnegative_float, check_positive_int
from ..base.device import resolve_device
from ..base.io import atomic_write_bytes
from ..base.text import printable
from ..base.threads import follow_free_cores
from ..network.model import ViT
from ..modelfile import model_metadata
from ..statedict import safetensors_bytes
from .checkpoint import DTYPE, checkpoint_files, load_checkpoint, restore_training, weights_bytes, write_checkpoint
from .config import MAX_WARMUP_FRACTION, SAVE_INTERVAL, TrainConfig
from .data import Batches, class_names_of, eval_batches
from .rundir import (
    CHECKPOINT_DIR,
    COMMITTED,
    CONFUSION_NAME,
    CURVES_NAME,
    METRICS_NAME,
    MODEL_NAME,
    SUMMARY_NAME,
    CheckpointError,
    RunDir,
)


class WarmupCosine:
    """LR factor at optimizer step t: t / warmup during warm-up, then cosine from 1 down to 0 at ``total`` steps.

    A class rather than a lambda so that LambdaLR's state_dict records its numbers (it skips plain functions).
    """

    def __init__(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps  # the first update already moves: lr > 0 at step 0
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class Distributed:
    """Where this process sits: rank, world size, device. world_size 1 means a plain single-process run."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init_distributed() -> Distributed:
    """Join the process group torchrun describes in the environment (gloo on CPU, nccl on GPU), if any."""
    world_size = _environ_int("WORLD_SIZE", "1", 1, INT64_MAX, "a positive integer")
    if world_size == 1:
        return Distributed(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    ranks = f"an integer in [0, {world_size - 1}] (WORLD_SIZE is {world_size})"
    _environ_int("RANK", None, 0, world_size - 1, ranks)  # read by init_process_group, whose errors name no value
    local_rank = _environ_int("LOCAL_RANK", "0", 0, world_size - 1, ranks)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return Distributed(dist.get_rank(), dist.get_world_size(), device)


def _environ_int(name: str, default: str | None, low: int, high: int, expected: str) -> int:
    """The integer torchrun set in the variable ``name`` (``default`` when unset; None: it must be set), in [low,
    high]; else a ValueError naming the variable, its value and ``expected``. Digits only: int() would also take
    " 2", "+2" and "1_0"."""
    text = os.environ.get(name, default)
    if text is None:
        raise ValueError(f"{name} is not set; expected {expected}, as torchrun sets it")
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None
    if value is None or not low <= value <= high:
        raise ValueError(f"{name}={text[:100]!r} is not {expected}")
    return value


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """A seed for the dropout RNG of one (epoch, rank): distinct for each, the same on every rerun."""
    digest = hashlib.sha256(f"vit-einops:{seed}:{epoch}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def random_shift(images: torch.Tensor, max_shift: int) -> torch.Tensor:
    """Translate each image by its own random (dy, dx) in [-max_shift, max_shift], filling with zeros.

    Shapes: (b, c, h, w) -> (b, c, h, w). Draws from the global RNG, which the loop seeds per (epoch, rank).
    """
    if max_shift == 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    dy, dx = torch.randint(0, 2 * max_shift + 1, (2, b, 1), device=images.device)
    rows = dy + torch.arange(h, device=images.device)  # (b, h): the padded rows each output row reads
    cols = dx + torch.arange(w, device=images.device)  # (b, w)
    batch = torch.arange(b, device=images.device)[:, None, None]
    # Advanced indices on dims 0, 2, 3 around the channel slice put their broadcast shape first: (b, h, w, c).
    return rearrange(padded[batch, :, rows[:, :, None], cols[:, None, :]], "b h w c -> b c h w")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only: biases, LayerNorm, the class token and positions are left undecayed
    (timm's convention; the paper does not say)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim <= 1 or name.endswith(("cls_token.weight", "pos_embed.weight"))
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 of the model's weights file (:func:`weights_bytes`): equal to the model hash a checkpoint records."""
    return hashlib.sha256(weights_bytes(model)).hexdigest()


TARGET_ACC = 0.97  # records carry the time this test accuracy was first reached (the digits run's benchmark)
TIMING_FIELDS = ("seconds", "elapsed", "time_to_97")  # the record fields that vary from run to run


class TrainingDivergedError(ValueError):
    """The training loss or the weights became NaN or infinite; nothing of the failing epoch was saved."""


@dataclass
class Evaluation:
    """A model's scores on test data: the mean loss and the confusion matrix (rows: true class, columns:
    predicted class; counts of images)."""

    loss: float
    confusion: list[list[int]]

    @property
    def accuracy(self) -> float:
        return sum(row[i] for i, row in enumerate(self.confusion)) / sum(map(sum, self.confusion))

    def per_class_accuracy(self) -> list[float | None]:
        """Recall of each class: the share of its test images predicted as it (None for a class with none)."""
        return [row[i] / sum(row) if sum(row) else None for i, row in enumerate(self.confusion)]


@torch.no_grad()
def evaluate(
    model: ViT, data: Any, ctx: Distributed, label_smoothing: float = 0.0, batch_size: int = 512
) -> Evaluation:
    """Cross-entropy (with the training's label smoothing) and confusion matrix on ``data`` (a Dataset or
    DataLoader of (image, label)); under torchrun each rank scores its share of a Dataset (every world_size-th
    item) and the sums are summed."""
    model.eval()
    num_classes = model.config.num_classes
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.long, device=ctx.device)
    losses: list[float] = []
    for images, labels in eval_batches(data, batch_size, ctx.rank, ctx.world_size):
        labels = labels.to(ctx.device, non_blocking=True)
        logits = model(images.to(ctx.device, non_blocking=True))
        # Per image, summed exactly (fsum): the loss is then the same whatever the batches (a DataLoader's or ours).
        # cross_entropy raises for a label outside the head's classes.
        losses += F.cross_entropy(logits, labels, reduction="none", label_smoothing=label_smoothing).tolist()
        confusion += torch.bincount(labels * num_classes + logits.argmax(-1), minlength=num_classes**2)
    loss = torch.tensor(math.fsum(losses), dtype=torch.float64, device=ctx.device)
    if ctx.active:
        dist.all_reduce(confusion)
        dist.all_reduce(loss)
    seen = confusion.sum().item()
    if seen == 0:
        raise ValueError("the test data yielded no images")
    return Evaluation(loss.item() / seen, rearrange(confusion, "(t p) -> t p", t=num_classes).tolist())


def warmup_steps(config: TrainConfig, steps_per_epoch: int) -> tuple[int, bool]:
    """The warm-up's length in optimizer steps, and whether it was capped: ``warmup_epochs``, but never more than
    MAX_WARMUP_FRACTION of the run, so that a short run's learning rate still decays."""
    asked = config.warmup_epochs * steps_per_epoch
    cap = int(MAX_WARMUP_FRACTION * config.epochs * steps_per_epoch)
    return min(asked, cap), asked > cap


@dataclass
class TrainResult:
    records: list[dict[str, Any]]  # one per epoch, as in metrics.jsonl
    weights_sha256: list[str]  # one per rank; all equal (checked)
    checkpoint: Path | None


def train(
    model: ViT,
    train_data: Any,
    test_data: Any = None,
    config: TrainConfig | None = None,
    *,
    device: str | torch.device = "auto",
    out_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    data_info: dict[str, Any] | None = None,
    stop_after: int | None = None,
    save_interval: float = SAVE_INTERVAL,
    progress: bool = True,
    ctx: Distributed | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``config.epochs`` epochs, testing after each.

    Args:
        model: a ViT, initialised (seeded) by the caller; moved to the device here.
        train_data: an :class:`ImageDataset`, any map-style Dataset whose items are (image (C, H, W), int label)
            (torchvision's ImageFolder with a ToTensor transform, a TensorDataset...), or a DataLoader yielding
            (images, labels) batches. Class names come from its ``.classes`` when it has them and are set as
            ``model.class_names``. See :class:`~vit_einops.train.data.Batches` for what keeps resume exact.
        test_data: the same kinds, scored after every epoch; None skips testing.
        config: the optimisation recipe (default ``TrainConfig()``, tuned for the digits).
        device: "auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:N" or a torch.device; under torchrun
            ``ctx`` decides.
        out_dir: where rank 0 writes checkpoint/, metrics.jsonl and model.safetensors (after every epoch), then
            summary.json, curves.png and confusion.png, each recorded first in the run's manifest
            (``.vit-einops-run.json``); None writes nothing and cannot resume. It must be empty or new unless
            ``resume`` or ``overwrite`` (what a run killed before its first checkpoint left counts as empty), and
            is locked against a second run for as long as this one writes.
        resume: continue from out_dir/checkpoint; the result equals an uninterrupted run's bit for bit. A run
            stopped before its first checkpoint starts again from epoch 1.
        overwrite: start a new run in an out_dir that holds one; only files the manifest proves a run wrote are
            replaced or removed, any other file at a run's names is refused (ValueError listing them), and files
            at other names are kept.
        data_info: a JSON-ready description of the data, stored in the checkpoint and checked on resume.
        stop_after: end this call after that many epochs in total (as if interrupted), e.g. to time-box a run.
        save_interval: seconds; after an epoch, checkpoint only once this long has passed since the last
            checkpoint (0: after every epoch). The last epoch of the call is always saved. Which epochs are saved
            changes nothing in the training; a kill loses at most this much work.
        progress: a tqdm bar per epoch on stderr (rank 0 only).
        ctx: the process's place in a torchrun job (:func:`init_distributed`); default a single process.

    Raises:
        TrainingDivergedError: the loss or the weights became non-finite; the last good checkpoint is kept.
    """
    config = TrainConfig() if config is None else config
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if stop_after is not None:
        check_positive_int("stop_after", stop_after)
    check_nonnegative_float("save_interval", save_interval)
    ctx = _context(ctx, device)
    _check_model(model)
    if model.config.embedding:  # cross-entropy on an embedding's dimensions would train fake classes
        raise ValueError(
            f"the model's head is an embedding projection (its {model.config.num_classes} outputs are an embedding, "
            f"not class logits); call model.reset_classifier(K) for a classifier of the data's K classes"
        )
    classes = class_names_of(train_data)
    if classes is not None and len(classes) != model.config.num_classes:
        raise ValueError(
            f"the training data has {len(classes)} classes ({', '.join(classes[:5])}"
            f"{', ...' if len(classes) > 5 else ''}) but the model's head has {model.config.num_classes} outputs; "
            f"call model.reset_classifier({len(classes)}) or build the model with num_classes={len(classes)}"
        )
    batches = Batches(train_data, config.batch_size, config.seed, ctx.rank, ctx.world_size)
    if resume and not batches.exact_resume and ctx.is_main:
        warnings.warn(
            "the training DataLoader has its own generator= or persistent workers: their random state is not in a "
            "checkpoint, so the resumed run will not repeat an uninterrupted one exactly (leave generator=None: "
            "train() reseeds the global RNG it falls back on at every epoch)",
            stacklevel=2,
        )
    out = Path(out_dir) if out_dir is not None else None
    if out is None and (resume or overwrite):
        raise ValueError("resume and overwrite need out_dir, the directory of the run")
    run_dir = _open_run_dir(out, resume, overwrite, ctx)  # checked and locked before any work
    try:
        model.to(ctx.device)
        if classes is not None:
            model.class_names = classes
        optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr, betas=config.betas)
        warmup, capped = warmup_steps(config, batches.steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup, config.epochs * batches.steps))
        train_state: dict[str, Any] = {
            "train_config": config.to_dict(),
            "data": data_info or {},
            "class_names": classes,
            "world_size": ctx.world_size,
        }
        records: list[dict[str, Any]] = []
        if resume and os.path.lexists(out / COMMITTED):
            records = _resume(out, run_dir, model, optimizer, scheduler, train_state, batches.steps, ctx)
        elif resume and ctx.is_main:
            print(
                f"note: {printable(out)} holds no checkpoint (its run was stopped before the first one): "
                "starting at epoch 1",
                file=sys.stderr,
            )
        if capped and ctx.is_main:  # said once the checkpoint, if any, is known to continue
            # "asked" only for a value that is not the default: most users never set warmup_epochs.
            default = TrainConfig.__dataclass_fields__["warmup_epochs"].default
            instead = (
                f"the default warm-up of {default} epochs (warmup_epochs, --warmup-epochs)"
                if config.warmup_epochs == default
                else f"the {config.warmup_epochs} epochs asked (warmup_epochs)"
            )
            print(
                f"note: warm-up capped at {warmup} steps ({warmup / batches.steps:.3g} epochs), "
                f"{MAX_WARMUP_FRACTION:.0%} of the run, instead of {instead}, so that the learning rate still decays",
                file=sys.stderr,
            )
        if run_dir is not None and run_dir.removed:
            removed = ", ".join(map(printable, run_dir.removed))
            print(f"note: removed the previous run's files in {printable(out)}: {removed}", file=sys.stderr)
        return _run(
            model,
            batches,
            test_data,
            config,
            optimizer,
            scheduler,
            train_state,
            records,
            out,
            run_dir,
            stop_after,
            save_interval,
            progress,
            ctx,
        )
    finally:
        if run_dir is not None:
            run_dir.close()


def _run(
    model, batches, test_data, config, optimizer, scheduler, train_state, records, out, run_dir, stop_after,
    save_interval, progress, ctx,
):  # fmt: skip
    net = (
        DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        if ctx.active
        else model
    )
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    last_epoch = config.epochs if stop_after is None else min(config.epochs, stop_after)
    checkpoint = out / COMMITTED if out is not None and records else None
    scores = None  # the last epoch's Evaluation
    elapsed_before = records[-1].get("elapsed", 0.0) if records else 0.0
    started = last_save = time.perf_counter()
    saved_epoch = len(records)
    for epoch in range(len(records), last_epoch):
        epoch_started = time.perf_counter()
        torch.manual_seed(epoch_seed(config.seed, epoch, ctx.rank))
        totals = _train_epoch(net, batches, optimizer, scheduler, criterion, config, ctx, progress, epoch)
        _check_finite(totals, model, epoch, scheduler, out, saved_epoch)
        record = {
            "epoch": epoch + 1,
            "train_loss": (totals[0] / totals[2]).item(),
            "train_acc": (totals[1] / totals[2]).item(),
        }
        if test_data is not None:
            scores = evaluate(model, test_data, ctx, config.label_smoothing)
            record["test_loss"] = scores.loss
            record["test_acc"] = scores.accuracy
        record["lr"] = scheduler.get_last_lr()[0]
        record["seconds"] = round(time.perf_counter() - epoch_started, 3)
        record["elapsed"] = round(elapsed_before + time.perf_counter() - started, 3)
        if test_data is not None:
            reached = record["test_acc"] >= TARGET_ACC
            before = records[-1].get("time_to_97") if records else None
            record["time_to_97"] = before if before is not None else (record["elapsed"] if reached else None)
        records.append(record)
        if ctx.is_main:
            test = f"  test acc {record['test_acc']:.4f}" if "test_acc" in record else ""
            print(
                f"epoch {record['epoch']}/{config.epochs}  train loss {record['train_loss']:.4f}  "
                f"train acc {record['train_acc']:.4f}{test}  ({record['seconds']:.1f} s)",
                file=sys.stderr,
            )
            # At most one checkpoint per save_interval: its fsyncs after every epoch of a sub-second epoch would be a
            # large share of the run (docs/performance.md).
            if run_dir is not None and (epoch + 1 == last_epoch or time.perf_counter() - last_save >= save_interval):
                # The checkpoint holds the records: it is the one commit point, and metrics.jsonl is rewritten from
                # it, so a kill between the two loses no epoch (resume rewrites the file from the checkpoint).
                train_state.update(epoch=epoch + 1, records=records)
                files = checkpoint_files(model, optimizer=optimizer, scheduler=scheduler, train_state=train_state)
                derived = _derived_files(model, records)
                written = run_dir.record({**{f"{CHECKPOINT_DIR}/{n}": data for n, data in files.items()}, **derived})
                checkpoint = write_checkpoint(out / CHECKPOINT_DIR, files)
                for name, data in derived.items():
                    atomic_write_bytes(out / name, data)
                run_dir.settle(written)
                saved_epoch, last_save = epoch + 1, time.perf_counter()
        if ctx.active:
            dist.barrier()  # no rank runs ahead of rank 0's checkpoint

    hashes = _gather_hashes(model, ctx)
    if len(set(hashes)) != 1:
        raise RuntimeError(f"ranks ended with different weights (SHA-256 per rank: {hashes}); DDP lost synchronisation")
    if test_data is not None and records and scores is None:  # a finished run resumed: no epoch scored it here
        scores = evaluate(model, test_data, ctx, config.label_smoothing)
    if run_dir is not None and records:
        run_dir.write(_final_files(model, records, scores, hashes, ctx.world_size))
    return TrainResult(records, hashes, checkpoint)


def _final_files(
    model: ViT, records: list[dict[str, Any]], scores: Evaluation | None, hashes: list[str], world_size: int
) -> dict[str, bytes]:
    """summary.json (the last record, the weights' hashes and, with test data, per-class accuracy and the confusion
    matrix), and the figures: curves.png and confusion.png."""
    summary = {**records[-1], "epochs_run": len(records), "world_size": world_size, "weights_sha256": hashes}
    if scores is None:
        return {SUMMARY_NAME: (json.dumps(summary, indent=1) + "\n").encode()}
    from ..base.plot import figure_png
    from .plots import plot_confusion, plot_curves

    classes = model.class_names or [str(i) for i in range(model.config.num_classes)]
    summary["classes"] = classes
    summary["per_class_accuracy"] = dict(zip(classes, scores.per_class_accuracy(), strict=True))
    summary["confusion_matrix"] = scores.confusion  # rows: true class, columns: predicted class, in ``classes`` order
    return {
        SUMMARY_NAME: (json.dumps(summary, indent=1) + "\n").encode(),
        CURVES_NAME: figure_png(plot_curves(records)),
        CONFUSION_NAME: figure_png(plot_confusion(scores.confusion, classes)),
    }


def _context(ctx: Distributed | None, device: str | torch.device) -> Distributed:
    if ctx is None:
        return Distributed(device=resolve_device(device))
    if not isinstance(ctx, Distributed):
        raise TypeError(f"ctx must be a Distributed (from init_distributed()), got {type(ctx).__name__}")
    if not (isinstance(device, str) and device == "auto") and resolve_device(device) != ctx.device:
        raise ValueError(f"device {device!r} disagrees with the torchrun context's device {ctx.device}")
    return ctx


def _check_model(model: Any) -> None:
    if not isinstance(model, ViT):
        raise TypeError(f"model must be a vit_einops ViT, got {type(model).__name__}")
    wrong = {name: p.dtype for name, p in model.named_parameters() if p.dtype != DTYPE}
    if wrong:
        name = min(wrong)
        raise TypeError(
            f"training keeps the weights in {DTYPE}, but parameter {name!r} is {wrong[name]}; call model.float() "
            "(for mixed precision, autocast the forward instead of converting the weights)"
        )


def _open_run_dir(out: Path | None, resume: bool, overwrite: bool, ctx: Distributed) -> RunDir | None:
    """Rank 0 checks and locks the output directory; under torchrun every rank learns whether it could."""
    run_dir, failure = None, None
    if out is not None and ctx.is_main:
        try:
            run_dir = RunDir.open(out, resume=resume, overwrite=overwrite)
        except Exception as err:  # re-raised below, once the other ranks know not to wait for this one
            failure = err
    if ctx.active:
        flag = torch.tensor([failure is not None], dtype=torch.long, device=ctx.device)
        dist.all_reduce(flag)
        if flag.item() and failure is None:
            raise RuntimeError(f"rank 0 could not open the output directory {str(out)!r} (its error says why)")
    if failure is not None:
        raise failure
    return run_dir


def _check_finite(
    totals: torch.Tensor, model: nn.Module, epoch: int, scheduler, out: Path | None, saved_epoch: int
) -> None:
    """Stop before a non-finite loss or weight reaches a checkpoint (the last good one stays as it is).

    One check per epoch, on numbers already at hand: the loss sum carries any nan or inf of the epoch's steps.
    """
    weights_finite = all(torch.isfinite(p).all() for p in model.parameters())
    if weights_finite and torch.isfinite(totals).all():
        return
    kept = "nothing was saved"
    if out is not None and saved_epoch:
        kept = f"the checkpoint in {out / CHECKPOINT_DIR} still holds epoch {saved_epoch}"
    raise TrainingDivergedError(
        f"training diverged in epoch {epoch + 1}: the mean loss is {(totals[0] / totals[2]).item()} and the weights "
        f"are {'finite' if weights_finite else 'not finite'} (learning rate {scheduler.get_last_lr()[0]:.3g} at the "
        f"end of the epoch); {kept}. Lower the learning rate (--lr), or check the data for NaN or infinite values"
    )


def batch_totals(loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(loss * count, correct, count) of one batch, all on the batch's device: no host-device copy or sync."""
    count = torch.tensor(len(labels), device=logits.device)
    return torch.stack([loss.detach() * count, (logits.argmax(-1) == labels).sum(), count])


def _train_epoch(net, batches: Batches, optimizer, scheduler, criterion, config, ctx, progress, epoch) -> torch.Tensor:
    """One pass over this rank's batches; returns (loss * count, correct, count) summed over every rank."""
    net.train()
    model = net.module if isinstance(net, DistributedDataParallel) else net
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    bar = tqdm(
        batches.epoch(epoch),
        total=batches.steps,
        desc=f"epoch {epoch + 1}/{config.epochs}",
        file=sys.stderr,
        disable=not (progress and ctx.is_main),
        leave=False,
    )
    for x, y in bar:
        follow_free_cores()  # a command's thread policy, between batches (nothing without one)
        x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
        logits = net(random_shift(x, config.shift))
        loss = criterion(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # under DDP, gradients arrive averaged over the ranks: every rank takes the same step
        nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
        optimizer.step()
        scheduler.step()
        totals += batch_totals(loss, logits, y).to(totals)
        if not bar.disable:  # formatting reads the totals back to the host: a device sync per step
            bar.set_postfix(loss=f"{totals[0] / totals[2]:.4f}", acc=f"{totals[1] / totals[2]:.3f}", refresh=False)
    if ctx.active:
        dist.all_reduce(totals)
    return totals


def _resume(
    out: Path,
    run_dir: RunDir | None,
    model: ViT,
    optimizer,
    scheduler,
    train_state: dict[str, Any],
    steps_per_epoch: int,
    ctx: Distributed,
) -> list[dict[str, Any]]:
    """Load the checkpoint in ``out`` into the fresh model, optimizer and scheduler; returns its epoch records."""
    ckpt = load_checkpoint(out / CHECKPOINT_DIR)
    if ckpt.config != model.config:
        raise CheckpointError(
            f"{ckpt.path} was saved for model config {ckpt.config.to_dict()}, not {model.config.to_dict()}"
        )
    saved = ckpt.train_state
    for key in ("train_config", "data", "class_names"):
        if saved.get(key) != train_state[key]:
            raise CheckpointError(
                f"{ckpt.path} was trained with {key} {saved.get(key)!r}; resuming with {train_state[key]!r} would not "
                "continue the same run (start a new --out, or pass the same options)"
            )
    epoch = saved.get("epoch")
    epochs = train_state["train_config"]["epochs"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= epochs:
        raise CheckpointError(f"{ckpt.path}: field 'train_state.epoch' is {epoch!r}, expected an int in 0..{epochs}")
    records = saved.get("records")
    if (
        not isinstance(records, list)
        or len(records) != epoch
        or not all(isinstance(r, dict) and r.get("epoch") == i + 1 for i, r in enumerate(records))
    ):
        raise CheckpointError(
            f"{ckpt.path}: field 'train_state.records' must be the list of the {epoch} epoch records, "
            f"numbered 1..{epoch}; got {str(records)[:80]}"
        )
    if saved.get("world_size") != ctx.world_size and ctx.is_main:
        print(
            f"warning: {printable(ckpt.path)} was written by {saved.get('world_size')} processes, resuming on "
            f"{ctx.world_size}: the data shards differ, so the run will not repeat the original",
            file=sys.stderr,
        )
    restore_training(ckpt, model, optimizer, scheduler, step=epoch * steps_per_epoch)
    if run_dir is not None and records:
        run_dir.write(_derived_files(model, records))  # repairs what a kill after the checkpoint's commit left behind
    return records


def _derived_files(model: ViT, records: list[dict[str, Any]]) -> dict[str, bytes]:
    """What follows from the checkpoint: metrics.jsonl (its records) and model.safetensors (its weights, with the
    model's preprocessing and class names, for ``load_model``/``predict``); each is rewritten in full."""
    return {
        METRICS_NAME: "".join(json.dumps(r) + "\n" for r in records).encode(),
        MODEL_NAME: safetensors_bytes(model.state_dict(), model_metadata(model)),
    }


def _gather_hashes(model: nn.Module, ctx: Distributed) -> list[str]:
    digest = weights_sha256(model)
    if not ctx.active:
        return [digest]
    mine = torch.frombuffer(bytearray(bytes.fromhex(digest)), dtype=torch.uint8).to(ctx.device)
    everyone = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, mine)  # tensors, not all_gather_object: nothing is pickled between ranks either
    return [bytes(t.cpu().tolist()).hex() for t in everyone]
