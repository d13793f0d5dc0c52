"""The whole-model benchmark: images/s of a preset for each attention path, inference and an AdamW step.

Paths: our ViT with attn_impl einsum, chunked, sdpa, and "torch": the same weights with every encoder block
replaced by torch's nn.TransformerEncoderLayer (norm_first, exact GELU, eps 1e-6, batch_first; see
vit_einops.reference), which in inference takes torch's fused fast path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..presets import create_vit
from ..reference import torch_reference_vit
from .measure import peak_memory_bytes, time_interleaved

MODEL_PATHS = ("einsum", "chunked", "sdpa", "torch")
MODEL_MODES = ("inference", "train_step")


def build_paths(preset: str, dtype: torch.dtype, paths, **overrides) -> dict[str, nn.Module]:
    """One model per path, all with the same weights (``preset`` initialised once, then copied)."""
    base = create_vit(preset, **overrides).to(dtype)
    models = {}
    for path in paths:
        model = copy.deepcopy(base)
        models[path] = torch_reference_vit(model) if path == "torch" else model.set_attn_impl(path)
    return models


def counted_flops(model: nn.Module, image: torch.Tensor) -> dict[str, float]:
    """FLOPs of one image, counted by torch.utils.flop_counter on ``model`` (matmuls, convolutions, 2 per
    multiply-add): the forward, and forward + backward (what a training step computes; AdamW's elementwise
    update is not counted)."""
    with FlopCounterMode(display=False) as counter:
        model(image)
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        model(image).sum().backward()
    model.zero_grad(set_to_none=True)
    return dict(inference=forward, train_step=counter.get_total_flops())


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], object]:
    # A fresh optimizer per path; lr small so hundreds of steps leave the weights (and the speed) unchanged.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def measure_model(
    preset: str,
    batch: int,
    dtype: torch.dtype,
    paths,
    modes,
    rounds: int,
    min_run_time: float,
    image_size: int = 224,
    overrides: dict | None = None,
) -> list[dict]:
    """One row per (mode, path): images/s, achieved GFLOP/s, peak memory,
    and each path's largest output difference from the einsum path on one image (the same function, checked).

    ``overrides`` (ViT keywords, e.g. depth=2 for the smoke run) change the preset; the row's model name says so.
    """
    overrides = dict(overrides or {}, image_size=image_size)
    models = build_paths(preset, dtype, paths, **overrides)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, image_size, image_size, generator=g).to(dtype)
    y = torch.randint(0, 1000, (batch,), generator=g)
    # FLOPs depend on shapes only: count them on the einsum path, whose every product is a plain matmul the
    # counter knows (it may not know a fused attention kernel), built on the meta device, where nothing is
    # initialised or computed (the counts are the same as on real tensors; vit_b_16: 0.7 s instead of 13 s).
    with torch.device("meta"):
        shapes_only = create_vit(preset, **{**overrides, "attn_impl": "einsum"}).to(dtype)
    flops = counted_flops(shapes_only, x[:1].to("meta"))
    name = preset + "".join(f"+{k}={v}" for k, v in overrides.items() if k != "image_size")

    with torch.inference_mode():
        outputs = {path: m.eval()(x[:1]) for path, m in models.items()}
    baseline = outputs.get("einsum", outputs[paths[0]])
    max_diff = {path: (out - baseline).abs().max().item() for path, out in outputs.items()}

    rows = []
    for mode in modes:
        if mode == "inference":
            calls = {path: (lambda m=m.eval(): m(x)) for path, m in models.items()}  # noqa: B008 -- eval once, here
            context = torch.inference_mode
        else:
            calls = {path: _train_step(m.train(), x, y) for path, m in models.items()}
            context = torch.enable_grad
        with context():
            timings = time_interleaved(calls, rounds=rounds, min_run_time=min_run_time)
            peaks = peak_memory_bytes(calls)
        for path, timing in timings.items():
            gflop = flops[mode] * batch / 1e9
            rows.append(
                dict(
                    model=name,
                    mode=mode,
                    path=path,
                    batch=batch,
                    image_size=image_size,
                    dtype=str(dtype).removeprefix("torch."),
                    median_s=timing.median_s,
                    iqr_s=timing.iqr_s,
                    blocks=timing.blocks,
                    images_per_s=batch / timing.median_s,
                    gflop=gflop,
                    gflop_per_s=gflop / timing.median_s,
                    peak_bytes=peaks[path],
                    max_abs_diff_vs_einsum=max_diff[path],
                )
            )
    reference = {r["mode"]: r for r in rows if r["path"] == "torch"}
    for r in rows:
        ref = reference.get(r["mode"])
        r["time_ratio"] = r["median_s"] / ref["median_s"] if ref else None  # < 1: faster than torch's layers
    return rows
