"""The attention microbenchmark: Eq. 6-7 alone ("core") and the whole self-attention layer ("layer").

core paths take q, k, v (b, h, n, d):  einsum, chunked, sdpa (our Attend impls), einsum_compiled
(torch.compile of the einsum Attend), and torch's own kernels (vit_einops.bench.kernels): sdpa_math, sdpa_flash,
sdpa_efficient, sdpa_cudnn (one sdpa_kernel backend each) and flex_compiled; reference sdpa.
layer paths take x (b, n, D = h d):    mha_sdpa, mha_chunked (our MultiHeadAttention) and torch_mha
(nn.MultiheadAttention with the same weights, torch's reference); reference torch_mha.
Every path is timed forward under inference_mode ("forward") and as forward + backward to the inputs (and the
layer's weights) ("forward_backward"). Each row names the kernel that ran, read from the profiler; a path torch
refuses at a point (a backend this device lacks, a shape or dtype it does not take, a failed compile) gets a row
with the reason instead of a timing.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..network.attention import Attend, MultiHeadAttention
from ..network.chunk_plan import default_chunk_elements
from ..reference import torch_mha_from
from .device import Meter
from .kernels import SDPA_BACKENDS, compiled_flex, flex_backward_refusal, kernel_ran, refusal, sdpa_backend_call
from .names import COMPILED_PATHS, REFERENCE_KERNEL
from .noise import LoadProbe
from .paired import paired_ratios, ratio_fields

REFERENCE = {"core": REFERENCE_KERNEL, "layer": "torch_mha"}


@dataclass(frozen=True)
class Point:
    """One grid point: batch b, heads h, tokens n, head size d."""

    batch: int
    heads: int
    tokens: int
    head_dim: int

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    def flops(self, section: str, mode: str) -> float:
        """Counted FLOPs (2 per multiply-add) of the useful work, whatever a path recomputes.

        core forward: q k^T and A v, 2 * 2 b h n^2 d. layer forward adds the qkv (2 b n D 3D) and output
        (2 b n D D) projections, 8 b n D^2. Backward: two matmuls of the same size per forward matmul, so
        forward + backward = 3 x forward.
        """
        b, n = self.batch, self.tokens
        forward = 4 * b * self.heads * n * n * self.head_dim
        if section == "layer":
            forward += 8 * b * n * self.dim**2
        return forward * (3 if mode == "forward_backward" else 1)

    def attention_matrix_bytes(self, dtype: torch.dtype) -> int:
        """The analytic size of A, (b, h, n, n): what the einsum path materialises."""
        return self.batch * self.heads * self.tokens**2 * dtype.itemsize


def grid(batches, heads, tokens, head_dims) -> list[Point]:
    return [Point(b, h, n, d) for h in heads for d in head_dims for b in batches for n in tokens]


class CompiledPath:
    """torch.compile of a core path, compiled on first use; remembers why, if compiling fails.

    einsum_compiled: the einsum Attend; flex_compiled: flex_attention with no score_mod and no mask.
    ``dynamic=True`` asks for one graph for every (b, n) instead of one per grid point (a batch of 1 is still
    specialised by dynamo, so it costs one more compile). Each first call at a new shape and mode is timed
    separately, because it includes any compile.
    """

    def __init__(self, path: str, head_dim: int, dtype: torch.dtype, skip_reason: str | None = None) -> None:
        """``skip_reason``: do not compile, and report this instead."""
        if path not in COMPILED_PATHS:
            raise ValueError(f"compiled path {path!r} is not one of {', '.join(COMPILED_PATHS)}")
        self.skip_reason = skip_reason
        if skip_reason:
            self.fn = None
        elif path == "flex_compiled":
            self.fn = compiled_flex()
        else:
            self.fn = torch.compile(Attend(head_dim, impl="einsum").to(dtype), dynamic=True)

    def first_call(self, call: Callable[[], object]) -> tuple[float | None, str | None]:
        """Run ``call`` once: (its seconds, None), or (None, why it did not run).

        A NotImplementedError is torch declining these inputs (flex_attention has no backward on a CPU): the reason
        holds for this call only. Any other failure means compiling does not work here: the reason is kept and the
        path is skipped from here on.
        """
        if self.skip_reason is not None:
            return None, self.skip_reason
        start = time.perf_counter()
        try:
            call()
        except NotImplementedError as error:
            return None, f"torch: {str(error).splitlines()[0][:200]}"
        except Exception as error:  # noqa: BLE001 -- any failure to compile means: skip the path, say why
            self.skip_reason = f"torch.compile failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            return None, self.skip_reason
        return time.perf_counter() - start, None


def _inputs(point: Point, dtype: torch.dtype, grad: bool, device: torch.device, seed: int = 0):
    """q, k, v and x, drawn on the CPU from one seed (the same values on every device), then moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    b, h, n, d = point.batch, point.heads, point.tokens, point.head_dim
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(device, dtype).requires_grad_(grad) for _ in range(3))
    x = torch.randn(b, n, point.dim, generator=g).to(device, dtype).requires_grad_(grad)
    return q, k, v, x


