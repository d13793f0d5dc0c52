"""The "chunked" attention path: Eq. 6-7 over blocks of queries, with a backward pass that recomputes A.

A query's row of A = softmax(q k^T / sqrt(D_h)) needs every key but no other query, so the rows can be computed a
block at a time, each with its exact softmax: only one block of A exists at once. The custom backward recomputes
each block from q, k, v and the output (FlashAttention's delta trick) instead of storing A, so memory stays
O(b h n d) rather than O(b h n^2). Axes: b batch, h heads, i queries, j keys, d head size; (b h) is the batch and
head axes flattened into one, the batch axis of every block product.

Each block is three passes over one (g, c, m) buffer of scores that is allocated once per call and reused:
S = q k^T * scale written into it (one GEMM with K = D_h, the scale folded in), A = softmax(S) in place, and
A v written straight into the output. The einsum of each product is written beside it; ``torch.baddbmm`` and
``torch.bmm`` compute exactly that einsum, but into memory we hand them, where einsum would allocate a new block
and copy the result out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

# Where Linux describes the caches of CPU 0 (one index* directory per cache: level, type, size).
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
# Without a readable cache description: 256 KiB of scores, the smallest L2 of current x86 and Arm server cores.
FALLBACK_L2_BYTES = 256 * 1024


def l2_cache_bytes(cache_dir: Path = CACHE_DIR) -> int:
    """The per-core level-2 cache size as the kernel reports it (e.g. "512K", "2048K"), or FALLBACK_L2_BYTES."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    try:
        for index in sorted(cache_dir.glob("index*")):
            if (index / "level").read_text().strip() == "2" and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip()
                return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    except (OSError, ValueError):  # no sysfs (not Linux, a container without it) or a format we do not know
        pass
    return FALLBACK_L2_BYTES


