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


def attention_and_gradients(model, x: torch.Tensor, score) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's softmax output A (b, h, n, n) and d score / dA, on the einsum path, written apart from
    vit_einops.inspect.relevance: A kept by a forward hook on the softmax, its gradient by a tensor hook during
    backward (put back in layer order). ``score(model, x)`` gives one scalar per image: a class's logit, or a
    backbone target's similarity."""
    model.set_attn_impl("einsum")
    maps, grads = [], []

    def keep(_module, _args, attn):
        maps.append(attn)
        attn.register_hook(grads.append)

    handles = [block.attn.mha.attend.softmax.register_forward_hook(keep) for block in model.blocks]
    try:
        score(model, x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad()
    grads.reverse()  # backward visits the layers last to first
    return [a.detach() for a in maps], grads


def chefer_reference(model, x: torch.Tensor, score, start_layer: int = 0) -> torch.Tensor:
    """Chefer et al.'s recipe with Transformer-Explainability's ``start_layer``: R = I, then
    R += mean_h((dA * A)^+) @ R for the layers from ``start_layer`` on (:func:`attention_and_gradients`)."""
    maps, grads = attention_and_gradients(model, x, score)
    b, n = x.shape[0], maps[0].shape[-1]
    relevance = torch.eye(n, dtype=x.dtype).repeat(b, 1, 1)
    for attn, grad in list(zip(maps, grads, strict=True))[start_layer:]:
        relevance = relevance + (grad * attn).clamp(min=0).mean(dim=1) @ relevance
    return relevance.detach()