def _forwards(point, dtype, paths, compiled, q, k, v, x) -> dict[tuple[str, str], tuple[Callable, list[torch.Tensor]]]:
    """(section, path) -> (a forward call, the tensors its backward differentiates)."""
    calls = {}
    for path in paths.get("core", ()):
        if path in COMPILED_PATHS:
            if path in compiled and compiled[path].skip_reason is None:
                calls["core", path] = (lambda fn=compiled[path].fn: fn(q, k, v), [q, k, v])
        elif path in SDPA_BACKENDS:
            calls["core", path] = (sdpa_backend_call(path, q, k, v), [q, k, v])
        else:
            # The chunked block for the thread count of this run (--threads is set after chunk_plan.py was imported).
            attend = Attend(point.head_dim, impl=path, chunk_elements=default_chunk_elements())
            calls["core", path] = (lambda attend=attend: attend(q, k, v), [q, k, v])
    if paths.get("layer"):
        # One set of weights for every layer path, so they all compute the same function.
        ours = MultiHeadAttention(point.dim, point.heads).to(x.device, dtype).eval()
        for path in paths["layer"]:
            if path == "torch_mha":
                module = torch_mha_from(ours).eval()

                def call(module=module):
                    return module(x, x, x, need_weights=False)[0]
            else:
                module = copy.deepcopy(ours)
                module.impl = path.removeprefix("mha_")
                module.attend.chunk_elements = default_chunk_elements()

                def call(module=module):
                    return module(x)

            calls["layer", path] = (call, [x, *module.parameters()])
    return calls


def _forward_backward(forward: Callable[[], torch.Tensor], inputs: list[torch.Tensor]) -> Callable[[], object]:
    def step():
        out = forward()
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    return step


