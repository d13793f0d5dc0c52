"""The attention kernels, one entry each: the one registry of how Eqs. 6-7 can be computed (HF's
``ALL_ATTENTION_FUNCTIONS``).

Every list of kernels is derived from :data:`KERNELS` when it is read: the choices of ``ViT(attn_impl=...)`` and
``vit-einops train --attn-impl`` (:data:`ATTN_IMPLS`), the bench's rows (``vit_einops.bench.names``) and the memory
estimate of a forward pass (a kernel that never forms A holds one block of it at a time:
:func:`vit_einops.network.sizes.forward_bytes`). :class:`~vit_einops.network.attention.Attend` dispatches through
it, and a layer refuses a kernel that does not run on its weights' device and dtype, when the kernel is chosen and
when the layer moves (:meth:`~vit_einops.network.attention.MultiHeadAttention.check_kernel`). A new kernel is one
file with its function and one entry: here, or :func:`register_kernel` from the user's own code.

Each kernel is a function ``fn(attend, q, k, v, mask) -> A v``: q, k, v (b, h, n, d), mask None or bool
broadcastable to (b, h, n, n) (True = may attend), ``attend`` the calling Attend, for its ``scale`` (1/sqrt(D_h)),
``dropout_p`` (attention dropout, 0 in eval), ``softmax`` and ``dropout`` modules and ``chunk_elements``. The entries
name their function by module and attribute, so this module needs no torch and the command line's ``--help`` reads
the names without loading it; the function is imported the first time a layer selects its kernel.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# The device that holds shapes and no values (loaders build models there): every kernel "runs" on it.
SHAPES_ONLY_DEVICE = "meta"
# A kernel written in plain torch ops runs wherever torch does (xpu, hpu, privateuse1 backends...): its devices say so
# with this one entry instead of a list that would refuse a device nobody wrote down.
ANY_DEVICE = "*"


@dataclass(frozen=True)
class Kernel:
    """One way to compute softmax(q k^T / sqrt(D_h)) v.

    Attributes:
        name: what ``attn_impl`` calls it.
        function: "module:attribute" of its function (a module with a leading dot is relative to
            vit_einops.network), or the function itself.
        forms_attention: True when it holds the whole (b, h, n, n) matrix A at once (the memory estimate counts
            it); False when it holds at most a block of it.
        devices: the torch device types it runs on ("cpu", "cuda", "mps", ...), or (ANY_DEVICE,) for every one.
        dtypes: the dtypes of q, k, v it computes in, of :data:`FLOAT_DTYPES`.
        summary: one line for tables and ``--help``.
        prepare: "module:attribute" of a function run when a layer selects the kernel (its one-time planning,
            kept by the function), so that the forward passes read nothing; None when it plans nothing.
    """

    name: str
    function: str | Callable[..., Any]
    forms_attention: bool
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    summary: str
    prepare: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a kernel's name is what attn_impl calls it, an identifier such as 'flash'; got "
                             f"{self.name!r}")  # fmt: skip
        if not (callable(self.function) or isinstance(self.function, str) and ":" in self.function):
            raise TypeError(f"kernel {self.name!r}: function is 'module:attribute' or a callable, got "
                            f"{self.function!r}")  # fmt: skip
        if not isinstance(self.forms_attention, bool):
            raise TypeError(f"kernel {self.name!r}: forms_attention is True or False, got {self.forms_attention!r}")
        if not (isinstance(self.devices, tuple) and self.devices and all(isinstance(d, str) for d in self.devices)):
            raise TypeError(f"kernel {self.name!r}: devices is a tuple of device types such as ('cpu',), got "
                            f"{self.devices!r}")  # fmt: skip
        unknown = [d for d in self.dtypes if d not in FLOAT_DTYPES] if isinstance(self.dtypes, tuple) else [self.dtypes]
        if unknown or not self.dtypes:
            raise ValueError(f"kernel {self.name!r}: dtypes {self.dtypes!r}; expected a tuple of some of "
                             f"{', '.join(FLOAT_DTYPES)}")  # fmt: skip

    def runs_on(self, device: str, dtype: str) -> bool:
        """Whether it computes on device type ``device`` in ``dtype`` (a name of FLOAT_DTYPES)."""
        on_device = device == SHAPES_ONLY_DEVICE or device in self.devices or ANY_DEVICE in self.devices
        return on_device and (device == SHAPES_ONLY_DEVICE or dtype in self.dtypes)

    def select(self) -> Callable[..., Any]:
        """The kernel's function, imported on first use, after its planning."""
        if self.prepare is not None:
            _load(self.prepare)()
        return _load(self.function)


