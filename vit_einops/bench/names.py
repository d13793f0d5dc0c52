"""The bench's names and numeric ranges, free of torch: the command line's --help reads them without loading it."""

from __future__ import annotations

from ..base.checks import check_int, check_real_in_range
from ..network.kernels import KERNELS

COMPILED_PATHS = ("einsum_compiled", "flex_compiled")  # the core paths torch.compile builds
SDPA_BACKEND_PATHS = ("sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")  # sdpa, one torch backend forced
# torch's fused kernel: the reference of the core rows' ratios and of the verdict
REFERENCE_KERNEL = "sdpa"
MODES = ("forward", "forward_backward")


# The paths are read from the kernel registry at each call, so a kernel registered after import has its rows too.
# Given a device type and a dtype, only the kernels that run there (Kernel.runs_on): a run's default paths.
def _kernels(device: str | None, dtype: str | None) -> list[str]:
    return [name for name, kernel in KERNELS.items() if device is None or kernel.runs_on(device, dtype)]


def core_paths(device: str | None = None, dtype: str | None = None) -> tuple[str, ...]:
    """Every kernel of the registry, then the bench's own variants of them."""
    return (*_kernels(device, dtype), COMPILED_PATHS[0], *SDPA_BACKEND_PATHS, COMPILED_PATHS[1])


def layer_paths(device: str | None = None, dtype: str | None = None) -> tuple[str, ...]:
    """Our MultiHeadAttention on each kernel that never forms A (the einsum one is the core rows' reference), and
    torch's."""
    kernels = (name for name in _kernels(device, dtype) if not KERNELS[name].forms_attention)
    return (*(f"mha_{name}" for name in kernels), "torch_mha")


def model_paths(device: str | None = None, dtype: str | None = None) -> tuple[str, ...]:
    """A whole ViT on each kernel, and torchvision's."""
    return (*_kernels(device, dtype), "torch")


MODEL_MODES = ("inference", "train_step")
# float32 everywhere; float16 and bfloat16 where the device computes them in hardware (vit_einops.bench.device).
DTYPES = ("float32", "float16", "bfloat16")

# The numeric options and their accepted ranges (inclusive), checked where options enter (BenchOptions and the
# CLI's argparse types). The upper bounds keep one run within minutes to hours on a CPU and its tensors within
# memory: a batch of 4096 at N 16384 is already far past what any machine here holds for the einsum path.
RANGES: dict[str, tuple[float, float]] = {
    "batches": (1, 4096),
    "heads": (1, 1024),
    "tokens": (1, 16384),
    "head_dims": (1, 4096),
    "model_batch": (1, 4096),
    "image_size": (1, 4096),
    "rounds": (1, 1000),
    "min_run_time": (1e-4, 60.0),  # seconds per round and path: inf would never return
    "ceiling_size": (16, 16384),
    "ceiling_run_time": (1e-4, 60.0),  # seconds of each matmul ceiling, as min_run_time
    "retries": (0, 10),
}


def check_in_range(name: str, value, kind: type, bounds: tuple[float, float] | None = None) -> int | float:
    """``value`` as an int (``kind`` int) or a finite float within ``bounds`` (default RANGES[name]); else an error
    naming both."""
    check = check_int if kind is int else check_real_in_range
    return check(name, value, *(RANGES[name] if bounds is None else bounds))
