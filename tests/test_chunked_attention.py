"""The "chunked" attention impl: what is specific to computing Eq. 6-7 block by block.

The generic equivalence (MultiHeadAttention against nn.MultiheadAttention, every impl against the others) runs for
"chunked" in test_attention.py through ATTN_IMPLS. Here: block boundaries (N not a multiple of the block, a block
larger than N, one query row per block, uneven groups of images and heads, at several thread counts, and random
shapes and budgets), masks whose pattern crosses blocks, gradients from the recomputing backward, dropout redrawn
identically in backward, that A is never stored for backward, the planner's promises (every query once, no more
scores at once than q's size or one default block), and the threaded forward and backward (the blocks as tasks for
worker threads): the same bits whatever the thread count, callers on several threads at once, and a forked child.

Reference: torch's own F.scaled_dot_product_attention, and our full-matrix "einsum" path. Tolerances are those of
tests/_equiv.py: float64 at rtol 1e-9 / atol 1e-10 (the paths differ only in summation order), float32 at rtol
1e-4 and atol 1e-5 times the largest |expected|.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from _equiv import F32_TOL, F64_TOL, assert_close
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from vit_einops.network.attention import Attend
from vit_einops.network.chunk_plan import (
    FALLBACK_L2_BYTES,
    attention_blocks,
    chunk_elements,
    default_chunk_elements,
    even_parts,
    l2_cache_bytes,
    plan_for,
    task_elements,
    task_plan,
)
from vit_einops.network import chunked
from vit_einops.network.chunk_pool import run_tasks, workers
from vit_einops.network.chunked import chunked_attention


def qkv(b, h, n, d, dtype=torch.float64, m=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    shapes = ((b, h, n, d), (b, h, m, d), (b, h, m, d))
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_(True) for s in shapes]


def value_and_grads(fn, q, k, v, upstream):
    out = fn(q, k, v)
    return out.detach(), torch.autograd.grad((out * upstream).sum(), (q, k, v))


def assert_matches(actual, expected, tol, what):
    (out, grads), (ref_out, ref_grads) = actual, expected
    assert_close(out, ref_out, tol, f"{what}: output")
    for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
        assert_close(g, rg, tol, f"{what}: grad {name}")


# (b, h, n, d, max_elements): each case puts a block boundary somewhere else (images, heads, query rows), and the
# values must not see it. Budgets below the default block (at least 2**12) are used as given on every machine.
BIG = 2**30
BOUNDARY_CASES = {
    "n not a multiple of the block (17 rows in blocks of at most 5)": (2, 3, 17, 8, 17 * 5),
    "block larger than n (one block for everything)": (2, 3, 17, 40, BIG),
    "a block of one head's scores": (2, 3, 17, 8, 17 * 17),
    "budget below one row: one query row per block": (2, 3, 17, 8, 1),
    "uneven groups of images (3 images, room for 2 per block)": (3, 2, 9, 8, 2 * 2 * 9 * 9),
    "uneven groups of heads (3 heads, room for 2 per block)": (2, 3, 9, 8, 2 * 9 * 9),
}


def extent(s: slice) -> int:
    return s.stop - s.start


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("threads", [1, 2, 3], ids=lambda t: f"{t} threads")
@pytest.mark.parametrize("case", list(BOUNDARY_CASES))
def test_block_boundaries_match_sdpa_and_einsum_float64(case, threads, restore_threads):
    """The plan depends on torch's thread count (head groups a multiple of it); every plan gives the same values."""
    torch.set_num_threads(threads)
    b, h, n, d, budget = BOUNDARY_CASES[case]
    q, k, v = qkv(b, h, n, d)
    upstream = torch.randn_like(q)
    scale = d**-0.5
    chunked = value_and_grads(lambda *t: chunked_attention(*t, scale=scale, max_elements=budget), q, k, v, upstream)
    assert_matches(chunked, value_and_grads(F.scaled_dot_product_attention, q, k, v, upstream), F64_TOL, "vs sdpa")
    einsum_path = Attend(d, impl="einsum").double()
    assert_matches(chunked, value_and_grads(einsum_path, q, k, v, upstream), F64_TOL, "vs einsum")


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    d=st.integers(1, 4),
    budget=st.integers(1, 600),
    threads=st.integers(1, 4),
)
def test_every_plan_matches_sdpa_float64(b, h, n, m, d, budget, threads):
    """Random shapes, block budgets from one score up and thread counts 1 to 4: whichever blocks the planner
    chooses, values and gradients are SDPA's."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v = qkv(b, h, n, d, m=m, seed=b * 1000 + n * 10 + m)
        upstream = torch.randn_like(q)
        chunked = value_and_grads(
            lambda *t: chunked_attention(*t, scale=d**-0.5, max_elements=budget), q, k, v, upstream
        )
        reference = value_and_grads(F.scaled_dot_product_attention, q, k, v, upstream)
        assert_matches(chunked, reference, F64_TOL, f"b {b} h {h} n {n} m {m} budget {budget} threads {threads}")
    finally:
        torch.set_num_threads(before)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 5),
    h=st.integers(1, 4),
    n=st.integers(1, 40),
    m=st.integers(1, 40),
    budget=st.integers(1, 3000),
    parallel=st.integers(1, 4),
)
def test_blocks_tile_every_image_head_and_query_exactly_once(b, h, n, m, budget, parallel):
    """The plan covers every (image, head, query) exactly once, within the budget; the path's correctness and its
    memory bound rest on this, whatever the thread count."""
    covered = torch.zeros(b, h, n, dtype=torch.int64)
    for images, heads, queries in attention_blocks(b, h, n, m, budget, parallel):
        g, hh, c = extent(images), extent(heads), extent(queries)
        # Within budget, or the smallest block there is (one image, one head, one query row).
        assert g * hh * c * m <= budget or (g, hh, c) == (1, 1, 1)
        covered[images, heads, queries] += 1
    assert torch.equal(covered, torch.ones(b, h, n, dtype=torch.int64))


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 8),
    h=st.integers(1, 12),
    n=st.integers(1, 1100),
    d=st.integers(1, 128),
    budget=st.sampled_from([2**14, 2**20, BIG]),
)
def test_scores_at_once_stay_within_q_or_one_default_block(b, h, n, d, budget):
    """The memory promise of chunked_attention: no block holds more scores than q holds numbers or the default block,
    whichever is larger (or one query row, the smallest block). Planned on the meta device: shapes only."""
    q = torch.empty(b, h, n, d, device="meta")
    plan = plan_for(q, n, budget)
    cap = max(1, min(budget, max(q.numel(), chunk_elements())))
    assert all(g * c * n <= cap or c == 1 for g, c in zip(plan.rows, plan.queries, strict=True))
    assert sum(g * c for g, c in zip(plan.rows, plan.queries, strict=True)) == b * h * n  # every query once


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 4),
    h=st.integers(1, 6),
    n=st.integers(1, 700),
    m=st.integers(1, 700),
    budget=st.sampled_from([2**12, 2**16, BIG]),
)
def test_task_blocks_cover_every_query_once_within_one_l2(b, h, n, m, budget):
    """The threaded forward's memory promise: each task's block (one alive per worker) holds no more scores than
    ``max_elements`` or one L2 of float32 scores (or is one query row), and the tasks cover every query once."""
    tasks = task_plan(torch.empty(b, h, n, 8, device="meta"), m, budget)
    if tasks is not None:
        cap = max(1, min(budget, task_elements()))
        assert all(g * c * m <= cap or c == 1 for g, c in zip(tasks.rows, tasks.queries, strict=True))
        assert sum(g * c for g, c in zip(tasks.rows, tasks.queries, strict=True)) == b * h * n


@given(total=st.integers(0, 300), most=st.integers(1, 60))
def test_even_parts_are_the_fewest_parts_within_one_of_each_other(total, most):
    """Why even parts: a short last block would cost a whole block's fixed cost for a sliver of work."""
    parts = even_parts(total, most)
    sizes = [p.stop - p.start for p in parts]
    assert [p.start for p in parts] == [sum(sizes[:i]) for i in range(len(parts))] and sum(sizes) == total
    assert len(parts) == -(-total // most)  # the fewest parts of at most ``most``
    assert all(0 < s <= most for s in sizes) and (not sizes or max(sizes) - min(sizes) <= 1)


@pytest.mark.parametrize(
    "q_shape, kv_shape",
    [
        ((2, 3, 0, 4), (2, 3, 0, 4)),
        ((2, 3, 5, 4), (2, 3, 0, 4)),
        ((0, 3, 5, 4), (0, 3, 5, 4)),
        ((2, 0, 5, 4), (2, 0, 5, 4)),
    ],
    ids=["no tokens", "no keys", "no images", "no heads"],
)
def test_empty_inputs_behave_like_einsum_and_sdpa(q_shape, kv_shape):
    """0 tokens used to divide by zero; now the output and gradients are those of the other paths (empty, or
    zeros when there are queries but no keys)."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(q_shape, generator=g, dtype=torch.float64).requires_grad_(True)
    k, v = (torch.randn(kv_shape, generator=g, dtype=torch.float64).requires_grad_(True) for _ in range(2))
    upstream = torch.randn(q_shape, generator=g, dtype=torch.float64)
    chunked = value_and_grads(lambda *t: chunked_attention(*t, scale=0.5), q, k, v, upstream)
    with torch.no_grad():  # the path without autograd's Function
        no_grad_out = chunked_attention(q, k, v, scale=0.5)
    for name, fn in (("sdpa", F.scaled_dot_product_attention), ("einsum", Attend(4, impl="einsum").double())):
        reference = value_and_grads(fn, q, k, v, upstream)
        assert chunked[0].shape == no_grad_out.shape == reference[0].shape == q_shape
        assert_matches(chunked, reference, F64_TOL, name)
        assert_close(no_grad_out, reference[0], F64_TOL, f"{name}: no_grad output")


@pytest.mark.parametrize(
    "files, expected",
    [
        (
            {"index0": ("1", "Data", "32K"), "index1": ("1", "Instruction", "32K"), "index2": ("2", "Unified", "512K")},
            512 * 1024,
        ),
        ({"index2": ("2", "Instruction", "64K"), "index3": ("2", "Unified", "2M")}, 2 * 2**20),
        ({"index0": ("1", "Data", "48K")}, FALLBACK_L2_BYTES),
        ({"index2": ("2", "Unified", "lots")}, FALLBACK_L2_BYTES),
        ({}, FALLBACK_L2_BYTES),
    ],
    ids=["AMD EPYC layout", "instruction L2 skipped, size in M", "no L2", "unreadable size", "no sysfs"],
)
def test_l2_cache_size_is_read_from_sysfs_or_falls_back(tmp_path, files, expected):
    """The one input the planner reads from outside the process: every layout the kernel may show (or none, or
    one we cannot parse) gives a size, never an error at import."""
    for index, (level, kind, size) in files.items():
        (tmp_path / index).mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / index / name).write_text(text + "\n")
    assert l2_cache_bytes(tmp_path) == expected


MASKS = {
    # A causal pattern: row i sees keys 0..i, so each block of rows sees a different prefix of the keys.
    "causal (n, n)": lambda b, h, n, g: torch.ones(n, n, dtype=torch.bool).tril(),
    # A band that starts inside one block of rows and ends in the next.
    "band (b, 1, n, n)": lambda b, h, n, g: (torch.arange(n)[:, None] - torch.arange(n)).abs().le(3).expand(b, 1, n, n),
    "random per head (1, h, n, n)": lambda b, h, n, g: (
        (torch.rand(1, h, n, n, generator=g) < 0.3) | torch.eye(n, dtype=torch.bool)
    ),
    "random (b, h, n, n)": lambda b, h, n, g: (
        (torch.rand(b, h, n, n, generator=g) < 0.3) | torch.eye(n, dtype=torch.bool)
    ),
}


@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_masks_crossing_blocks_match_sdpa_float64(mask_kind):
    b, h, n, d = 2, 3, 23, 4
    mask = MASKS[mask_kind](b, h, n, torch.Generator().manual_seed(1))
    q, k, v = qkv(b, h, n, d, seed=2)
    upstream = torch.randn_like(q)
    budget = n * 4  # blocks of 4 query rows of one head: 23 = 5 * 4 + 3, so the last block is short
    chunked = value_and_grads(
        lambda *t: chunked_attention(*t, mask, scale=d**-0.5, max_elements=budget), q, k, v, upstream
    )
    reference = value_and_grads(lambda *t: F.scaled_dot_product_attention(*t, attn_mask=mask), q, k, v, upstream)
    assert_matches(chunked, reference, F64_TOL, mask_kind)


@pytest.mark.parametrize(
    "mask, error, message",
    [
        (torch.ones(5, 4), TypeError, "mask must be a bool tensor (True = may attend), got torch.float32"),
        ([[True] * 4] * 5, TypeError, "mask must be a bool tensor (True = may attend), got list"),
        (
            torch.ones(4, 4, dtype=torch.bool),
            ValueError,
            "mask of shape (4, 4) does not broadcast to (b, h, n, m) = (1, 2, 5, 4)",
        ),
        (
            torch.ones(1, 1, 1, 5, 4, dtype=torch.bool),
            ValueError,
            "mask of shape (1, 1, 1, 5, 4) does not broadcast to (b, h, n, m) = (1, 2, 5, 4)",
        ),
    ],
    ids=["float", "list", "wrong shape", "five axes"],
)
def test_a_mask_not_bool_or_not_broadcasting_to_the_scores_is_refused(mask, error, message):
    """The einsum and SDPA paths' contract, which MultiHeadAttention checks: a float mask once failed deep inside
    with "~ (operator.invert) is only implemented on integer and Boolean-type tensors", another shape with
    expand's RuntimeError."""
    q, k, v = qkv(1, 2, 5, 3, m=4)
    with pytest.raises(error) as caught:
        chunked_attention(q, k, v, mask, scale=0.5)
    assert str(caught.value) == message


@pytest.mark.parametrize("budget", [17 * 5, 2**30], ids=["blocks of query rows", "one block"])
def test_transposed_inputs_match_sdpa_float64(budget):
    """q, k, v stored (b, h, d, n) and transposed: (b h) merges but (b h n) does not, so the path must not write
    its gradient blocks through views of q's layout (dq once came back unwritten there)."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (
        torch.randn(2, 3, 8, 17, generator=g, dtype=torch.float64).transpose(-1, -2).requires_grad_(True)
        for _ in range(3)
    )
    upstream = torch.randn(2, 3, 17, 8, generator=g, dtype=torch.float64)
    chunked = value_and_grads(lambda *t: chunked_attention(*t, scale=8**-0.5, max_elements=budget), q, k, v, upstream)
    assert_matches(chunked, value_and_grads(F.scaled_dot_product_attention, q, k, v, upstream), F64_TOL, "transposed")


def test_cross_attention_queries_and_keys_of_different_lengths_float64():
    """n queries and m keys: blocks cut the queries only, every block sees all m keys."""
    q, k, v = qkv(2, 2, 11, 4, m=6, seed=3)
    upstream = torch.randn_like(q)
    chunked = value_and_grads(lambda *t: chunked_attention(*t, scale=0.5, max_elements=6 * 3), q, k, v, upstream)
    assert_matches(chunked, value_and_grads(F.scaled_dot_product_attention, q, k, v, upstream), F64_TOL, "n != m")


@pytest.mark.parametrize("masked", [False, True])
def test_vit_b_shape_float32_many_blocks_match_sdpa(masked):
    """ViT-B's attention at 197 tokens in float32 (one image: its 12 heads are already 48 blocks), cut into blocks
    of 50 query rows of one head."""
    b, h, n, d = 1, 12, 197, 64
    q, k, v = qkv(b, h, n, d, dtype=torch.float32, seed=4)
    mask = MASKS["random (b, h, n, n)"](b, h, n, torch.Generator().manual_seed(5)) if masked else None
    upstream = torch.randn_like(q)
    chunked = value_and_grads(
        lambda *t: chunked_attention(*t, mask, scale=d**-0.5, max_elements=n * 50), q, k, v, upstream
    )
    reference = value_and_grads(lambda *t: F.scaled_dot_product_attention(*t, attn_mask=mask), q, k, v, upstream)
    assert_matches(chunked, reference, F32_TOL, "float32")


def test_gradcheck_without_and_with_dropout():
    """torch's numerical gradient check of the hand-written backward; dropout is redrawn from the same seed."""
    q, k, v = qkv(1, 2, 5, 2, seed=6)

    def attention(dropout_p):
        def fn(q, k, v):
            torch.manual_seed(7)  # the dropout seed is drawn from the global generator on each call
            # Blocks of 2 query rows: 5 = 2 + 2 + 1.
            return chunked_attention(q, k, v, scale=2**-0.5, dropout_p=dropout_p, max_elements=5 * 2)

        return fn

    assert torch.autograd.gradcheck(attention(0.0), (q, k, v), fast_mode=True)
    assert torch.autograd.gradcheck(attention(0.4), (q, k, v), fast_mode=True)


def test_dropout_zeroes_or_rescales_each_probability():
    """With v the identity, the output *is* the dropped matrix: each entry 0 or A / (1 - p), zeros at about rate p."""
    b, h, n, p = 2, 3, 40, 0.25
    q, k, _ = (t.detach() for t in qkv(b, h, n, 8, seed=8))
    v = torch.eye(n, dtype=torch.float64).expand(b, h, n, n)
    attn = chunked_attention(q, k, v, scale=8**-0.5)
    torch.manual_seed(9)
    dropped = chunked_attention(q, k, v, scale=8**-0.5, dropout_p=p, max_elements=n * 7)
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], attn[kept] / (1 - p), **F64_TOL)
    # 9600 draws: the zero fraction's standard deviation is 0.0044, so +-0.03 is a 6-sigma band.
    assert abs((~kept).double().mean().item() - p) < 0.03
    torch.manual_seed(9)
    assert torch.equal(chunked_attention(q, k, v, scale=8**-0.5, dropout_p=p, max_elements=n * 7), dropped)


