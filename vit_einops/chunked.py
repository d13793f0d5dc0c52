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
and copy the result out. The blocks of every tensor are cut with one ``split`` each (BlockPlan), not sliced in the
loop: at N 1025 a head is 9 blocks, and two Python-level slices per block per tensor cost more than the softmax
saves by staying in cache.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

# Where Linux describes the caches of CPU 0 (one index* directory per cache: level, type, size).
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
# Without a readable cache description: 256 KiB, the smallest L2 of current x86 and Arm server cores.
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
    """Scores per block: for each of torch's ``threads``, as many float32 scores as its core's L2 cache has bytes
    (a block of four L2 caches per thread), between 2**12 and 2**22.

    Per block the path pays a fixed cost (a few op dispatches, a thread barrier per op, packing the k and v panels
    for the two GEMMs); per score it pays the GEMMs and a softmax pass that re-reads the block. Measured with
    benchmarks/chunked.py (min of interleaved rounds) on a 2-core AMD EPYC (L2 512 KiB, L3 32 MiB; N 577 and
    1025, b 1 and 8, 1 and 2 threads, forward and forward+backward), blocks of one L2 of scores per thread
    (a quarter of these) were 1% to 8% slower at 9 of 10 points, and blocks twice these no faster; on a 2 MiB-L2
    Xeon (2 threads) blocks of a quarter of one L2 were 1.3x to 1.6x slower and blocks of 2 to 8 L2s within noise
    of each other. The large shared L3 serves the softmax pass; what a small block loses is the fixed cost.
    """
    threads = torch.get_num_threads() if threads is None else threads
    return min(2**22, max(2**12, l2_cache_bytes() * max(1, threads)))


# The default block, computed once at import for torch's thread count then (reading sysfs changes nothing);
# Attend(chunk_elements=...) and chunked_attention(max_elements=...) override it.
CHUNK_ELEMENTS = default_chunk_elements()


def even_parts(total: int, most: int) -> list[slice]:
    """``range(total)`` cut into the fewest parts of at most ``most`` each, their sizes differing by at most one
    (17 rows in parts of at most 5: 5, 4, 4, 4, not 5, 5, 5, 2: a short last block costs a whole block's fixed
    cost for a sliver of work, and at N 1025 with 1023-row blocks the last would be 2 rows)."""
    count = -(-total // most)
    if not count:  # an empty range has no parts
        return []
    size, extra = divmod(total, count)
    bounds = [0]
    for i in range(count):
        bounds.append(bounds[-1] + size + (i < extra))
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]