def default_chunk_elements(threads: int | None = None) -> int:
    """Scores per block: each of torch's ``threads`` gets an L2 cache's worth of float32 scores (at most 2**22).

    A block is written by the first product, read and rewritten by the softmax and read by the second product,
    each of them split across the threads; when every thread's share fits in its core's L2 cache the two later
    passes never go to L3 or memory. Measured with benchmarks/chunked.py on a 2 MiB-L2 Xeon (2 threads): blocks
    of a quarter of that (131072 scores) were 1.3x to 1.6x slower, blocks of 2 to 8 times it within noise of each
    other; much smaller blocks pay Python's per-block overhead, much larger ones spill to L3 in the softmax pass.
    """
    threads = torch.get_num_threads() if threads is None else threads
    return min(2**22, max(2**12, l2_cache_bytes() // 4 * max(1, threads)))


# The default block, computed once at import for torch's thread count then (reading sysfs changes nothing);
# Attend(chunk_elements=...) and chunked_attention(max_elements=...) override it.
CHUNK_ELEMENTS = default_chunk_elements()


def attention_blocks(b: int, h: int, n: int, m: int, max_elements: int) -> Iterator[tuple[slice, slice, slice]]:
    """Yield (images, heads, queries) slices tiling a (b, h, n, .) tensor, whose score blocks (g, hh, c, m) hold at
    most ``max_elements`` numbers (at least one query row, so never fewer than m).

    Whole images are grouped when one image's h*n*m scores fit; otherwise heads of one image when one head's n*m
    fit; otherwise query rows of one head. Each block is one contiguous range of the flattened (b h) axis, so its
    slice of q, k, v and of the output is contiguous memory.
    """
    per_head = n * m
    if h * per_head <= max_elements:
        g = max(1, min(b, max_elements // (h * per_head))) if h * per_head else max(1, b)
        for b0 in range(0, b, g):
            yield slice(b0, min(b0 + g, b)), slice(0, h), slice(0, n)
    elif per_head <= max_elements:
        hh = max_elements // per_head
        for b0 in range(b):
            for h0 in range(0, h, hh):
                yield slice(b0, b0 + 1), slice(h0, min(h0 + hh, h)), slice(0, n)
    else:
        c = max(1, max_elements // m)
        for b0 in range(b):
            for h0 in range(h):
                for i0 in range(0, n, c):
                    yield slice(b0, b0 + 1), slice(h0, h0 + 1), slice(i0, min(i0 + c, n))


def _rows(block: tuple[slice, slice, slice], h: int) -> slice:
    """The block's range on the flattened (b h) axis: images x heads, contiguous by construction."""
    images, heads, _ = block
    return slice(images.start * h + heads.start, (images.stop - 1) * h + heads.stop)


def _flat(t: torch.Tensor) -> torch.Tensor:
    # (b, h, n, d) -> ((b h), n, d): a view when t is contiguous, else one copy. A plain reshape rather than
    # einops.rearrange, which costs ~10 us a call in parsing and caching, more than a small block's products.
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def _block_probabilities(q, k, mask, block, rows, scale, buffer, dropout_p, generator):
    """One block of A = softmax(q k^T * scale) (Eq. 6) for ``block``, computed in ``buffer``; then its dropout.

    q, k are (b h)-flattened. Returns (A block, dropout multipliers or None); the multipliers are 0 or 1/(1-p),
    drawn from ``generator`` so the backward pass can redraw exactly the same ones.
    """
    q_block, k_block = q[rows, block[2]], k[rows]
    shape = (*q_block.shape[:2], k_block.shape[1])  # (bh, i, j)
    scores = buffer[: shape[0] * shape[1] * shape[2]].view(shape)
    # scores = einsum(q_block, k_block, "bh i d, bh j d -> bh i j") * scale; beta=0: the buffer's old values unused.
    torch.baddbmm(scores, q_block, k_block.transpose(1, 2), beta=0.0, alpha=scale, out=scores)
    if mask is not None:
        images, heads, _ = block
        scores.view(images.stop - images.start, heads.stop - heads.start, *scores.shape[1:]).masked_fill_(
            ~mask[block], float("-inf")
        )
    attn = torch.softmax(scores, dim=-1, out=scores)
    if not dropout_p:
        return attn, None
    keep = torch.empty_like(attn).bernoulli_(1.0 - dropout_p, generator=generator).div_(1.0 - dropout_p)
    return attn, keep


def _block_buffer(q: torch.Tensor, first: tuple[slice, slice, slice], h: int, m: int) -> torch.Tensor:
    """One flat buffer for the scores of the plan's first block (the largest), reused by every block."""
    rows = _rows(first, h)
    return q.new_empty((rows.stop - rows.start) * (first[2].stop - first[2].start) * m)


def _chunked_forward(q, k, v, mask, scale, dropout_p, seed, max_elements):
    b, h, n, _ = q.shape
    m = k.shape[2]
    generator = torch.Generator(q.device).manual_seed(seed) if dropout_p else None
    q_, k_, v_ = _flat(q), _flat(k), _flat(v)
    out = q_.new_empty(b * h, n, v.shape[-1])
    blocks = list(attention_blocks(b, h, n, m, max_elements))
    buffer = _block_buffer(q, blocks[0], h, m) if blocks else None
    for block in blocks:
        rows = _rows(block, h)
        attn, keep = _block_probabilities(q_, k_, mask, block, rows, scale, buffer, dropout_p, generator)
        if keep is not None:
            attn.mul_(keep)
        # out block = einsum(attn, v, "bh i j, bh j d -> bh i d"), written in place.
        torch.bmm(attn, v_[rows], out=out[rows, block[2]])
    return out.view(b, h, n, v.shape[-1])


class _ChunkedAttention(torch.autograd.Function):
    """Gradients of the chunked path from q, k, v and the output alone, block by block.

    With P = softmax(S) a block of A, M its dropout multipliers (1 without dropout), O = (P*M) v and dO the
    incoming gradient: dv = (P*M)^T dO, dP = (dO v^T) * M, dS = P * (dP - delta) with delta = rowsum(dO * O)
    (= rowsum(P * dP), FlashAttention's D, one number per query), dq = dS k * scale, dk = dS^T q * scale.
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
        m = k.shape[2]
        generator = torch.Generator(q.device).manual_seed(seed) if dropout_p else None
        q_, k_, v_, grad_out_ = _flat(q), _flat(k), _flat(v), _flat(grad_out)
        delta = (grad_out_ * _flat(out)).sum(dim=-1, keepdim=True)
        grad_q, grad_k, grad_v = torch.empty_like(q_), torch.zeros_like(k_), torch.zeros_like(v_)
        blocks = list(attention_blocks(b, h, n, m, max_elements))
        buffer, grad_buffer = (_block_buffer(q, blocks[0], h, m) if blocks else None for _ in range(2))
        for block in blocks:
            rows, queries = _rows(block, h), block[2]
            attn, keep = _block_probabilities(q_, k_, mask, block, rows, scale, buffer, dropout_p, generator)
            kept = attn if keep is None else attn * keep
            grad_out_block = grad_out_[rows, queries]
            # dv += einsum(kept, dO, "bh i j, bh i d -> bh j d")
            grad_v[rows].baddbmm_(kept.transpose(1, 2), grad_out_block)
            # dP = einsum(dO, v, "bh i d, bh j d -> bh i j")
            grad_attn = grad_buffer[: attn.numel()].view(attn.shape)
            torch.bmm(grad_out_block, v_[rows].transpose(1, 2), out=grad_attn)
            if keep is not None:
                grad_attn.mul_(keep)
            grad_scores = grad_attn.sub_(delta[rows, queries]).mul_(attn)  # dS, in place on dP
            # dq = einsum(dS, k, "bh i j, bh j d -> bh i d") * scale, written in place
            grad_q_block = grad_q[rows, queries]
            torch.baddbmm(grad_q_block, grad_scores, k_[rows], beta=0.0, alpha=scale, out=grad_q_block)
            # dk += einsum(dS, q, "bh i j, bh i d -> bh j d") * scale
            grad_k[rows].baddbmm_(grad_scores.transpose(1, 2), q_[rows, queries], alpha=scale)
        return grad_q.view(q.shape), grad_k.view(k.shape), grad_v.view(v.shape), None, None, None, None, None


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

    ``max_elements`` defaults to CHUNK_ELEMENTS (an L2 cache of scores per thread). A block never holds more
    scores than q holds numbers or CHUNK_ELEMENTS, whichever is larger, so the scores alive at once (a block and, in
    backward, its gradient) stay within twice the output or two cache-sized blocks: peak memory O(b h n d) plus a
    constant, whatever n is. Equal to the
    full-matrix einsum up to float rounding, in values and gradients; dropout on A, when ``dropout_p`` > 0, is
    drawn per block from a generator seeded off torch's global one (so ``torch.manual_seed`` makes it
    reproducible) and redrawn identically in the backward pass. With no queries (or no images, or no heads) the
    output is empty; with no keys it is zeros, as on the einsum and SDPA paths.

    Shapes: q (b, h, n, d), k (b, h, m, d), v (b, h, m, e); mask None or bool broadcastable to (b, h, n, m),
    True = may attend; output (b, h, n, e).
    """
    b, h, n, _ = q.shape
    m = k.shape[2]
    if mask is not None:
        mask = mask.expand(b, h, n, m)  # a view: blocks of it are sliced like the queries
    # Never more scores at once than q holds numbers or one default block holds, whichever is larger: memory stays
    # O(b h n d) plus one cache-sized block, and small inputs still get few blocks (each costs a thread barrier).
    max_elements = max(1, min(max_elements, max(q.numel(), CHUNK_ELEMENTS)))
    seed = int(torch.randint(2**62, ())) if dropout_p else 0
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _ChunkedAttention.apply(q, k, v, mask, scale, dropout_p, seed, max_elements)
    return _chunked_forward(q, k, v, mask, scale, dropout_p, seed, max_elements)
