"""Multi-head self-attention, Appendix A of the paper (Eqs. 5-8).

Axes used throughout: b batch, n tokens (i queries, j keys), h heads, d head size D_h.

Three implementations of the same Eq. 6-7 (``Attend.impl``):
- "einsum": the paper literally; materialises the whole (b, h, n, n) matrix A.
- "chunked": the same einsums over blocks of queries, each with its exact softmax (a query's row of A needs
  every key, never another query), so only one block of A exists at a time; the backward pass recomputes each
  block instead of storing A, as FlashAttention and SDPA's CPU kernel do. Memory O(b h n d), not O(b h n^2).
- "sdpa": torch.nn.functional.scaled_dot_product_attention, torch's fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum
from einops.layers.torch import Rearrange
from torch import nn
from torch.autograd.function import once_differentiable

from ._checks import check_choice, check_positive_int, check_probability
from .config import ATTN_IMPLS

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
    softmax) stay within twice the size of the output: peak memory O(b h n d) whatever n is. Equal to the full-matrix einsum up to float rounding, in values and gradients; dropout on A, when
    ``dropout_p`` > 0, is drawn per block from a generator seeded off torch's global one (so
    ``torch.manual_seed`` makes it reproducible) and redrawn identically in the backward pass.

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


class Attend(nn.Module):
    """The attention math alone: Eq. 6 ``A = softmax(q k^T / sqrt(D_h))`` and Eq. 7 ``A v``.

    The scale sits *inside* the softmax and uses the head size D_h, not D. The softmax is its own
    submodule, so a forward hook on ``attend.softmax`` sees A on the einsum path.

    Args:
        head_dim: D_h, the size of one head.
        dropout: dropout on A (attention dropout), active in training only.
        impl: "einsum" (written out here), "chunked" (the same einsums over blocks of queries, see
            :func:`chunked_attention`) or "sdpa" (torch.nn.functional.scaled_dot_product_attention).
        chunk_elements: on the "chunked" path, the most scores held at once (one block of A); a plain
            attribute that may be changed after construction.

    Shapes: q, k, v (b, h, n, d); mask None or bool broadcastable to (b, h, n, n), True = may attend;
    output (b, h, n, d).
    """

    def __init__(
        self, head_dim: int, dropout: float = 0.0, impl: str = "einsum", chunk_elements: int = CHUNK_ELEMENTS
    ) -> None:
        super().__init__()
        self.scale = check_positive_int("head_dim", head_dim) ** -0.5
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(check_probability("attn_dropout", dropout))
        self.impl = impl
        self.chunk_elements = check_positive_int("chunk_elements", chunk_elements)

    @property
    def impl(self) -> str:
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        self._impl = check_choice("attention impl", value, ATTN_IMPLS)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self._impl == "sdpa":
            # SDPA's default scale is 1/sqrt(q.size(-1)) = 1/sqrt(D_h): the same Eq. 6.
            p = self.dropout.p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        if self._impl == "chunked":
            p = self.dropout.p if self.training else 0.0
            return chunked_attention(q, k, v, mask, scale=self.scale, dropout_p=p, max_elements=self.chunk_elements)
        # (q / sqrt(D_h)) k^T equals q k^T / sqrt(D_h); scaling q touches n*d numbers instead of n*n.
        energy = einsum(q * self.scale, k, "b h i d, b h j d -> b h i j")
        if mask is not None:
            energy = energy.masked_fill(~mask, float("-inf"))
        attn = self.dropout(self.softmax(energy))
        return einsum(attn, v, "b h i j, b h j d -> b h i d")

    def extra_repr(self) -> str:
        chunks = f", chunk_elements={self.chunk_elements}" if self._impl == "chunked" else ""
        return f"impl={self._impl!r}, scale={self.scale:.6g}{chunks}"


class MultiHeadAttention(nn.Module):
    """MSA(z) = [SA_1(z); ...; SA_h(z)] U_msa (Eq. 8), with every head's U_qkv fused in one Linear (Eq. 5).

    The fused ``qkv`` output is laid out (qkv h d): rows [0:D] are q, [D:2D] k, [2D:3D] v, head i owning
    rows [i*D_h:(i+1)*D_h] in each. That is exactly ``nn.MultiheadAttention.in_proj_weight`` and timm's
    ``attn.qkv.weight``, so weights copy across without permutation.

    Args:
        dim: D, the model width; must be divisible by ``heads``.
        heads: h.
        dropout: dropout after the output projection ``proj`` (Appendix B.1).
        attn_dropout: dropout on the attention matrix.
        impl: "einsum", "chunked" or "sdpa"; a plain attribute that may be changed after construction.

    Shapes: x (b, n, D); mask None or bool broadcastable to (b, h, n, n), True = may attend;
    output (b, n, D).
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, attn_dropout: float = 0.0, impl: str = "einsum") -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.dim, self.heads = dim, heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.split_heads = Rearrange("b n (qkv h d) -> qkv b h n d", qkv=3, h=heads)
        self.attend = Attend(dim // heads, attn_dropout, impl)
        self.merge_heads = Rearrange("b h n d -> b n (h d)")
        self.proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    @property
    def impl(self) -> str:
        return self.attend.impl

    @impl.setter
    def impl(self, value: str) -> None:
        self.attend.impl = value

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape (b, n, {self.dim}), got {tuple(x.shape)}")
        if mask is not None:
            mask = self._check_mask(mask, x)
        q, k, v = self.split_heads(self.qkv(x))
        return self.dropout(self.proj(self.merge_heads(self.attend(q, k, v, mask))))

    def _check_mask(self, mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a bool tensor (True = may attend), got {got}")
        b, n = x.shape[:2]
        full = (b, self.heads, n, n)
        try:
            ok = mask.ndim <= 4 and torch.broadcast_shapes(mask.shape, full) == full
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (b, h, n, n) = {full}")
        if not mask.expand(full).any(dim=-1).all():
            # softmax over an all -inf row is NaN on the einsum path and silently 0 or NaN in SDPA kernels.
            raise ValueError("mask leaves at least one query row with no key to attend to")
        return mask
