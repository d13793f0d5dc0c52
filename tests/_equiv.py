"""Helpers for the equivalence tests: run two implementations on the same input, compare values and gradients.

Tolerances. Every equivalence test runs in float64 unless it says otherwise: the two implementations then
differ only by the order of their floating-point sums, about 1e-16 relative per operation, so 1e-10 absolute
(on values and gradients of order 1) leaves room for accumulation over a few hundred terms while still catching
any real difference in formula (a wrong scale, a transposed head, a missing term differs by 1e-2 or more).
The float32 tests use rtol 1e-4 and an atol of 1e-5 times the largest |expected| of the tensor: float32's eps is
1.2e-7, SDPA / MKL kernels sum in other orders and blocks than einsum, and a weight gradient sums b*n products
(394 at ViT-B's 197 tokens, batch 2), so its entries reach ~20 and its rounding error grows with them.
"""

from __future__ import annotations

import torch

from vit_einops.reference import forward_backward  # noqa: F401  (re-exported for the tests)

F64_TOL = dict(rtol=1e-9, atol=1e-10)
F32_TOL = dict(rtol=1e-4, atol=1e-5, scale_atol=True)


def assert_close(actual, expected, tol, what: str) -> float:
    """assert_close with a label; returns the max absolute difference (reported in the closing note).

    With ``scale_atol`` the atol is relative to the largest magnitude in ``expected``.
    """
    tol = dict(tol)
    if tol.pop("scale_atol", False) and expected.numel():
        tol["atol"] *= max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, **tol, msg=lambda m: f"{what}: {m}")
    return (actual - expected).abs().max().item() if actual.numel() else 0.0
