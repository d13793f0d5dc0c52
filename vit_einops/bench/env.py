"""What the numbers were measured on: the header every result file carries."""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
import time
from pathlib import Path

import einops
import torch

from .measure import time_interleaved

# CPU flags that give matmuls of each half-precision dtype a path in hardware (x86: AVX512-BF16 and AMX-BF16;
# AVX512-FP16 and AMX-FP16); without them torch emulates the dtype and runs far slower than float32.
HALF_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags to report
        return set()
    match = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def cpu_model() -> str:
    try:
        match = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        match = None
    return match.group(1).strip() if match else (platform.processor() or platform.machine())


def blas_info() -> str:
    """The BLAS torch was built with, from torch.__config__.show(): BLAS_INFO plus the library's own line."""
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    library = re.search(r"^\s*-\s*(.*(?:Math Kernel Library|OpenBLAS|BLIS|Accelerate)[^\n]*)$", config, re.MULTILINE)
    parts = [blas.group(1) if blas else "unknown"] + ([library.group(1).strip()] if library else [])
    return "; ".join(parts)


def machine_info() -> dict[str, object]:
    """torch and einops versions, threads, CPU capability and model, BLAS, load average at the time of the call."""
    flags = cpu_flags()
    return dict(
        time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        torch=torch.__version__,
        einops=einops.__version__,
        python=sys.version.split()[0],
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_model=cpu_model(),
        bf16_hardware=[f for f in HALF_FLAGS["bfloat16"] if f in flags],
        fp16_hardware=[f for f in HALF_FLAGS["float16"] if f in flags],
        blas=blas_info(),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )


@functools.cache
def half_slowdown(dtype: torch.dtype, size: int = 512) -> float:
    """Seconds of a CPU matmul in ``dtype`` over those of a float32 one of the same size (> 1: slower here);
    measured once per process (the command checks its dtype before taking its lock, the run again)."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = (torch.randn(size, size, generator=g) for _ in range(2))
    a16, b16 = a32.to(dtype), b32.to(dtype)
    t = time_interleaved(
        {"float32": lambda: torch.mm(a32, b32), "half": lambda: torch.mm(a16, b16)}, rounds=2, min_run_time=0.05
    )
    return t["half"].median_s / t["float32"].median_s
