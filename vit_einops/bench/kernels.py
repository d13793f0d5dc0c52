"""torch's own attention kernels as bench paths, and the name of the kernel that actually ran.

sdpa_math, sdpa_flash, sdpa_efficient, sdpa_cudnn: F.scaled_dot_product_attention with
torch.nn.attention.sdpa_kernel allowing that one backend. torch raises, rather than falls back, when the one
allowed backend cannot take the inputs (efficient and cuDNN are CUDA kernels; flash refuses some dtypes and
shapes), so a refused path is reported with torch's reason instead of timed.
flex_compiled: torch.compile of torch.nn.attention.flex_attention with no score_mod and no mask.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention

from .measure import PROFILER_NOISE, filtered_stderr
from .names import SDPA_BACKEND_PATHS

# Each of names.SDPA_BACKEND_PATHS, in order, and the backend it forces.
SDPA_BACKENDS = dict(zip(SDPA_BACKEND_PATHS, (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION,
                                              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION), strict=True))
_CUDA_ONLY = ("sdpa_efficient", "sdpa_cudnn")

# The profiler's op names that say which attention kernel ran. A fused kernel is one op; the math backend, the
# einsum and chunked paths are matmuls and a softmax; a compiled graph is inductor's code around extern calls.
_FUSED_PREFIXES = ("aten::_scaled_dot_product_", "aten::_native_multi_head_attention")
_UNFUSED_OPS = ("aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm", "aten::_softmax", "aten::_safe_softmax")
_COMPILED_MARK = "CompiledFxGraph"


def sdpa_backend_call(path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], torch.Tensor]:
    """F.scaled_dot_product_attention(q, k, v) with only the backend ``path`` names allowed."""
    if path not in SDPA_BACKENDS:
        raise ValueError(f"sdpa backend path {path!r} is not one of {', '.join(SDPA_BACKENDS)}")
    backend = SDPA_BACKENDS[path]

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    return call


def compiled_flex() -> Callable:
    """torch.compile of flex_attention: uncompiled, flex_attention runs a slow reference, not its kernel."""
    return torch.compile(flex_attention, dynamic=True)


def flex_backward_refusal(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why flex_attention has no backward for ``dtype`` on ``device`` (torch 2.13: none on a CPU), else None.

    Asked of eager flex_attention on a tiny input: the same attempt through torch.compile makes later compiles of
    flex_attention at new shapes fall back to its eager reference (bmm and softmax, seen in the kernel column).
    """
    q, k, v = (torch.zeros(1, 1, 4, 8, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    try:
        with torch.enable_grad():
            flex_attention(q, k, v).sum().backward()
    except NotImplementedError as error:
        return f"torch: {str(error).splitlines()[0][:200]}"
    return None


def refusal(path: str, call: Callable[[], object], device: torch.device) -> str | None:
    """Run ``call`` once: None if it ran, else why torch refused it (a path to report, never to time)."""
    # torch says why a backend declined the inputs in warnings, and raises only "No available kernel".
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            call()
        except RuntimeError as error:
            cuda_only = "a CUDA-only backend; " if path in _CUDA_ONLY and device.type != "cuda" else ""
            why = [str(error).split(". ")[0]] + [str(w.message).split(" (Triggered internally")[0] for w in said]
            return f"{SDPA_BACKENDS[path].name} on {device.type}: {cuda_only}torch: " + "; ".join(
                dict.fromkeys(w for w in why if "kernel not used because" not in w)
            )
    return None


def kernel_ran(call: Callable[[], object]) -> str:
    """The attention kernel(s) one call of ``call`` ran, from torch.profiler's op names, in the order first run.

    A fused SDPA or MHA kernel (forward and its backward) is named as torch names it; otherwise the matmul and
    softmax ops; inside a torch.compile graph, "inductor" and the extern ops the graph called.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with filtered_stderr(PROFILER_NOISE), torch.profiler.profile(activities=activities) as prof:
        call()
    names = list(dict.fromkeys(event.key for event in prof.key_averages()))
    fused = [n for n in names if n.startswith(_FUSED_PREFIXES)]
    if fused:
        return " + ".join(fused)
    unfused = [n for n in names if n in _UNFUSED_OPS or n == "aten::_softmax_backward_data"]
    compiled = ["inductor"] if any(_COMPILED_MARK in n for n in names) else []
    return " + ".join(compiled + unfused) or "unknown (no attention op in the profile)"
