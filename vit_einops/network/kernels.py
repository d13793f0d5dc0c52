"""The attention kernels, one entry each: the one registry of how Eqs. 6-7 can be computed (HF's
``ALL_ATTENTION_FUNCTIONS``).

Every list of kernels is derived from :data:`KERNELS`: the choices of ``ViT(attn_impl=...)`` and ``vit-einops train
--attn-impl`` (:data:`ATTN_IMPLS`), the bench's rows (``vit_einops.bench.names``) and the memory estimate of a
forward pass (a kernel that never forms A holds one block of it at a time:
:func:`vit_einops.network.sizes.forward_bytes`).
:class:`~vit_einops.network.attention.Attend` dispatches through it. A new kernel is one file with its function and
one entry here.

Each kernel is a function ``fn(attend, q, k, v, mask) -> A v``: q, k, v (b, h, n, d), mask None or bool
broadcastable to (b, h, n, n) (True = may attend), ``attend`` the calling Attend, for its ``scale`` (1/sqrt(D_h)),
``dropout_p`` (attention dropout, 0 in eval), ``softmax`` and ``dropout`` modules and ``chunk_elements``. The entries
name their function by module and attribute, so this module needs no torch and the command line's ``--help`` reads
the names without loading it; the function is imported the first time a layer selects its kernel.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Kernel:
    """One way to compute softmax(q k^T / sqrt(D_h)) v.

    Attributes:
        name: what ``attn_impl`` calls it.
        function: "module:attribute" of its function; a module with a leading dot is relative to
            vit_einops.network.
        forms_attention: True when it holds the whole (b, h, n, n) matrix A at once (the memory estimate counts
            it); False when it holds at most a block of it.
        devices: the torch device types it runs on.
        dtypes: the dtypes of q, k, v it computes in.
        summary: one line for tables and ``--help``.
        prepare: "module:attribute" of a function run when a layer selects the kernel (its one-time planning,
            kept by the function), so that the forward passes read nothing; None when it plans nothing.
    """

    name: str
    function: str
    forms_attention: bool
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    summary: str
    prepare: str | None = None

    def select(self) -> Callable[..., Any]:
        """The kernel's function, imported on first use, after its planning."""
        if self.prepare is not None:
            _load(self.prepare)()
        return _load(self.function)


@functools.cache
def _load(function: str) -> Callable[..., Any]:
    module, _, attribute = function.partition(":")
    return getattr(importlib.import_module(module, __package__), attribute)


KERNELS: dict[str, Kernel] = {
    kernel.name: kernel
    for kernel in (
        Kernel("einsum", ".attention:einsum_attention", True, ("cpu", "cuda", "mps"), FLOAT_DTYPES,
               "the paper literally: A = softmax(q k^T / sqrt(D_h)) formed whole, then A v"),
        Kernel("chunked", ".chunked:chunked_kernel", False, ("cpu", "cuda", "mps"), FLOAT_DTYPES,
               "the same einsums over blocks of queries, one block of A at a time; backward recomputes A",
               prepare=".chunk_plan:plan_blocks"),
        Kernel("sdpa", ".attention:sdpa_attention", False, ("cpu", "cuda", "mps"), FLOAT_DTYPES,
               "torch.nn.functional.scaled_dot_product_attention, torch's fused kernel"),
    )
}  # fmt: skip
# The attention paths a model can run (runtime state, not architecture: ViT(attn_impl=...), model.set_attn_impl), as
# the command line and the bench list them.
ATTN_IMPLS = tuple(KERNELS)