def measure_point(
    point: Point,
    mode: str,
    dtype: torch.dtype,
    paths: dict[str, tuple[str, ...]],
    compiled: dict[str, CompiledPath],
    rounds: int,
    min_run_time: float,
    probe: LoadProbe | None = None,
    meter: Meter | None = None,
) -> list[dict]:
    """One result row per path of ``paths`` ({"core": (...), "layer": (...)}) at ``point`` in ``mode``.

    ``compiled``: the CompiledPath of each compiled path. Its first call at this point is timed apart (it includes
    any compile) and is not part of its timing; if it fails, the path is dropped from here on and its
    ``skip_reason`` says why. A path that is skipped, fails to compile or that torch refuses here gets a row with
    ``unavailable`` (the reason) and no timing. Every timed row's ``kernel`` is what the profiler saw run. Every path
    is timed in the same rounds, so each row's time ratio is over its section's reference of the same rounds
    (vit_einops.bench.paired); the memory ratio divides the two peaks. ``meter``: the device measured on and how
    (default: the CPU's).
    """
    probe = probe or LoadProbe()  # the run's: the load fallback needs to know how long the run has gone on
    meter = meter or Meter()
    grad = mode == "forward_backward"
    q, k, v, x = _inputs(point, dtype, grad, meter.device)
    forwards = _forwards(point, dtype, paths, compiled, q, k, v, x)
    calls = {key: _forward_backward(fn, inputs) if grad else fn for key, (fn, inputs) in forwards.items()}
    first_call_s, unavailable = {}, {}
    with torch.enable_grad() if grad else torch.inference_mode():
        for path in paths.get("core", ()):
            if path in COMPILED_PATHS and ("core", path) not in calls:
                unavailable["core", path] = compiled[path].skip_reason if path in compiled else "not compiled"
            elif path == "flex_compiled" and grad and (reason := flex_backward_refusal(dtype, q.device)):
                unavailable["core", path] = reason  # asked before compiling: see flex_backward_refusal
            elif path in COMPILED_PATHS:
                first_call_s[path], unavailable["core", path] = compiled[path].first_call(calls["core", path])
            elif path in SDPA_BACKENDS:
                unavailable["core", path] = refusal(path, calls["core", path], q.device)
        unavailable = {key: reason for key, reason in unavailable.items() if reason is not None}
        calls = {key: fn for key, fn in calls.items() if key not in unavailable}
        if not calls:  # every path refused here (the compiled ones, skipped): their reasons, nothing to time
            return _unavailable_rows(point, mode, dtype, unavailable)
        kernels = {key: kernel_ran(fn) for key, fn in calls.items()}
        start = probe.sample()
        timings = meter.time({f"{s}/{p}": fn for (s, p), fn in calls.items()}, rounds=rounds, min_run_time=min_run_time)
        end = probe.sample()
        peaks = meter.peak_bytes({f"{s}/{p}": fn for (s, p), fn in calls.items()})

    ratios = {}
    for section in dict.fromkeys(s for s, _ in calls):
        if (section, REFERENCE[section]) in calls:
            round_s = {p: timings[f"{s}/{p}"].round_s for s, p in calls if s == section}
            ratios |= {(section, p): r for p, r in paired_ratios(round_s, REFERENCE[section]).items()}
    rows = _unavailable_rows(point, mode, dtype, unavailable)
    for section, path in calls:
        timing, flops = timings[f"{section}/{path}"], point.flops(section, mode)
        ref_peak = peaks.get(f"{section}/{REFERENCE[section]}")
        rows.append(
            dict(
                section=section,
                mode=mode,
                path=path,
                kernel=kernels[section, path],
                batch=point.batch,
                heads=point.heads,
                tokens=point.tokens,
                head_dim=point.head_dim,
                dtype=str(dtype).removeprefix("torch."),
                median_s=timing.median_s,
                iqr_s=timing.iqr_s,
                blocks=timing.blocks,
                gflop=flops / 1e9,
                gflop_per_s=flops / timing.median_s / 1e9,
                peak_bytes=peaks[f"{section}/{path}"],
                attn_matrix_bytes=point.attention_matrix_bytes(dtype),
                first_call_s=first_call_s.get(path),
                **ratio_fields(ratios.get((section, path))),
                mem_ratio=peaks[f"{section}/{path}"] / ref_peak if ref_peak else None,
                rounds=len(timing.round_s),
                **probe.row_fields(timing, start, end, torch.get_num_threads()),
            )
        )
    return rows


def _unavailable_rows(point: Point, mode: str, dtype: torch.dtype, unavailable: dict) -> list[dict]:
    """A row per path refused at ``point`` in ``mode``: ``unavailable`` is the reason, and there is no timing."""
    return [
        dict(section=section, mode=mode, path=path, batch=point.batch, heads=point.heads, tokens=point.tokens,
             head_dim=point.head_dim, dtype=str(dtype).removeprefix("torch."), unavailable=reason)
        for (section, path), reason in unavailable.items()
    ]  # fmt: skip
