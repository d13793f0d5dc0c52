"""The whole-model benchmark: images/s of a preset for each attention path, inference and a training step.

The training step is forward, cross-entropy, backward and one step of SGD with momentum 0.9: the optimizer the ViT
paper fine-tunes with (Appendix B.1.1). It keeps one state per weight where AdamW keeps two, which is what keeps
the default ``vit-einops bench`` under 2 GB: vit_b_16's weights, gradients and optimizer state are 1.0 GB with
SGD, 1.4 GB with AdamW. Each row names its optimizer (``optimizer``).

Paths: our ViT with attn_impl einsum, chunked, sdpa, and "torch": the same weights with every encoder block
replaced by torch's nn.TransformerEncoderLayer (norm_first, exact GELU, eps 1e-6, batch_first; see
vit_einops.reference), which in inference takes torch's fused fast path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..network.attention import MultiHeadAttention
from ..network.chunk_plan import default_chunk_elements
from ..presets import create_architecture
from ..reference import torch_reference_vit
from .device import Meter
from .noise import LoadProbe
from .paired import paired_ratios, ratio_fields


def _share_weights(reference: nn.Module, model: nn.Module) -> None:
    """Make torch's encoder layers in ``reference`` use ``model``'s Parameters themselves instead of copies.

    vit_einops.reference copies each block's weights into nn.TransformerEncoderLayer (in_proj = our qkv, out_proj
    = proj, norm1/norm2, linear1/linear2 = fc1/fc2, the same layouts). Sharing them means one set of weights,
    gradients and optimizer state for every path: vit_b_16's training step needs 1.0 GB for one set, 2.1 GB for
    two.
    """
    for ours, theirs in zip(model.blocks, reference.blocks, strict=True):
        mha, ff = ours.attn.mha, ours.mlp.ff
        pairs = [
            (theirs.self_attn, "in_proj_weight", mha.qkv.weight),
            (theirs.self_attn, "in_proj_bias", mha.qkv.bias),
            (theirs.self_attn.out_proj, "weight", mha.proj.weight),
            (theirs.self_attn.out_proj, "bias", mha.proj.bias),
        ]
        for norm, their_norm in ((ours.attn.norm, theirs.norm1), (ours.mlp.norm, theirs.norm2)):
            pairs += [(their_norm, "weight", norm.weight), (their_norm, "bias", norm.bias)]
        for linear, their_linear in ((ff.fc1, theirs.linear1), (ff.fc2, theirs.linear2)):
            pairs += [(their_linear, "weight", linear.weight), (their_linear, "bias", linear.bias)]
        for module, name, param in pairs:
            if not torch.equal(getattr(module, name), param):  # the copy must have been exactly this weight
                raise RuntimeError(f"bench: torch's {type(module).__name__}.{name} is not a copy of our weight")
            setattr(module, name, param)


class SharedPaths:
    """Every path of one preset on one set of weights: our ViT with its attention impl switched per call
    (einsum, chunked, sdpa), and torch's encoder layers using the same Parameters ("torch")."""

    def __init__(self, preset: str, dtype: torch.dtype, paths, device: torch.device, **overrides) -> None:
        self.model = create_architecture(preset, **overrides).to(device, dtype)
        self.attention = [m for m in self.model.modules() if isinstance(m, MultiHeadAttention)]
        for m in self.attention:  # the chunked block for this run's thread count, as in the attention grid
            m.attend.chunk_elements = default_chunk_elements()
        self.reference = None
        if "torch" in paths:
            self.reference = torch_reference_vit(self.model)
            _share_weights(self.reference, self.model)
        self.paths = tuple(paths)

    def module(self, path: str) -> nn.Module:
        """The module computing ``path``; for our impls, the ViT switched to that impl (switch again before
        each call: every path shares this one model)."""
        if path == "torch":
            return self.reference
        for m in self.attention:
            m.impl = path
        return self.model

    def call(self, path: str, fn: Callable[[nn.Module], object]) -> Callable[[], object]:
        """A no-argument call running ``fn`` on ``path``'s module, switching the impl first."""
        return lambda: fn(self.module(path))

    def train(self, mode: bool) -> None:
        for m in (self.model, self.reference):
            if m is not None:
                m.train(mode)

    def parameters(self) -> list[nn.Parameter]:
        """Every Parameter of every path, once (the reference shares patch embedding, head and encoder)."""
        params = {id(p): p for m in (self.model, self.reference) if m is not None for p in m.parameters()}
        return list(params.values())


