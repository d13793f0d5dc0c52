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
and copy the result out. Where the blocks fall (their size for this CPU, the grouping of images, heads and query
rows) is chunk_plan.py's concern; every tensor is cut into them with one ``split`` (BlockPlan), not sliced in the
loop, because Python-level slices per block per tensor would cost more than the softmax saves by staying in cache.

How the blocks are scheduled: on CPU, without dropout, a call of more than one task's work hands its blocks as
tasks to a few worker threads that each run a whole block with single-threaded ops and take the next block when
done (chunk_pool.py says why: a thread preempted by another process then holds back one block, not every op of the
call). Otherwise (one task's work; dropout, which draws each block's multipliers from one generator in block order;
another device; a tensor subclass; torch.compile's or the JIT's tracing, the profiler or a dispatch mode, which see
only the ops of their own thread) the blocks run one after another here, each op split between torch's threads.
The backward pass of a call whose forward handed its blocks to the workers hands them the same way (each task
recomputes its block's A and computes its gradients); blocks of query rows that add into one row's dk and dv form
one task, so no two workers write the same rows (a call of one image and one head is then one task: its blocks run
in turn here instead).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..base.checks import check_attention_mask
from .chunk_plan import BlockPlan, chunk_elements, plan_for, task_plan
from .chunk_pool import run_tasks


def _flat(t: torch.Tensor) -> torch.Tensor:
    # (b, h, n, d) -> ((b h), n, d): a view when b and h merge, else one copy. A plain reshape rather than
    # einops.rearrange, whose pattern parsing and caching per call cost more than a small block's products.
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
        plan.score_blocks(plan.scores_buffer(q_, m) if buffer is None else buffer, m),
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


def _watched() -> bool:
    """Whether something watches or rewrites the ops of this thread, which ops run on other threads would escape:
    torch.compile's or the JIT's tracing, the profiler, a dispatch or function mode (FlopCounterMode, FakeTensorMode)
    (all of them per-thread in torch)."""
    return (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or torch.autograd._profiler_enabled()
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._is_torch_function_mode_enabled()
    )


def _tasks(q: torch.Tensor, m: int, max_elements: int, dropout_p: float) -> BlockPlan | None:
    """The blocks to hand to chunk_pool.py's workers (task_plan), or None where the blocks run in turn here: with
    dropout, off the CPU, for a tensor subclass, or while something watches this thread's ops (module docstring)."""
    if dropout_p or q.device.type != "cpu" or type(q) is not torch.Tensor or _watched():
        return None
    return task_plan(q, m, max_elements)


def _each_task(task: Callable[[int], None], count: int) -> None:
    """``task(i)`` for each i in range(count): on chunk_pool.py's workers at torch's thread count, in turn on the
    calling thread when torch has one thread (the same tasks and ops either way, so the same bits)."""
    threads = torch.get_num_threads()
    if threads == 1:
        for i in range(count):
            task(i)
    else:
        run_tasks(task, count, threads)


def _thread_buffers(make: Callable[[], Any]) -> Callable[[], Any]:
    """A function giving each worker thread its own ``make()``, made on its first call there and reused by every
    block the thread takes after it."""
    buffers: dict[int, Any] = {}

    def mine() -> Any:
        buffer = buffers.get(threading.get_ident())
        if buffer is None:
            buffer = buffers[threading.get_ident()] = make()
        return buffer

    return mine


def _tasked_forward(q_, k_, v_, mask, tasks: BlockPlan, scale):
    """Eqs. 6-7 on (b h)-flattened q, k, v, each block of ``tasks`` computed whole by one of chunk_pool.py's workers
    with single-threaded ops (by the calling thread when torch has one thread: the same blocks and ops, so the same
    bits whatever the thread count); returns the ((b h), n, e) output."""
    m = k_.shape[1]
    out = q_.new_empty(*q_.shape[:2], v_.shape[-1])
    blocks = list(
        zip(
            tasks.query_blocks(q_),
            tasks.key_blocks(k_.transpose(1, 2)),
            tasks.key_blocks(v_),
            tasks.query_blocks(out),
            _mask_blocks(mask, tasks),
            strict=True,
        )
    )
    buffer = _thread_buffers(lambda: tasks.scores_buffer(q_, m))  # one scores buffer per worker thread

    def task(i: int) -> None:
        q_block, k_t_block, v_block, out_block, mask_block = blocks[i]
        g, c = q_block.shape[:2]
        attn = _softmax_block(q_block, k_t_block, mask_block, scale, buffer()[: g * c * m].view(g, c, m))
        torch.bmm(attn, v_block, out=out_block)  # einsum(attn, v, "bh i j, bh j d -> bh i d"), in place

    _each_task(task, len(blocks))
    return out


def _block_grads(attn, keep, q_b, k_b, v_t, grad_out_b, delta_b, grads, grad_attn, scale, beta):
    """One block's share of dq (written), dk and dv (written with ``beta`` 0, added to with 1) from its A
    (``attn``), its dropout multipliers (``keep``, None without dropout) and its rows of dO and delta
    (_ChunkedAttention's docstring has the formulas); ``grad_attn``, a buffer of the block's shape, takes dP."""
    dq, dk, dv = grads
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


def _grad_blocks(plan: BlockPlan, q_, k_, v_, grad_out, grads, mask) -> zip:
    """Per block of ``plan``, the views its backward reads and writes: q, k, k^T, v^T, dO, dq, dk, dv (``grads``)
    and the mask (None without one)."""
    grad_q, grad_k, grad_v = grads
    return zip(
        plan.query_blocks(q_), plan.key_blocks(k_), plan.key_blocks(k_.transpose(1, 2)),
        plan.key_blocks(v_.transpose(1, 2)), plan.query_blocks(grad_out), plan.query_blocks(grad_q),
        plan.key_blocks(grad_k), plan.key_blocks(grad_v), _mask_blocks(mask, plan), strict=True,
    )  # fmt: skip


def _tasked_backward(q_, k_, v_, out, grad_out, mask, tasks: BlockPlan, scale):
    """dq, dk, dv of (b h)-flattened q, k, v from the output and its gradient ``grad_out`` (contiguous), each task
    run whole by one of chunk_pool.py's workers with single-threaded ops (by the calling thread when torch has one
    thread): a task is one block of ``tasks``, or, when the blocks are query rows of one (b h) row, all of that
    row's blocks in turn, since each adds into the row's dk and dv. Each block recomputes its A and its rows of
    delta. The same blocks and ops whatever the thread count, so the same bits."""
    m = k_.shape[1]
    # dq contiguous: its blocks are views of it only then (empty_like would copy a transposed q's strides).
    grad_q, grad_k, grad_v = q_.new_empty(q_.shape), torch.empty_like(k_), torch.empty_like(v_)
    blocks = list(zip(_grad_blocks(tasks, q_, k_, v_, grad_out, (grad_q, grad_k, grad_v), mask),
                      tasks.query_blocks(out), strict=True))  # fmt: skip
    per_task = 1 if tasks.whole else tasks.per_row
    buffers = _thread_buffers(lambda: (tasks.scores_buffer(q_, m), tasks.scores_buffer(q_, m)))  # scores, dP

    def task(i: int) -> None:
        buffer = buffers()
        for j in range(i * per_task, (i + 1) * per_task):
            (q_b, k_b, k_t, v_t, grad_out_b, dq, dk, dv, mask_b), out_b = blocks[j]
            g, c = q_b.shape[:2]
            scores, grad_attn = (b[: g * c * m].view(g, c, m) for b in buffer)
            attn = _softmax_block(q_b, k_t, mask_b, scale, scores)
            delta_b = (grad_out_b * out_b).sum(dim=-1, keepdim=True)
            beta = 0.0 if j == i * per_task else 1.0  # a row's first block writes its dk and dv, the rest add
            _block_grads(attn, None, q_b, k_b, v_t, grad_out_b, delta_b, (dq, dk, dv), grad_attn, scale, beta)

    _each_task(task, len(blocks) // per_task)
    return grad_q, grad_k, grad_v


class _ChunkedAttention(torch.autograd.Function):
    """Gradients of the chunked path from q, k, v and the output alone, block by block.

    With P = softmax(S) a block of A, M its dropout multipliers (1 without dropout), O = (P*M) v and dO the
    incoming gradient: dv = (P*M)^T dO, dP = (dO v^T) * M, dS = P * (dP - delta) with delta = rowsum(dO * O)
    (= rowsum(P * dP), FlashAttention's D, one number per query), dq = dS k * scale, dk = dS^T q * scale.
    Takes and returns (b, h, n, .) tensors and works on them (b h)-flattened inside, so autograd records one node
    (flattening outside would add a view node per tensor).

    A itself is kept for backward in one case only: one block, no dropout, and no more keys than the head size
    (m <= d, so A's b h n m numbers are no more than q's b h n d: memory stays O(b h n d)). Then backward skips
    recomputing q k^T and its softmax, a third of its products, a saving that matters most at small N (see
    docs/performance.md).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, plan, tasks, scale, dropout_p, seed):
        q_, k_, v_ = _flat(q), _flat(k), _flat(v)
        keep_attention = len(plan.blocks) == 1 and not dropout_p and k_.shape[1] <= q_.shape[2]
        if tasks is not None and not keep_attention:
            out, buffer = _tasked_forward(q_, k_, v_, mask, tasks, scale), None
        else:
            buffer = plan.scores_buffer(q_, k_.shape[1])
            out = _chunked_forward(q_, k_, v_, mask, plan, scale, dropout_p, seed, buffer)
        ctx.save_for_backward(q_, k_, v_, out, mask, buffer if keep_attention else None)
        # The backward hands its blocks to the workers as the forward did; not with one task (a whole plan of one
        # (b h) row's query blocks), which would run on one worker while the other cores wait.
        by_pool = tasks is not None and not keep_attention and (tasks.whole or len(tasks.rows) > tasks.per_row)
        ctx.args = (plan, tasks if by_pool else None, scale, dropout_p, seed)
        return out.view(*q.shape[:3], v.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q_, k_, v_, out, mask, attention = ctx.saved_tensors
        plan, tasks, scale, dropout_p, seed = ctx.args
        shape = plan.images, plan.heads
        if tasks is not None and type(grad_out) is torch.Tensor and not _watched():
            grads = _tasked_backward(q_, k_, v_, out, _flat(grad_out).contiguous(), mask, tasks, scale)
            return (*(g.view(*shape, *g.shape[1:]) for g in grads), None, None, None, None, None, None)
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
        buffer = plan.scores_buffer(q_, m) if recompute else attention
        grad_buffer = plan.scores_buffer(q_, m)
        blocks = zip(
            _grad_blocks(plan, q_, k_, v_, grad_out, (grad_q, grad_k, grad_v), mask),
            plan.query_blocks(delta),
            plan.score_blocks(buffer, m),
            plan.score_blocks(grad_buffer, m),
            strict=True,
        )
        beta = 0.0 if plan.whole else 1.0  # overwrite dk, dv blocks, or add to them (blocks of query rows)
        for (q_b, k_b, k_t, v_t, grad_out_b, dq, dk, dv, mask_b), delta_b, scores, grad_attn in blocks:
            attn = _softmax_block(q_b, k_t, mask_b, scale, scores) if recompute else scores
            keep = _dropout_mask(attn, dropout_p, generator) if dropout_p else None
            _block_grads(attn, keep, q_b, k_b, v_t, grad_out_b, delta_b, (dq, dk, dv), grad_attn, scale, beta)
        return (grad_q.view(*shape, *q_.shape[1:]), grad_k.view(*shape, *k_.shape[1:]),
                grad_v.view(*shape, *v_.shape[1:]), None, None, None, None, None, None)  # fmt: skip


def chunked_kernel(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """The "chunked" entry of :data:`~vit_einops.network.kernels.KERNELS`: :func:`chunked_attention` with the
    calling Attend's scale, attention dropout and block size."""
    return chunked_attention(
        q, k, v, mask, scale=attend.scale, dropout_p=attend.dropout_p, max_elements=attend.chunk_elements
    )


def chunked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float,
    dropout_p: float = 0.0,
    max_elements: int | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v (Eqs. 6-7) computed over blocks of at most ``max_elements`` scores.

    ``max_elements`` None is :func:`~vit_einops.network.chunk_plan.chunk_elements` (four L2 caches of scores per
    thread). A block never holds more scores than q holds numbers or that default, whichever is larger, so the
    scores alive at once (a block and, in backward, its gradient) stay within twice the output or two cache-sized blocks: peak memory O(b h n d) plus a
    constant, whatever n is. The forward handed to worker threads (module docstring) holds one block per thread, each
    within ``max_elements`` and one L2 cache of float32 scores, and its output is the same to the bit whatever
    torch's thread count. Equal to the full-matrix einsum up to float rounding, in values and gradients; dropout
    on A, when ``dropout_p`` > 0, is drawn per block from a generator seeded off torch's global one (so
    ``torch.manual_seed`` makes it reproducible) and redrawn identically in the backward pass. With no queries (or
    no images, or no heads) the output is empty; with no keys it is zeros, as on the einsum and SDPA paths.

    Shapes: q (b, h, n, d), k (b, h, m, d), v (b, h, m, e); mask None or bool broadcastable to (b, h, n, m),
    True = may attend (a TypeError for another dtype, a ValueError for another shape); output (b, h, n, e).
    """
    b, h, n, _ = q.shape
    m = k.shape[2]
    if mask is not None:
        # A view: blocks of it are sliced like the queries.
        mask = check_attention_mask(mask, (b, h, n, m), "(b, h, n, m)").expand(b, h, n, m)
    seed = int(torch.randint(2**62, ())) if dropout_p else 0
    max_elements = chunk_elements() if max_elements is None else max_elements
    plan = plan_for(q, m, max_elements)
    tasks = _tasks(q, m, max_elements, dropout_p)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _ChunkedAttention.apply(q, k, v, mask, plan, tasks, scale, dropout_p, seed)
    q_, k_, v_ = _flat(q), _flat(k), _flat(v)
    if tasks is not None:
        out = _tasked_forward(q_, k_, v_, mask, tasks, scale)
    else:
        out = _chunked_forward(q_, k_, v_, mask, plan, scale, dropout_p, seed)
    return out.view(b, h, n, v.shape[-1])
