"""The "chunked" attention path: Eq. 6-7 over blocks of queries, with a backward pass that recomputes A.

A query's row of A = softmax(q k^T / sqrt(D_h)) needs every key but no other query, so the rows can be computed a
block at a time, each with its exact softmax: only one block of A exists at once. The custom backward recomputes
each block from q, k, v and the output (FlashAttention's delta trick) instead of storing A, so memory stays
O(b h n d) rather than O(b h n^2). Axes: b batch, h heads, i queries, j keys, d head size.
"""

from __future__ import annotations

import torch
from einops import einsum
from torch.autograd.function import once_differentiable

# Numbers in one block of scores (g images, h heads, c queries, all m keys) on the "chunked" path: 2**20 float32
# are 4 MiB, so the scores and their softmax stay in a 32 MiB L3 cache while the einsums run; larger blocks measured
# slower on a 2-core AVX-512 machine and cost memory, much smaller ones pay Python overhead per block.
CHUNK_ELEMENTS = 2**20


def attention_blocks(b: int, h: int, n: int, m: int, max_elements: int = CHUNK_ELEMENTS):
    """Yield index tuples (images, all heads, queries) tiling a (b, h, n, .) tensor, whose score blocks
    (g, h, c, m) hold at most ``max_elements`` numbers: whole images are grouped when one image's h*n*m scores
    fit, otherwise one image is cut into blocks of c query rows (at least one row, so never below h*m numbers)."""
    per_image = h * n * m
    if per_image <= max_elements:
        g, c = min(b, max_elements // per_image), n
    else:
        g, c = 1, max(1, max_elements // (h * m))
    for b0 in range(0, b, g):
        for i0 in range(0, n, c):
            yield slice(b0, b0 + g), slice(None), slice(i0, i0 + c)


def _block_probabilities(q_block, k, mask, blk, dropout_p, generator):
    """One block of A = softmax(q k^T / sqrt(D_h)) (Eq. 6) for queries ``blk``, then dropout on it.

    ``q_block`` is q[blk] / sqrt(D_h). Returns (A block, dropout multipliers or None); the multipliers are 0 or
    1/(1-p), drawn from ``generator`` so the backward pass can redraw exactly the same ones.
    """
    energy = einsum(q_block, k[blk[0]], "b h i d, b h j d -> b h i j")
    if mask is not None:
        energy.masked_fill_(~mask[blk], float("-inf"))  # in place: the block is a fresh tensor no graph holds
    attn = energy.softmax(dim=-1)
    if not dropout_p:
        return attn, None
    keep = torch.empty_like(attn).bernoulli_(1.0 - dropout_p, generator=generator).div_(1.0 - dropout_p)
    return attn, keep


def _chunked_forward(q, k, v, mask, scale, dropout_p, seed, max_elements):
    b, h, n, _ = q.shape
    generator = torch.Generator(q.device).manual_seed(seed) if dropout_p else None
    out = q.new_empty(*q.shape[:3], v.shape[-1])
    for blk in attention_blocks(b, h, n, k.shape[2], max_elements):
        # Scaled per block, not all of q at once: a whole scaled copy of q would be one more (b, h, n, d).
        attn, keep = _block_probabilities(q[blk] * scale, k, mask, blk, dropout_p, generator)
        if keep is not None:
            attn = attn * keep
        out[blk] = einsum(attn, v[blk[0]], "b h i j, b h j d -> b h i d")
    return out


class _ChunkedAttention(torch.autograd.Function):
    """Gradients of the chunked path from q, k, v and the output alone, block by block.

    With P = softmax(S) a block of A, M its dropout multipliers (1 without dropout), O = (P*M) v and dO the
    incoming gradient: dv = (P*M)^T dO, dP = (dO v^T) * M, dS = P * (dP - delta) with delta = rowsum(dO * O)
    (= rowsum(P * dP), FlashAttention's D, one number per query), dq = dS k / sqrt(D_h), dk = dS^T q / sqrt(D_h).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, dropout_p, seed, max_elements):
        out = _chunked_forward(q, k, v, mask, scale, dropout_p, seed, max_elements)
        ctx.save_for_backward(q, k, v, out, mask)
        ctx.args = (scale, dropout_p, seed, max_elements)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, mask = ctx.saved_tensors
        scale, dropout_p, seed, max_elements = ctx.args
        b, h, n, _ = q.shape
        generator = torch.Generator(q.device).manual_seed(seed) if dropout_p else None
        delta = (grad_out * out).sum(dim=-1, keepdim=True)
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for blk in attention_blocks(b, h, n, k.shape[2], max_elements):
            images = blk[0]
            q_block = q[blk] * scale
            attn, keep = _block_probabilities(q_block, k, mask, blk, dropout_p, generator)
            kept = attn if keep is None else attn * keep
            grad_v[images] += einsum(kept, grad_out[blk], "b h i j, b h i d -> b h j d")
            grad_attn = einsum(grad_out[blk], v[images], "b h i d, b h j d -> b h i j")
            if keep is not None:
                grad_attn.mul_(keep)
            # dS for S = (q / sqrt(D_h)) k^T, in place on the fresh block; dq takes its 1/sqrt(D_h) once at the end.
            grad_energy = grad_attn.sub_(delta[blk]).mul_(attn)
            grad_q[blk] = einsum(grad_energy, k[images], "b h i j, b h j d -> b h i d")
            grad_k[images] += einsum(grad_energy, q_block, "b h i j, b h i d -> b h j d")
        return grad_q.mul_(scale), grad_k, grad_v, None, None, None, None, None


def chunked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float,
    dropout_p: float = 0.0,
    max_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """softmax(q k^T * scale) v (Eqs. 6-7) computed over blocks of at most ``max_elements`` scores.

    A block never holds more scores than q holds numbers either, so the scores alive at once (a block and its
    softmax) stay within twice the size of the output: peak memory O(b h n d) whatever n is. Equal to the
    full-matrix einsum up to float rounding, in values and gradients; dropout on A, when ``dropout_p`` > 0, is
    drawn per block from a generator seeded off torch's global one (so ``torch.manual_seed`` makes it
    reproducible) and redrawn identically in the backward pass.

    Shapes: q (b, h, n, d), k (b, h, m, d), v (b, h, m, e); mask None or bool broadcastable to (b, h, n, m),
    True = may attend; output (b, h, n, e).
    """
    b, h, n, _ = q.shape
    m = k.shape[2]
    if mask is not None:
        mask = mask.expand(b, h, n, m)  # a view: blocks of it are sliced like the queries
    max_elements = min(max_elements, q.numel())
    seed = int(torch.randint(2**62, ())) if dropout_p else 0
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _ChunkedAttention.apply(q, k, v, mask, scale, dropout_p, seed, max_elements)
    return _chunked_forward(q, k, v, mask, scale, dropout_p, seed, max_elements)