def test_attend_uses_dropout_in_training_only():
    attend = Attend(8, dropout=0.5, impl="chunked").double()
    q, k, v = (t.detach() for t in qkv(1, 2, 16, 8, seed=10))
    reference = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(attend.eval()(q, k, v), reference, **F64_TOL)
    assert not torch.allclose(attend.train()(q, k, v), reference)


def saved_numel(fn, *inputs) -> int:
    """Numbers autograd keeps for the backward pass of fn(*inputs) (each saved tensor counted once)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[id(t)] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def test_backward_never_stores_the_attention_matrix():
    """chunked keeps q, k, v and the output (4 b h n d numbers); the einsum path keeps A itself (b h n n)."""
    b, h, n, d = 2, 3, 64, 4
    q, k, v = qkv(b, h, n, d, dtype=torch.float32)
    chunked = saved_numel(Attend(d, impl="chunked"), q, k, v)
    full = saved_numel(Attend(d, impl="einsum"), q, k, v)
    assert chunked == 4 * b * h * n * d
    assert full >= b * h * n * n > chunked


def test_a_is_kept_only_when_it_is_no_larger_than_q_and_fits_one_block():
    """One block, no dropout and m <= d: A (b h n m numbers, no more than q's b h n d) is kept for backward, which
    then skips recomputing it; the gradients are still SDPA's. Any other case keeps q, k, v and the output only."""
    b, h, n, d = 2, 3, 6, 8
    q, k, v = qkv(b, h, n, d)
    assert saved_numel(lambda *t: chunked_attention(*t, scale=d**-0.5), q, k, v) == 4 * b * h * n * d + b * h * n * n
    upstream = torch.randn_like(q)
    kept = value_and_grads(lambda *t: chunked_attention(*t, scale=d**-0.5), q, k, v, upstream)
    assert_matches(kept, value_and_grads(F.scaled_dot_product_attention, q, k, v, upstream), F64_TOL, "A kept")
    several_blocks = lambda *t: chunked_attention(*t, scale=d**-0.5, max_elements=n * 2)  # noqa: E731
    with_dropout = lambda *t: chunked_attention(*t, scale=d**-0.5, dropout_p=0.1)  # noqa: E731
    for fn in (several_blocks, with_dropout):
        assert saved_numel(fn, q, k, v) == 4 * b * h * n * d


def test_chunk_elements_is_validated_and_shown():
    with pytest.raises(ValueError, match="chunk_elements"):
        Attend(8, impl="chunked", chunk_elements=0)
    with pytest.raises(TypeError, match="chunk_elements"):
        Attend(8, impl="chunked", chunk_elements=2.5)
    assert "chunk_elements=1024" in repr(Attend(8, impl="chunked", chunk_elements=1024))


def test_default_block_grows_with_threads_within_its_bounds():
    """Four L2s of scores per thread, never below 2**12 scores nor above 2**22 (16 MiB of float32)."""
    sizes = [default_chunk_elements(threads=t) for t in range(1, 129)]
    assert all(2**12 <= s <= 2**22 for s in sizes)
    assert sizes == sorted(sizes)
    assert chunk_elements() in sizes  # planned for torch's thread count at its first use, then kept


def test_the_block_is_planned_on_first_use_not_at_import():
    """Importing the package and running a chunked forward's modules reads no sysfs file until a chunked block is
    planned: a fresh interpreter whose file reads fail imports everything, and only the first plan reads."""
    code = (
        "import pathlib, torch\n"
        "reads = []\n"
        "pathlib.Path.read_text = lambda self, *a, **k: reads.append(str(self)) or '2'\n"
        "import vit_einops, vit_einops.network.chunked, vit_einops.network.model\n"
        "from vit_einops.network.chunk_plan import plan_for\n"
        "before = list(reads)\n"
        "plan_for(torch.empty(1, 1, 4, 2), 4, 2**20)\n"
        "print(before, bool(reads))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True"]


def threaded_case():
    """ViT-like float32 inputs of a few tasks' work at the default block size (4 heads of 257 tokens), and a mask."""
    q, k, v = (t.detach() for t in qkv(1, 4, 257, 16, dtype=torch.float32, seed=13))
    return q, k, v, MASKS["causal (n, n)"](1, 4, 257, None)


def test_threaded_forward_gives_the_same_bits_whatever_the_thread_count(restore_threads):
    """The blocks of a call of several tasks' work go to worker threads in whatever order they come free, each block
    computed by single-threaded ops: at 1, 2 and 3 threads, and from one call to the next, the output is the same
    to the bit (float32, where a different split of a product between threads can change the last bits), and SDPA's
    within float32 rounding. Under inference mode too: the workers write into the caller's inference tensors."""
    q, k, v, mask = threaded_case()
    outs = []
    for threads in (1, 2, 3, 2):
        torch.set_num_threads(threads)
        outs.append(chunked_attention(q, k, v, mask, scale=0.25))
    with torch.inference_mode():
        outs.append(chunked_attention(q, k, v, mask, scale=0.25))
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    assert_close(outs[0], F.scaled_dot_product_attention(q, k, v, attn_mask=mask), F32_TOL, "vs sdpa")


def counted_pool(monkeypatch) -> list[tuple[int, list[str]]]:
    """chunked.py's run_tasks, recording per call its task count and the name of the thread each task ran on."""
    calls = []

    def counting(task, count, threads):
        ran: list[str] = []
        run_tasks(lambda i: ran.append(threading.current_thread().name) or task(i), count, threads)
        calls.append((count, ran))

    monkeypatch.setattr(chunked, "run_tasks", counting)
    return calls


# budget -> how the call's blocks fall: the default (heads, or query rows where one head's scores pass one L2), and
# blocks of 40 query rows of one head (then a task is one (b h) row's blocks, which add into that row's dk and dv).
BACKWARD_BUDGETS = {"default blocks": None, "blocks of query rows": 257 * 40}


@pytest.mark.parametrize("budget", BACKWARD_BUDGETS.values(), ids=list(BACKWARD_BUDGETS))
def test_threaded_backward_runs_on_the_pool_and_gives_the_same_bits_whatever_the_thread_count(
    budget, monkeypatch, restore_threads
):
    """A call whose forward handed its blocks to the pool hands its backward's blocks to the same workers: at 2
    threads every backward task runs on a pool worker (none on the caller with its ops split between torch's
    threads); blocks of query rows go as one task per (b h) row. The gradients are the same to the bit at 1, 2 and
    3 threads, and SDPA's within float32 rounding, with a mask."""
    q, k, v = qkv(1, 4, 257, 16, dtype=torch.float32, seed=13)
    mask = MASKS["causal (n, n)"](1, 4, 257, None)
    upstream = torch.randn_like(q)
    calls = counted_pool(monkeypatch)
    results = {}
    for threads in (2, 1, 3):
        torch.set_num_threads(threads)
        results[threads] = value_and_grads(
            lambda *t: chunked_attention(*t, mask, scale=0.25, max_elements=budget), q, k, v, upstream
        )
        if threads == 2:
            assert len(calls) == 2, calls  # the forward's tasks, then the backward's
            (forward, _), (backward, ran) = calls
            plan = task_plan(q, 257, budget or chunk_elements())
            assert forward == len(plan.blocks) > 1
            assert backward == (forward if plan.whole else 4), (plan.whole, backward)
            assert len(ran) == backward and all(name.startswith("vit-einops-chunked-") for name in ran), ran
    assert len(calls) == 4  # 3 threads: two calls more; 1 thread runs the same tasks in turn on the caller
    for threads in (1, 3):
        out, grads = results[threads]
        assert torch.equal(out, results[2][0]) and all(map(torch.equal, grads, results[2][1])), threads
    reference = value_and_grads(lambda *t: F.scaled_dot_product_attention(*t, attn_mask=mask), q, k, v, upstream)
    assert_matches(results[2], reference, F32_TOL, "vs sdpa")


def test_callers_on_several_threads_at_once_each_get_their_own_result(restore_threads):
    """Two threads calling the path at once share its workers; each call's blocks stay its own."""
    torch.set_num_threads(2)
    q, k, v, mask = threaded_case()
    inputs = [(q, k, v, mask), (k, v, q, None)]
    expected = [chunked_attention(*args, scale=0.25) for args in inputs]
    results: list[list[torch.Tensor]] = [[], []]

    def call(i):
        for _ in range(3):
            results[i].append(chunked_attention(*inputs[i], scale=0.25))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(2):
        assert len(results[i]) == 3 and all(torch.equal(out, expected[i]) for out in results[i])


def test_callers_of_different_thread_counts_at_once_all_return_on_the_same_workers(restore_threads):
    """Callers that each set their own thread count (2, 3 or 4), while the main thread changes its own, all return
    with their exact result, and the same workers serve every round: a call that asks for more workers adds them,
    none stops the workers another call holds. (Rebuilding the pool per thread count stopped workers under callers
    whose jobs then waited for ever: about half of 240 such calls hung, and 800 calls built 545 pools.) A tiny GIL
    switch interval makes the threads interleave inside the pool's bookkeeping, where the race lies; each round's
    callers are joined with a deadline, so a hang fails the test."""
    q, k, v, mask = threaded_case()
    torch.set_num_threads(2)
    expected = chunked_attention(q, k, v, mask, scale=0.25)
    rounds, callers, calls = 4, 6, 3
    outs: list[torch.Tensor] = []
    pools: list[set[int]] = []
    interval = sys.getswitchinterval()

    def call(i):
        torch.get_num_threads()  # a thread's first query takes the process-wide count, which would undo a setting
        for j in range(calls):
            torch.set_num_threads(2 + (i + j) % 3)
            outs.append(chunked_attention(q, k, v, mask, scale=0.25))

    sys.setswitchinterval(1e-6)
    try:
        for _ in range(rounds):
            threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(callers)]
            for thread in threads:
                thread.start()
            for count in (3, 4, 2):
                torch.set_num_threads(count)
            deadline = time.monotonic() + 20
            for thread in threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            hung = sum(thread.is_alive() for thread in threads)
            assert hung == 0, f"{hung} of {callers} callers never returned"
            pools.append({t.ident for t in threading.enumerate() if t.name.startswith("vit-einops-chunked-")})
    finally:
        sys.setswitchinterval(interval)
    assert len(outs) == rounds * callers * calls and all(torch.equal(out, expected) for out in outs)
    assert pools == [pools[0]] * rounds and len(pools[0]) == workers() >= 4