@functools.cache
def _load(function: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(function):
        return function
    module, _, attribute = function.partition(":")
    return getattr(importlib.import_module(module, __package__), attribute)


KERNELS: dict[str, Kernel] = {
    kernel.name: kernel
    for kernel in (
        Kernel("einsum", ".attention:einsum_attention", True, (ANY_DEVICE,), FLOAT_DTYPES,
               "the paper literally: A = softmax(q k^T / sqrt(D_h)) formed whole, then A v"),
        Kernel("chunked", ".chunked:chunked_kernel", False, (ANY_DEVICE,), FLOAT_DTYPES,
               "the same einsums over blocks of queries, one block of A at a time; backward recomputes A",
               prepare=".chunk_plan:plan_blocks"),
        Kernel("sdpa", ".attention:sdpa_attention", False, (ANY_DEVICE,), FLOAT_DTYPES,
               "torch.nn.functional.scaled_dot_product_attention, torch's fused kernel"),
    )
}  # fmt: skip
BUILTIN_KERNELS = frozenset(KERNELS)  # the package's own: the default "einsum" and the others stay registered


class KernelNames(Sequence[str]):
    """The names of :data:`KERNELS` in order, read at each use: a kernel registered later is among them, one
    unregistered is not. Compares equal to a tuple or list of the same names."""

    def __getitem__(self, index: Any) -> Any:
        return tuple(KERNELS)[index]

    def __len__(self) -> int:
        return len(KERNELS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (tuple, list, KernelNames)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # equal to tuples that hash, so it cannot hash consistently

    def __repr__(self) -> str:
        return repr(tuple(KERNELS))


# The attention paths a model can run (runtime state, not architecture: ViT(attn_impl=...), model.set_attn_impl), as
# the command line and the bench list them.
ATTN_IMPLS = KernelNames()


def register_kernel(kernel: Kernel) -> Kernel:
    """Add ``kernel`` to :data:`KERNELS`: from then on ``attn_impl`` takes its name, every layer can run it, and the
    bench and the memory estimate count it. A name already registered is a ValueError."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"register_kernel takes a Kernel(name, function, forms_attention, devices, dtypes, summary), "
                        f"got {type(kernel).__name__}")  # fmt: skip
    if kernel.name in KERNELS:
        raise ValueError(f"a kernel named {kernel.name!r} is registered already; unregister_kernel({kernel.name!r}) "
                         f"first, or give the new one another name")  # fmt: skip
    KERNELS[kernel.name] = kernel
    return kernel


def unregister_kernel(name: str) -> Kernel:
    """Remove the kernel ``name`` added by :func:`register_kernel` and return its entry; the package's own kernels
    stay (the layers' default is one of them)."""
    if name in BUILTIN_KERNELS:
        raise ValueError(f"kernel {name!r} is one of the package's own ({', '.join(sorted(BUILTIN_KERNELS))}); "
                         f"only a kernel added by register_kernel can be unregistered")  # fmt: skip
    if name not in KERNELS:
        raise ValueError(f"no kernel {name!r} is registered; the kernels are {', '.join(map(repr, KERNELS))}")
    return KERNELS.pop(name)


def check_kernel_runs(name: str, device: str, dtype: str) -> str:
    """``name`` if its kernel computes on device type ``device`` in ``dtype`` (a name of FLOAT_DTYPES), else a
    ValueError naming the kernel, the device and dtype, and the kernels that do."""
    kernel = KERNELS[name]
    if kernel.runs_on(device, dtype):
        return name
    able = [other for other, k in KERNELS.items() if k.runs_on(device, dtype)]
    where = f"in {dtype}" if device in kernel.devices or ANY_DEVICE in kernel.devices else f"on {device}"
    devices = "any device" if ANY_DEVICE in kernel.devices else ", ".join(kernel.devices)
    instead = f"the kernels that do: {', '.join(map(repr, able))}" if able else "no registered kernel does"
    raise ValueError(
        f"attention kernel {name!r} does not run {where} (it runs on {devices} in "
        f"{', '.join(kernel.dtypes)}); on {device} in {dtype}, {instead}"
    )
