"""The training loop: the paper's recipe (Table 3) at small scale, on one process or many under torchrun.

Recipe: AdamW (beta1 0.9, beta2 0.999), linear warm-up then cosine decay, gradient clipping at global norm 1,
dropout from the model config, optional label smoothing.

Determinism: the model is initialised under ``torch.manual_seed(seed)`` by the caller; at the start of every
epoch the shuffling order is a function of (seed, epoch) (``DistributedSampler.set_epoch``) and the global RNG
that drives dropout is reseeded from (seed, epoch, rank). The random state at an epoch boundary is thus fully
determined by numbers the checkpoint records, for every rank, so a resumed run repeats an uninterrupted one
bit for bit without saving per-rank generator states that rank 0 could not see.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DistributedSampler
from tqdm import tqdm

from .._io import atomic_write_bytes
from ..model import ViT
from .checkpoint import CheckpointError, load_checkpoint, restore_training, save_checkpoint, weights_bytes
from .config import TrainConfig
from .data import ImageDataset

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"
CHECKPOINT_DIR = "checkpoint"


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
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return Distributed(dist.get_rank(), dist.get_world_size(), device)


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


@torch.no_grad()
def evaluate(model: ViT, data: ImageDataset, ctx: Distributed, batch_size: int = 512) -> float:
    """Top-1 accuracy on ``data``; under torchrun each rank scores every world_size-th image, counts are summed."""
    model.eval()
    index = torch.arange(ctx.rank, len(data), ctx.world_size)
    correct = torch.zeros((), dtype=torch.long, device=ctx.device)
    for start in range(0, len(index), batch_size):
        batch = index[start : start + batch_size]
        logits = model(data.images[batch].to(ctx.device))
        correct += (logits.argmax(-1) == data.labels[batch].to(ctx.device)).sum()
    if ctx.active:
        dist.all_reduce(correct)
    return correct.item() / len(data)


@dataclass
class TrainResult:
    records: list[dict[str, Any]]  # one per epoch, as in metrics.jsonl
    weights_sha256: list[str]  # one per rank; all equal (checked)
    checkpoint: Path | None


def train(
    model: ViT,
    train_set: ImageDataset,
    test_set: ImageDataset,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    data_info: dict[str, Any] | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    ctx: Distributed | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``config.epochs`` epochs, testing after each.

    Args:
        model: a ViT, initialised (seeded) by the caller; on ctx.device already or moved there here.
        train_set, test_set: in-memory images and labels (see vit_einops.train.data).
        config: the optimisation recipe.
        out_dir: where rank 0 writes metrics.jsonl, summary.json, curves.png and checkpoint/ (after every
            epoch); None writes nothing and cannot resume.
        resume: continue from out_dir/checkpoint; the result equals an uninterrupted run's bit for bit.
        data_info: a JSON-ready description of the data, stored in the checkpoint and checked on resume.
        stop_after: end this call after that many epochs in total (as if interrupted), e.g. to time-box a run.
        progress: a tqdm bar per epoch on stderr (rank 0 only).
        ctx: the process's place in a torchrun job; default single process on CPU.
    """
    ctx = ctx or Distributed()
    out = Path(out_dir) if out_dir is not None else None
    model.to(ctx.device)
    steps_per_epoch = math.ceil(math.ceil(len(train_set) / ctx.world_size) / config.batch_size)
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr, betas=config.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        WarmupCosine(min(config.warmup_epochs, config.epochs) * steps_per_epoch, config.epochs * steps_per_epoch),
    )
    train_state = {"train_config": config.to_dict(), "data": data_info or {}, "world_size": ctx.world_size}
    records: list[dict[str, Any]] = []
    start_epoch = 0
    if resume:
        if out is None:
            raise ValueError("resume needs out_dir, the directory holding checkpoint/")
        start_epoch, records = _resume(out, model, optimizer, scheduler, train_state, ctx)

    net = (
        DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        if ctx.active
        else model
    )
    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=config.seed)
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    last_epoch = config.epochs if stop_after is None else min(config.epochs, stop_after)
    checkpoint = None
    for epoch in range(start_epoch, last_epoch):
        started = time.perf_counter()
        sampler.set_epoch(epoch)
        torch.manual_seed(epoch_seed(config.seed, epoch, ctx.rank))
        totals = _train_epoch(
            net, train_set, sampler, optimizer, scheduler, criterion, config, ctx, progress, epoch, steps_per_epoch
        )
        record = {
            "epoch": epoch + 1,
            "train_loss": (totals[0] / totals[2]).item(),
            "train_acc": (totals[1] / totals[2]).item(),
            "test_acc": evaluate(model, test_set, ctx),
            "lr": scheduler.get_last_lr()[0],
            "seconds": round(time.perf_counter() - started, 3),
        }
        records.append(record)
        if ctx.is_main:
            print(
                f"epoch {record['epoch']}/{config.epochs}  train loss {record['train_loss']:.4f}  "
                f"train acc {record['train_acc']:.4f}  test acc {record['test_acc']:.4f}  ({record['seconds']:.1f} s)",
                file=sys.stderr,
            )
            if out is not None:
                train_state["epoch"] = epoch + 1
                checkpoint = save_checkpoint(
                    out / CHECKPOINT_DIR, model, optimizer=optimizer, scheduler=scheduler, train_state=train_state
                )
                _write_jsonl(out / METRICS_NAME, records)
        if ctx.active:
            dist.barrier()  # no rank runs ahead of rank 0's checkpoint

    hashes = _gather_hashes(model, ctx)
    if len(set(hashes)) != 1:
        raise RuntimeError(f"ranks ended with different weights (SHA-256 per rank: {hashes}); DDP lost synchronisation")
    if ctx.is_main and out is not None and records:
        from .._plot import save_figure
        from .plots import plot_curves

        summary = {**records[-1], "epochs_run": len(records), "world_size": ctx.world_size, "weights_sha256": hashes}
        atomic_write_bytes(out / SUMMARY_NAME, (json.dumps(summary, indent=1) + "\n").encode())
        save_figure(plot_curves(records), out / "curves.png")
    return TrainResult(records, hashes, checkpoint)