def test_a_dispatch_mode_and_the_profiler_see_every_product(restore_threads):
    """Modes and the profiler watch only their own thread's ops: under them the blocks run on the calling thread,
    so FlopCounterMode counts the two products' 4 b h n m d flops (as for the einsum path), and the backward's too,
    and the profiler records them, where worker threads would have hidden them."""
    torch.set_num_threads(2)
    q, k, v, _ = threaded_case()
    b, h, n, d = q.shape
    with FlopCounterMode(display=False) as flops:
        chunked_attention(q, k, v, scale=0.25)
    assert flops.get_total_flops() == 4 * b * h * n * n * d
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        chunked_attention(q, k, v, scale=0.25)
    assert {"aten::baddbmm", "aten::bmm"} <= {event.name for event in prof.events()}
    q.requires_grad_(True)
    with FlopCounterMode(display=False) as flops:
        chunked_attention(q, k, v, scale=0.25).sum().backward()
    # the backward's five products (A recomputed, dv, dP, dq, dk) beside the forward's two, all counted
    assert flops.get_total_flops() == 14 * b * h * n * n * d


def _child_runs(q, k, v, mask, queue):
    queue.put(chunked_attention(q, k, v, mask, scale=0.25).tolist())  # plain numbers: exact for float32


def test_a_forked_child_builds_its_own_workers(restore_threads):
    """A fork copies none of the parent's worker threads: the child's threaded forward must build its own, not wait
    for the parent's. (The child gets its inputs from the parent: any op split between OpenMP threads hangs in a
    child forked after the parent used them, a limit of GNU OpenMP that the workers' single-threaded ops avoid.)"""
    torch.set_num_threads(2)
    q, k, v, mask = threaded_case()
    expected = chunked_attention(q, k, v, mask, scale=0.25)  # the parent's workers exist now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_runs, args=(q, k, v, mask, queue))
    child.start()
    try:
        out = queue.get(timeout=60)
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
    assert torch.equal(torch.tensor(out), expected) and child.exitcode == 0