def _grouped_parts(total: int, most: int, unit: int) -> list[slice]:
    """even_parts of ``range(total)`` in whole multiples of ``unit`` (the last part may be short) when a part can
    hold one unit, else plain even_parts."""
    if unit <= 1 or most < unit:
        return even_parts(total, most)
    return [slice(p.start * unit, min(p.stop * unit, total)) for p in even_parts(-(-total // unit), most // unit)]


def attention_blocks(
    b: int, h: int, n: int, m: int, max_elements: int, parallel: int = 1
) -> Iterator[tuple[slice, slice, slice]]:
    """Yield (images, heads, queries) slices tiling a (b, h, n, .) tensor, whose score blocks (g, hh, c, m) hold at
    most ``max_elements`` numbers (at least one query row, so never fewer than m).

    Whole images are grouped when one image's h*n*m scores fit; otherwise heads of one image when one head's n*m
    fit; otherwise query rows of one head; groups as even as even_parts makes them. Each block is one contiguous
    range of the flattened (b h) axis, so its slice of q, k, v and of the output is contiguous memory.

    A block of several (b h) rows is one batched product, which torch splits between its threads by rows: with
    ``parallel`` threads the rows per block are a multiple of ``parallel`` where the budget allows (3 heads on 2
    threads leave one thread idle a third of the time: measured 1.36x-1.39x SDPA at N 577 against 1.11x-1.14x with
    2 heads per block, AMD EPYC, 2 threads).
    """
    per_head = n * m
    if h * per_head <= max_elements:
        most = max(1, max_elements // (h * per_head)) if h * per_head else max(1, b)
        for images in _grouped_parts(b, most, parallel // math.gcd(h, parallel) if h else 1):
            yield images, slice(0, h), slice(0, n)
    elif per_head <= max_elements:
        for b0 in range(b):
            for heads in _grouped_parts(h, max_elements // per_head, parallel):
                yield slice(b0, b0 + 1), heads, slice(0, n)
    else:
        parts = even_parts(n, max(1, max_elements // m))
        for b0 in range(b):
            for h0 in range(h):
                for queries in parts:
                    yield slice(b0, b0 + 1), slice(h0, h0 + 1), queries


def _rows(block: tuple[slice, slice, slice], h: int) -> slice:
    """The block's range on the flattened (b h) axis: images x heads, contiguous by construction."""
    images, heads, _ = block
    return slice(images.start * h + heads.start, (images.stop - 1) * h + heads.stop)


@dataclass(frozen=True)
class BlockPlan:
    """attention_blocks' tiling, in the form that cuts tensors into blocks with one call each.

    Either every block holds all n queries of ``rows[i]`` rows of the (b h) axis (``whole``), or each block is
    ``queries[i]`` query rows of one (b h) row, ``per_row`` blocks to a row. Either way the blocks follow each
    other along the flattened (b h n) axis, so a (b h, n, .) tensor splits into them with one ``split`` instead of
    two Python-level slices per block (about 30 us a block, 10% of the path at N 1025, measured).
    """

    blocks: tuple[tuple[slice, slice, slice], ...]  # (images, heads, queries), as attention_blocks yields them
    rows: tuple[int, ...]  # per block: rows of the flattened (b h) axis
    queries: tuple[int, ...]  # per block: query rows
    whole: bool  # every block holds all the queries of its rows (so each row of dk, dv is written once)
    per_row: int  # blocks per (b h) row when not whole
    images: int  # b and h, to unflatten (b h)
    heads: int

    def query_blocks(self, t: torch.Tensor) -> list[torch.Tensor]:
        """(b h, n, x) -> each block's (g, c, x) view: of ``t`` itself when t is contiguous (outputs written through
        these views must be), else of a copy."""
        if len(self.rows) == 1:  # one block: the tensor itself (a split costs ~10 us, a small input's whole path ~200)
            return [t]
        if self.whole:
            return list(t.split(self.rows, dim=0))
        flat = t.reshape(1, t.shape[0] * t.shape[1], t.shape[2])
        return list(flat.split(self.queries, dim=1))

    def key_blocks(self, t: torch.Tensor) -> list[torch.Tensor]:
        """(b h, m, x) -> each block's (g, m, x) view: every block sees all keys of its rows."""
        if len(self.rows) == 1:
            return [t]
        if self.whole:
            return list(t.split(self.rows, dim=0))
        return [row for row in t.split(1, dim=0) for _ in range(self.per_row)]

    def score_blocks(self, buffer: torch.Tensor, m: int) -> list[torch.Tensor]:
        """One (g, c, m) view of ``buffer`` per block; blocks of the same shape share the view."""
        if len(self.rows) == 1:
            return [buffer.view(self.rows[0], self.queries[0], m)]
        views: dict[tuple[int, int], torch.Tensor] = {}
        for g, c in zip(self.rows, self.queries):
            if (g, c) not in views:
                views[g, c] = buffer[: g * c * m].view(g, c, m)
        return [views[g, c] for g, c in zip(self.rows, self.queries)]


@functools.lru_cache(maxsize=128)
def block_plan(b: int, h: int, n: int, m: int, max_elements: int, parallel: int = 1) -> BlockPlan:
    """The plan of attention_blocks(b, h, n, m, max_elements, parallel), computed once per shape."""
    blocks = tuple(attention_blocks(b, h, n, m, max_elements, parallel))
    rows = tuple(r.stop - r.start for r in (_rows(block, h) for block in blocks))
    queries = tuple(block[2].stop - block[2].start for block in blocks)
    whole = all(c == n for c in queries)
    per_row = 1 if whole or not blocks else len(blocks) // (b * h)
    return BlockPlan(blocks, rows, queries, whole, per_row, b, h)


def plan_for(q: torch.Tensor, m: int, max_elements: int) -> BlockPlan:
    """The blocks chunked_attention cuts (b, h, n, d) queries against m keys into, for torch's thread count now.

    Never more scores at once than q holds numbers or one default block holds, whichever is larger: memory stays
    O(b h n d) plus one cache-sized block, and small inputs still get few blocks (each costs a thread barrier).
    """
    b, h, n, _ = q.shape
    budget = max(1, min(max_elements, max(q.numel(), CHUNK_ELEMENTS)))
    return block_plan(b, h, n, m, budget, torch.get_num_threads())


def _flat(t: torch.Tensor) -> torch.Tensor:
    # (b, h, n, d) -> ((b h), n, d): a view when b and h merge, else one copy. A plain reshape rather than
    # einops.rearrange, which costs ~10 us a call in parsing and caching, more than a small block's products.
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def _softmax_block(q_block, k_t_block, mask_block, scale, scores):
    """A = softmax(q k^T * scale) (Eq. 6) for one block, computed in ``scores`` (a (g, c, m) buffer view)."""
    # scores = einsum(q_block, k_block, "bh i d, bh j d -> bh i j") * scale; beta=0: the buffer's old values unused.
    torch.baddbmm(scores, q_block, k_t_block, beta=0.0, alpha=scale, out=scores)
    if mask_block is not None:
        scores.view(mask_block.shape).masked_fill_(~mask_block, float("-inf"))
    return torch.softmax(scores, dim=-1, out=scores)


def _dropout_mask(attn: torch.Tensor, dropout_p: float, generator) -> torch.Tensor:
    """0 or 1/(1-p) for each entry of the block, drawn from ``generator`` (the backward pass redraws the same)."""
    return torch.empty_like(attn).bernoulli_(1.0 - dropout_p, generator=generator).div_(1.0 - dropout_p)


def _mask_blocks(mask: torch.Tensor | None, plan: BlockPlan) -> list:
    # The (g_images, g_heads, c, m) slice of the broadcast mask for each block; None throughout without a mask.
    return [None] * len(plan.blocks) if mask is None else [mask[block] for block in plan.blocks]


def _scores_buffer(q: torch.Tensor, plan: BlockPlan, m: int) -> torch.Tensor:
    """One flat buffer for the scores of the plan's largest block, reused by every block."""
    return q.new_empty(max((g * c * m for g, c in zip(plan.rows, plan.queries)), default=0))


def _chunked_forward(q_, k_, v_, mask, plan, scale, dropout_p, seed, buffer=None):
    """Eqs. 6-7 block by block on (b h)-flattened q, k, v; returns the ((b h), n, e) output.

    ``buffer``: where the blocks' scores go (default: a new one); after the call its last block holds that
    block's A (times the dropout multipliers, with dropout)."""
    m = k_.shape[1]
    generator = torch.Generator(q_.device).manual_seed(seed) if dropout_p else None
    out = q_.new_empty(*q_.shape[:2], v_.shape[-1])
    blocks = zip(
        plan.query_blocks(q_),
        plan.key_blocks(k_.transpose(1, 2)),
        plan.key_blocks(v_),
        plan.query_blocks(out),
        plan.score_blocks(_scores_buffer(q_, plan, m) if buffer is None else buffer, m),
        _mask_blocks(mask, plan),
        strict=True,
    )
    for q_block, k_t_block, v_block, out_block, scores, mask_block in blocks:
        attn = _softmax_block(q_block, k_t_block, mask_block, scale, scores)
        if dropout_p:
            attn.mul_(_dropout_mask(attn, dropout_p, generator))
        # out block = einsum(attn, v, "bh i j, bh j d -> bh i d"), written in place.
        torch.bmm(attn, v_block, out=out_block)
    return out


class _ChunkedAttention(torch.autograd.Function):
    """Gradients of the chunked path from q, k, v and the output alone, block by block.

    With P = softmax(S) a block of A, M its dropout multipliers (1 without dropout), O = (P*M) v and dO the
    incoming gradient: dv = (P*M)^T dO, dP = (dO v^T) * M, dS = P * (dP - delta) with delta = rowsum(dO * O)
    (= rowsum(P * dP), FlashAttention's D, one number per query), dq = dS k * scale, dk = dS^T q * scale.
    Takes and returns (b, h, n, .) tensors and works on them (b h)-flattened inside, so autograd records one node
    (flattening outside would add a view node per tensor, ~5 us each).

    A itself is kept for backward in one case only: one block, no dropout, and no more keys than the head size
    (m <= d, so A's b h n m numbers are no more than q's b h n d: memory stays O(b h n d)). Then backward skips
    recomputing q k^T and its softmax, a third of its products, which at small N (ViT-B at 32x32 pixels, N 50)
    is the difference between 1.3x and 1.45x SDPA's time.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, plan, scale, dropout_p, seed):
        q_, k_, v_ = _flat(q), _flat(k), _flat(v)
        keep_attention = len(plan.blocks) == 1 and not dropout_p and k_.shape[1] <= q_.shape[2]
        buffer = _scores_buffer(q_, plan, k_.shape[1])
        out = _chunked_forward(q_, k_, v_, mask, plan, scale, dropout_p, seed, buffer)
        ctx.save_for_backward(q_, k_, v_, out, mask, buffer if keep_attention else None)
        ctx.args = (plan, scale, dropout_p, seed)
        return out.view(*q.shape[:3], v.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q_, k_, v_, out, mask, attention = ctx.saved_tensors
        plan, scale, dropout_p, seed = ctx.args
        m = k_.shape[1]
        generator = torch.Generator(q_.device).manual_seed(seed) if dropout_p else None
        grad_out = _flat(grad_out).contiguous()
        delta = (grad_out * out).sum(dim=-1, keepdim=True)
        # When every block holds all its rows' queries, each row of dk and dv is written by one block only.
        new_accumulator = torch.empty_like if plan.whole else torch.zeros_like
        # dq contiguous: its blocks are views of it only then (empty_like would copy q's strides, and a transposed
        # q's query blocks would be written into a copy).
        grad_q, grad_k, grad_v = q_.new_empty(q_.shape), new_accumulator(k_), new_accumulator(v_)
        recompute = attention is None  # A was not kept: each block recomputes it from q and k
        buffer = _scores_buffer(q_, plan, m) if recompute else attention
        grad_buffer = _scores_buffer(q_, plan, m)
        blocks = zip(
            plan.query_blocks(q_),
            plan.key_blocks(k_),
            plan.key_blocks(k_.transpose(1, 2)),
            plan.key_blocks(v_.transpose(1, 2)),
            plan.query_blocks(grad_out),
            plan.query_blocks(delta),
            plan.query_blocks(grad_q),
            plan.key_blocks(grad_k),
            plan.key_blocks(grad_v),
            plan.score_blocks(buffer, m),
            plan.score_blocks(grad_buffer, m),
            _mask_blocks(mask, plan),
            strict=True,
        )
        beta = 0.0 if plan.whole else 1.0  # overwrite dk, dv blocks, or add to them (blocks of query rows)
        for q_b, k_b, k_t, v_t, grad_out_b, delta_b, dq, dk, dv, scores, grad_attn, mask_b in blocks:
            attn = _softmax_block(q_b, k_t, mask_b, scale, scores) if recompute else scores
            keep = _dropout_mask(attn, dropout_p, generator) if dropout_p else None
            kept = attn if keep is None else attn * keep
            # dv (+)= einsum(kept, dO, "bh i j, bh i d -> bh j d")
            torch.baddbmm(dv, kept.transpose(1, 2), grad_out_b, beta=beta, out=dv)
            # dP = einsum(dO, v, "bh i d, bh j d -> bh i j")
            torch.bmm(grad_out_b, v_t, out=grad_attn)
            if keep is not None:
                grad_attn.mul_(keep)
            grad_scores = grad_attn.sub_(delta_b).mul_(attn)  # dS, in place on dP
            # dq = einsum(dS, k, "bh i j, bh j d -> bh i d") * scale, written in place
            torch.baddbmm(dq, grad_scores, k_b, beta=0.0, alpha=scale, out=dq)
            # dk (+)= einsum(dS, q, "bh i j, bh i d -> bh j d") * scale
            torch.baddbmm(dk, grad_scores.transpose(1, 2), q_b, beta=beta, alpha=scale, out=dk)
        shape = plan.images, plan.heads
        return (grad_q.view(*shape, *q_.shape[1:]), grad_k.view(*shape, *k_.shape[1:]),
                grad_v.view(*shape, *v_.shape[1:]), None, None, None, None, None)  # fmt: skip


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

    ``max_elements`` defaults to CHUNK_ELEMENTS (four L2 caches of scores per thread). A block never holds more
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
    seed = int(torch.randint(2**62, ())) if dropout_p else 0
    plan = plan_for(q, m, max_elements)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _ChunkedAttention.apply(q, k, v, mask, plan, scale, dropout_p, seed)
    out = _chunked_forward(_flat(q), _flat(k), _flat(v), mask, plan, scale, dropout_p, seed)
    return out.view(b, h, n, v.shape[-1])