def batch_totals(loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(loss * count, correct, count) of one batch, all on the batch's device: no host-device copy or sync."""
    count = torch.tensor(len(labels), device=logits.device)
    return torch.stack([loss.detach() * count, (logits.argmax(-1) == labels).sum(), count])


def _train_epoch(
    net, train_set, sampler, optimizer, scheduler, criterion, config, ctx, progress, epoch, steps
) -> torch.Tensor:
    """One pass over this rank's shard; returns (loss * count, correct, count) summed over every rank."""
    net.train()
    model = net.module if isinstance(net, DistributedDataParallel) else net
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    bar = tqdm(
        BatchSampler(sampler, config.batch_size, drop_last=False),
        total=steps,
        desc=f"epoch {epoch + 1}/{config.epochs}",
        file=sys.stderr,
        disable=not (progress and ctx.is_main),
        leave=False,
    )
    for batch in bar:
        x, y = train_set.images[batch].to(ctx.device), train_set.labels[batch].to(ctx.device)
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
    out: Path, model: ViT, optimizer, scheduler, train_state: dict[str, Any], ctx: Distributed
) -> tuple[int, list[dict[str, Any]]]:
    ckpt = load_checkpoint(out / CHECKPOINT_DIR)
    if ckpt.config != model.config:
        raise CheckpointError(
            f"{ckpt.path} was saved for model config {ckpt.config.to_dict()}, not {model.config.to_dict()}"
        )
    saved = ckpt.train_state
    for key in ("train_config", "data"):
        if saved.get(key) != train_state[key]:
            raise CheckpointError(
                f"{ckpt.path} was trained with {key} {saved.get(key)!r}; resuming with {train_state[key]!r} would not "
                "continue the same run (start a new --out, or pass the same options)"
            )
    if saved.get("world_size") != ctx.world_size and ctx.is_main:
        print(
            f"warning: {ckpt.path} was written by {saved.get('world_size')} processes, resuming on {ctx.world_size}: "
            "the data shards differ, so the run will not repeat the original",
            file=sys.stderr,
        )
    restore_training(ckpt, model, optimizer, scheduler)
    epoch = saved.get("epoch")
    if not isinstance(epoch, int) or epoch < 0:
        raise CheckpointError(f"{ckpt.path} has no valid train_state.epoch (got {epoch!r})")
    records = []
    if (out / METRICS_NAME).exists():
        records = [json.loads(line) for line in (out / METRICS_NAME).read_text().splitlines() if line.strip()]
        records = [r for r in records if r.get("epoch", 0) <= epoch]
    return epoch, records


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in records).encode())


def _gather_hashes(model: nn.Module, ctx: Distributed) -> list[str]:
    digest = weights_sha256(model)
    if not ctx.active:
        return [digest]
    mine = torch.frombuffer(bytearray(bytes.fromhex(digest)), dtype=torch.uint8).to(ctx.device)
    everyone = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, mine)  # tensors, not all_gather_object: nothing is pickled between ranks either
    return [bytes(t.cpu().tolist()).hex() for t in everyone]