def counted_flops(model: nn.Module, image: torch.Tensor) -> dict[str, float]:
    """FLOPs of one image, counted by torch.utils.flop_counter on ``model`` (matmuls, convolutions, 2 per
    multiply-add): the forward, and forward + backward (what a training step computes; the optimizer's
    elementwise update is not counted)."""
    with FlopCounterMode(display=False) as counter:
        model(image)
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        model(image).sum().backward()
    model.zero_grad(set_to_none=True)
    return dict(inference=forward, train_step=counter.get_total_flops())


OPTIMIZER = "SGD(momentum=0.9)"  # the train_step rows' label: what make_optimizer builds


def make_optimizer(params) -> torch.optim.Optimizer:
    """The training step's optimizer, OPTIMIZER: SGD with momentum 0.9 (the ViT paper's fine-tuning optimizer)."""
    return torch.optim.SGD(params, lr=1e-6, momentum=0.9, fused=True)


def _train_step(shared: SharedPaths, path: str, optimizer: torch.optim.Optimizer, x, y) -> Callable[[], object]:
    """One training step that allocates and frees its own gradients, so its peak memory counts them whichever path
    runs first (with the gradients freed at the start instead, the first path profiled freed the previous step's,
    allocated before the profiler started and so invisible to it, and its peak alone counted a new set)."""

    def step():
        loss = F.cross_entropy(shared.module(path)(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

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
    probe: LoadProbe | None = None,
    meter: Meter | None = None,
) -> list[dict]:
    """One row per (mode, path): images/s, achieved GFLOP/s, peak memory, the time over the "torch" path's of the
    same rounds (vit_einops.bench.paired; below 1: faster than torch's layers), and each path's largest output
    difference from the einsum path on one image (the same function, checked).

    ``overrides`` (ViT keywords, e.g. depth=1 for the smoke run) change the preset; the row's model name says so.
    ``meter``: the device measured on and how (default: the CPU's).
    """
    probe = probe or LoadProbe()  # the run's: the load fallback needs to know how long the run has gone on
    meter = meter or Meter()
    overrides = dict(overrides or {}, image_size=image_size)
    shared = SharedPaths(preset, dtype, paths, meter.device, **overrides)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, image_size, image_size, generator=g).to(meter.device, dtype)
    y = torch.randint(0, 1000, (batch,), generator=g).to(meter.device)
    # FLOPs depend on shapes only: count them on the einsum path, whose every product is a plain matmul the
    # counter knows (it may not know a fused attention kernel), built on the meta device, where nothing is
    # initialised or computed (the counts are the same as on real tensors, in a fraction of the time).
    with torch.device("meta"):
        shapes_only = create_architecture(preset, **{**overrides, "attn_impl": "einsum"}).to(dtype)
    flops = counted_flops(shapes_only, x[:1].to("meta"))
    name = preset + "".join(f"+{k}={v}" for k, v in overrides.items() if k != "image_size")

    shared.train(False)
    with torch.inference_mode():
        outputs = {path: shared.module(path)(x[:1]) for path in paths}
    baseline = outputs.get("einsum", outputs[paths[0]])
    max_diff = {path: (out - baseline).abs().max().item() for path, out in outputs.items()}

    rows = []
    # One optimizer over the shared weights; lr small so hundreds of steps leave the weights (and the speed)
    # unchanged. fused: one kernel per step and no full-size temporaries (the foreach default holds copies of the
    # weights: 0.3 GB each for vit_b_16).
    optimizer = make_optimizer(shared.parameters()) if "train_step" in modes else None
    for mode in modes:
        shared.train(mode != "inference")
        if mode != "inference":
            calls = {path: _train_step(shared, path, optimizer, x, y) for path in paths}
            context = torch.enable_grad
        else:
            calls = {path: shared.call(path, lambda m: m(x)) for path in paths}
            context = torch.inference_mode
        with context():
            start = probe.sample()
            timings = meter.time(calls, rounds=rounds, min_run_time=min_run_time)
            end = probe.sample()
            peaks = meter.peak_bytes(calls)
        ratios = paired_ratios({p: t.round_s for p, t in timings.items()}, "torch") if "torch" in timings else {}
        for path, timing in timings.items():
            gflop = flops[mode] * batch / 1e9
            rows.append(
                dict(
                    model=name,
                    mode=mode,
                    optimizer=OPTIMIZER if mode == "train_step" else None,
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
                    **ratio_fields(ratios.get(path)),
                    rounds=len(timing.round_s),
                    **probe.row_fields(timing, start, end, torch.get_num_threads()),
                )
            )
    return rows
