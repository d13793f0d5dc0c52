"""Where the chunked attention path cuts its work: the block size for this CPU and the blocks of one call.

chunked.py computes Eq. 6-7 a block of queries at a time; this module decides the blocks. The default block holds
as many scores per thread as the core's L2 cache has bytes (read from sysfs), four L2s of float32 scores per
thread. Blocks group whole images, else heads of one image, else query rows of one head; groups of (b h) rows are
a multiple of torch's thread count where the budget allows, since torch splits a batched product between its
threads by rows. A BlockPlan turns the tiling into one ``split`` per tensor. task_plan cuts the blocks that
chunk_pool.py's workers take one at a time instead, each computed on one thread. Axes: b batch, h heads, n queries,
m keys; (b h) is the batch and head axes flattened into one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

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
    for the two GEMMs); per score it pays the GEMMs and a softmax pass that re-reads the block, which the large
    shared L3 serves. Smaller blocks lose to the fixed cost, larger ones gain nothing: four L2s of scores per thread
    was the fastest default across the benchmark grid (see docs/performance.md).
    """
    threads = torch.get_num_threads() if threads is None else threads
    return min(2**22, max(2**12, l2_cache_bytes() * max(1, threads)))


@functools.cache
def chunk_elements() -> int:
    """The default block: :func:`default_chunk_elements` for torch's thread count at the first call, planned then
    (when a layer first selects the chunked kernel, see :func:`plan_blocks`, or at the first chunked_attention call;
    never at import) and kept, since reading sysfs again would change nothing.
    Attend(chunk_elements=...) and chunked_attention(max_elements=...) override it."""
    return default_chunk_elements()


def plan_blocks() -> None:
    """Plan the default block and task sizes now (the "chunked" kernel's preparation, run when a layer selects it),
    so that no forward pass reads sysfs."""
    chunk_elements()
    task_elements()


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
    threads would leave one thread idle a third of the time; docs/performance.md has the measurement).
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
    two Python-level slices per block, which cost more than a small block's products.
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
        if len(self.rows) == 1:  # one block: the tensor itself (a split would cost more than a small input's path)
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

    def scores_buffer(self, like: torch.Tensor, m: int) -> torch.Tensor:
        """One flat buffer (``like``'s dtype and device) for the scores of the largest block, reused by every block."""
        return like.new_empty(max((g * c * m for g, c in zip(self.rows, self.queries)), default=0))

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
    budget = max(1, min(max_elements, max(q.numel(), chunk_elements())))
    return block_plan(b, h, n, m, budget, torch.get_num_threads())


# The threaded schedule (chunk_pool.py): a call's work in about this many tasks, so that the task a preempted
# worker holds back is a small share of the call while the Python per task (~30 us) stays a small share of a task.
TASKS_PER_CALL = 16
# The smallest task split off: about 0.6 ms of single-threaded products and softmax (~5 ns a score).
MIN_TASK_SCORES = 2**17
@functools.cache
def task_elements() -> int:
    """The largest task: one L2 cache of float32 scores, so that the softmax pass of a block computed on one core
    reads it from that core's cache (planned on first use, like :func:`chunk_elements`)."""
    return max(2**12, l2_cache_bytes() // 4)


def task_plan(q: torch.Tensor, m: int, max_elements: int) -> BlockPlan | None:
    """The blocks chunk_pool.py's workers take one at a time for (b, h, n, d) queries against m keys, or None when
    the call is no more than one task's work.

    About TASKS_PER_CALL blocks of at least MIN_TASK_SCORES scores, none above ``max_elements`` or :func:`task_elements`
    (so the blocks alive at once, one per worker, hold no more scores than a quarter of the default block of that
    many threads). The blocks do not depend on torch's thread count: each is computed by single-threaded ops, so the
    output is the same to the bit whatever the count.
    """
    b, h, n, _ = q.shape
    share = max(MIN_TASK_SCORES, -(-b * h * n * m // TASKS_PER_CALL))
    plan = block_plan(b, h, n, m, max(1, min(max_elements, task_elements(), share)))
    return plan if len(plan.blocks) > 1 else None
