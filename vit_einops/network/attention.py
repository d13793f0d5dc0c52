"""Multi-head self-attention, Appendix A of the paper (Eqs. 5-8).

Axes used throughout: b batch, n tokens (i queries, j keys), h heads, d head size D_h.

Eqs. 6-7 have several kernels (``Attend.impl``), entries of :data:`~vit_einops.network.kernels.KERNELS`, chosen at
run time (``ViT(attn_impl=...)``, :func:`set_attn_impl`), never part of the architecture or its config:
- "einsum" (:func:`einsum_attention`): the paper literally; materialises the whole (b, h, n, n) matrix A.
- "chunked": the same einsums over blocks of queries, each with its exact softmax (a query's row of A needs
  every key, never another query), so only one block of A exists at a time; the backward pass recomputes each
  block instead of storing A, as FlashAttention and SDPA's CPU kernel do. Memory O(b h n d), not O(b h n^2).
  It lives in chunked.py.
- "sdpa" (:func:`sdpa_attention`): torch.nn.functional.scaled_dot_product_attention, torch's fused kernel.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from einops.layers.torch import Rearrange
from torch import nn

from ..base.checks import (
    check_attention_mask,
    check_bool,
    check_choice,
    check_heads,
    check_positive_int,
    check_probability,
)
from .config import ViTConfig, check_config, check_float32, check_qkv_bias
from .kernels import KERNELS, check_kernel_runs
from .probes import HookPoint
from .rope import RopeTable, apply_rope


def check_attn_impl(value: Any, name: str = "attn_impl") -> str:
    """``value`` if it names an attention kernel (an entry of KERNELS): the one check of an impl, wherever one
    enters."""
    return check_choice(name, value, KERNELS)


def per_layer_impls(value: Any, depth: int) -> tuple[str, ...]:
    """One impl per layer, from one impl for every layer (a str) or a sequence of ``depth`` of them."""
    if isinstance(value, str):
        return (check_attn_impl(value),) * depth
    if not isinstance(value, Sequence):
        raise TypeError(
            f"attn_impl must be one of {', '.join(map(repr, KERNELS))} or a sequence of them (one per layer), "
            f"got {value!r} of type {type(value).__name__}"
        )
    impls = tuple(check_attn_impl(v, f"attn_impl[{i}]") for i, v in enumerate(value))
    if len(impls) != depth:
        raise ValueError(f"attn_impl lists {len(impls)} impls for a model of depth {depth}; expected one per layer")
    return impls


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of Eq. 6, q k^T / sqrt(D_h) with ``scale`` = D_h ** -0.5, and -inf where ``mask`` is False.

    Shapes: q (b, h, i, d), k (b, h, j, d), mask None or bool broadcastable to (b, h, i, j); output (b, h, i, j).
    """
    # (q / sqrt(D_h)) k^T equals q k^T / sqrt(D_h); scaling q touches n*d numbers instead of n*n.
    energy = einsum(q * scale, k, "b h i d, b h j d -> b h i j")
    if mask is not None:
        energy = energy.masked_fill(~mask, float("-inf"))
    return energy


def einsum_attention(attend: Attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """The "einsum" kernel: A = softmax(q k^T / sqrt(D_h)) (Eq. 6) formed whole by ``attend.softmax``, dropout on
    it, then A v (Eq. 7)."""
    attn = attend.dropout(attend.softmax(attention_scores(q, k, attend.scale, mask)))
    return einsum(attn, v, "b h i j, b h j d -> b h i d")


def sdpa_attention(attend: Attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """The "sdpa" kernel: torch's fused scaled_dot_product_attention, whose default scale 1/sqrt(q.size(-1)) is
    1/sqrt(D_h): the same Eq. 6."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=attend.dropout_p)


def _has_hooks(module: nn.Module) -> bool:
    """True if a forward (pre-)hook is registered on ``module`` itself."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def warn_skipped_softmax_hook(impl: str) -> None:
    """The "chunked" and "sdpa" paths never call ``attend.softmax`` (SDPA never forms A; the chunked path forms it
    a block at a time inside its own autograd function), so a hook on it would silently record nothing."""
    warnings.warn(
        f"a forward hook is registered on attend.softmax, but attention impl {impl!r} never calls that module, "
        "so the hook does not fire. To record the attention matrices A on any impl use "
        "vit_einops.inspect.AttentionRecorder (or record_attention); or switch to impl 'einsum' "
        "(model.set_attn_impl('einsum')), the only path that runs attend.softmax.",
        UserWarning,
        stacklevel=3,
    )


class Attend(nn.Module):
    """The attention math alone: Eq. 6 ``A = softmax(q k^T / sqrt(D_h))`` and Eq. 7 ``A v``.

    The scale sits *inside* the softmax and uses the head size D_h, not D. The softmax is its own
    submodule, so a forward hook on ``attend.softmax`` sees A on the einsum path; the other paths never call
    it and warn (once per layer) when it is hooked: :class:`vit_einops.inspect.AttentionRecorder` records A
    on every path.

    Args:
        head_dim: D_h, the size of one head.
        dropout: dropout on A (attention dropout, ``ViTConfig.attn_dropout``), active in training only.
        impl: the kernel, a name of :data:`~vit_einops.network.kernels.KERNELS`: "einsum" (written out here),
            "chunked" (the same einsums over blocks of queries) or "sdpa" (torch's fused kernel).
        chunk_elements: on the "chunked" path, the most scores held at once (one block of A), None for the
            machine's default (:func:`~vit_einops.network.chunk_plan.chunk_elements`, planned on first use); a
            plain attribute that may be changed after construction.

    Probe sites: ``hook_attn_scores`` (the logits of Eq. 6, masked, (b, h, n, n)) and ``hook_pattern`` (A,
    (b, h, n, n)). While either is probed the layer forms A from its q and k as the einsum kernel does, whichever
    kernel is chosen, and attends with the (possibly replaced) A; unprobed, the kernel runs alone.

    Shapes: q, k, v (b, h, n, d); mask None or bool broadcastable to (b, h, n, n), True = may attend;
    output (b, h, n, d).
    """

    def __init__(
        self, head_dim: int, dropout: float = 0.0, impl: str = "einsum", chunk_elements: int | None = None
    ) -> None:
        super().__init__()
        self.scale = check_positive_int("head_dim", head_dim) ** -0.5
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.impl = impl
        self.chunk_elements = None if chunk_elements is None else check_positive_int("chunk_elements", chunk_elements)
        self._warned_hook = False  # warn_skipped_softmax_hook once per layer, not on every forward
        self.hook_attn_scores = HookPoint("(b, h, n, n)")
        self.hook_pattern = HookPoint("(b, h, n, n)")

    @property
    def impl(self) -> str:
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        self._impl = check_attn_impl(value)
        self._kernel = KERNELS[self._impl].select()

    @property
    def forms_attention(self) -> bool:
        """True when the kernel holds the whole (b, h, n, n) matrix A, which the memory estimate counts."""
        return KERNELS[self._impl].forms_attention

    @property
    def dropout_p(self) -> float:
        """The rate of attention dropout now: ``dropout.p`` in training, 0 in eval."""
        return self.dropout.p if self.training else 0.0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.hook_attn_scores.hooks or self.hook_pattern.hooks:
            return self._probed(q, k, v, mask)
        if not self._warned_hook and _has_hooks(self.softmax) and not self.forms_attention:
            warn_skipped_softmax_hook(self._impl)
            self._warned_hook = True
        return self._kernel(self, q, k, v, mask)

    def _probed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Eqs. 6-7 through the probe sites, with the einsum kernel's arithmetic."""
        scores = self.hook_attn_scores(attention_scores(q, k, self.scale, mask))
        attn = self.hook_pattern(self.softmax(scores))
        return einsum(self.dropout(attn), v, "b h i j, b h j d -> b h i d")

    def extra_repr(self) -> str:
        chunks = f", chunk_elements={self.chunk_elements}" if self.chunk_elements else ""
        return f"impl={self._impl!r}, scale={self.scale:.6g}{chunks}"


class MultiHeadAttention(nn.Module):
    """MSA(z) = [SA_1(z); ...; SA_h(z)] U_msa (Eq. 8), with every head's U_qkv fused in one Linear (Eq. 5).

    The fused ``qkv`` output is laid out (qkv h d): rows [0:D] are q, [D:2D] k, [2D:3D] v, head i owning
    rows [i*D_h:(i+1)*D_h] in each. That is exactly ``nn.MultiheadAttention.in_proj_weight`` and timm's
    ``attn.qkv.weight``, so weights copy across without permutation.

    Built alone as ``nn.MultiheadAttention(embed_dim, num_heads)`` and timm's ``Attention(dim, num_heads)`` are:
    ``MultiHeadAttention(64, 4)``; an encoder block builds it with :meth:`from_config`.

    Args:
        dim: D, the width of the tokens.
        heads: h, the number of heads; D_h = D / h.
        qkv_bias: the bias of ``qkv``: True (the paper, torchvision and timm's ViTs), False, or "qv" (BEiT, EVA): the
            learned ``q_bias`` and ``v_bias`` with k's third fixed at zero (no parameter, nothing saved).
        qk_norm: a LayerNorm over D_h on every head's q and k before Eq. 6 (Dehghani et al. 2023; timm's qk_norm).
        layer_norm_eps: the epsilon of those LayerNorms (torchvision and timm: 1e-6).
        attn_dropout: dropout on the attention matrix A (timm's attn_drop).
        proj_dropout: dropout after the output projection ``proj`` (Appendix B.1).
        impl: "einsum" (the paper literally), "chunked" or "sdpa": which kernel runs; a plain attribute that may be
            changed at run time, never part of the architecture.

    Probe sites (TransformerLens's names, under ``blocks.{l}.attn.``): ``hook_q``, ``hook_k``, ``hook_v`` (after
    qk-norm and RoPE, as the kernel takes them), ``hook_z`` (each head's A v), all (b, n, h, d); ``hook_result``
    (each head's output after its slice of ``proj``, (b, n, h, D), computed only while probed: summed over heads,
    plus ``proj.bias``, it is the layer's output before dropout); and ``attend``'s ``hook_attn_scores`` and
    ``hook_pattern``.

    Shapes: x (b, n, D); mask None or bool broadcastable to (b, h, n, n), True = may attend; rope None or the
    :class:`~vit_einops.network.rope.RopeTable` of x's tokens, which rotates q and k after the head split (and qk-norm),
    so every impl and every hook on ``attend`` sees the rotated q and k; output (b, n, D).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        qkv_bias: bool | str = True,
        qk_norm: bool = False,
        layer_norm_eps: float = 1e-6,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
        impl: str = "einsum",
    ) -> None:
        super().__init__()
        self.dim, self.heads = check_heads(dim, heads)
        head_dim = self.dim // self.heads
        qkv_bias = check_qkv_bias("qkv_bias", qkv_bias)
        qk_norm = check_bool("qk_norm", qk_norm)
        layer_norm_eps = check_float32("layer_norm_eps", layer_norm_eps)
        attn_dropout = check_probability("attn_dropout", attn_dropout)
        proj_dropout = check_probability("proj_dropout", proj_dropout)
        check_attn_impl(impl, "impl")
        self.qkv = nn.Linear(self.dim, 3 * self.dim, bias=qkv_bias is True)
        self.check_kernel(impl)  # on the device and dtype the weights were made in (torch's defaults)
        if qkv_bias == "qv":  # without RoPE a bias on k adds q . b_k to every key of a query: the softmax cancels it
            self.q_bias = nn.Parameter(torch.zeros(self.dim))
            self.v_bias = nn.Parameter(torch.zeros(self.dim))
        self.split_heads = Rearrange("b n (qkv h d) -> qkv b h n d", qkv=3, h=self.heads)
        if qk_norm:
            self.q_norm = nn.LayerNorm(head_dim, eps=layer_norm_eps)
            self.k_norm = nn.LayerNorm(head_dim, eps=layer_norm_eps)
        self.attend = Attend(head_dim, attn_dropout, impl)
        self.merge_heads = Rearrange("b h n d -> b n (h d)")
        self.proj = nn.Linear(self.dim, self.dim)
        self.dropout = nn.Dropout(proj_dropout)
        self.hook_q, self.hook_k, self.hook_v, self.hook_z = (HookPoint("(b, n, h, d)", heads_second=True)
                                                              for _ in range(4))  # fmt: skip
        self.hook_result = HookPoint("(b, n, h, D)")

    @classmethod
    def from_config(cls, config: ViTConfig) -> MultiHeadAttention:
        """The attention of an encoder block of ``config``: its ``dim``, ``heads``, ``qkv_bias``, ``qk_norm``,
        ``layer_norm_eps``, ``attn_dropout`` and ``dropout`` (after ``proj``)."""
        check_config(config, "MultiHeadAttention.from_config")
        return cls(
            config.dim,
            config.heads,
            qkv_bias=config.qkv_bias,
            qk_norm=config.qk_norm,
            layer_norm_eps=config.layer_norm_eps,
            attn_dropout=config.attn_dropout,
            proj_dropout=config.dropout,
        )

    @property
    def impl(self) -> str:
        return self.attend.impl

    @impl.setter
    def impl(self, value: str) -> None:
        self.attend.impl = self.check_kernel(value)

    def check_kernel(self, impl: Any, move: Callable[[torch.Tensor], torch.Tensor] | None = None) -> str:
        """``impl`` if it names a kernel that runs on the device and dtype of the layer's weights, or where ``move``
        (the function torch's ``.to()``, ``.cuda()``, ``.half()`` apply to each tensor) would put them; else a
        ValueError naming the kernel, the device and dtype, and the kernels that run there."""
        weight = self.qkv.weight
        if move is not None:
            weight = move(weight.new_empty(0))  # where the move puts the weights, found without moving them
        return check_kernel_runs(check_attn_impl(impl), weight.device.type, str(weight.dtype).removeprefix("torch."))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MultiHeadAttention:
        # torch's one path for every move (.to(), .cuda(), .half(), .to_empty()): refused before a tensor moves
        self.check_kernel(self.impl, fn)
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, rope: RopeTable | None = None) -> torch.Tensor:
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape (b, n, {self.dim}), got {tuple(x.shape)}")
        if mask is not None:
            mask = self._check_mask(mask, x)
        qkv = self.qkv(x)
        if "q_bias" in self._parameters:
            qkv = qkv + torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
        q, k, v = self.split_heads(qkv)
        if "q_norm" in self._modules:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        z = self.hook_z(self.attend(q, k, v, mask))
        return self.dropout(self._project(z))

    def _project(self, z: torch.Tensor) -> torch.Tensor:
        """Eq. 8's U_msa on the concatenated heads z (b, h, n, d); head by head while ``hook_result`` is probed."""
        if not self.hook_result.hooks:
            return self.proj(self.merge_heads(z))
        w = rearrange(self.proj.weight, "D (h d) -> h d D", h=self.heads)
        result = self.hook_result(einsum(z, w, "b h n d, h d D -> b n h D"))
        return result.sum(dim=2) if self.proj.bias is None else result.sum(dim=2) + self.proj.bias

    def _check_mask(self, mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, n = x.shape[:2]
        full = (b, self.heads, n, n)
        check_attention_mask(mask, full, "(b, h, n, n)")
        if not mask.expand(full).any(dim=-1).all():
            # softmax over an all -inf row is NaN on the einsum path and silently 0 or NaN in SDPA kernels.
            raise ValueError("mask leaves at least one query row with no key to attend to")
        return mask


def set_attn_impl(model: nn.Module, impl: str | Sequence[str]) -> nn.Module:
    """Switch the MultiHeadAttention layers inside ``model`` to ``impl`` (a name of
    :data:`~vit_einops.network.kernels.KERNELS`), or to one impl per layer in order (a sequence); returns the model.
    A refused ``impl`` (unknown, or not running on a layer's device and dtype) changes no layer."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    impls = per_layer_impls(impl, len(layers))
    for layer, layer_impl in zip(layers, impls, strict=True):
        layer.check_kernel(layer_impl)
    for layer, layer_impl in zip(layers, impls, strict=True):
        layer.impl = layer_impl
    return model


def check_kernels_move(model: nn.Module, move: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Refuse ``move`` (torch's ``_apply`` function) before any tensor of ``model`` moves when a layer's kernel
    would not run where it puts the weights (:meth:`MultiHeadAttention.check_kernel`)."""
    for layer in model.modules():
        if isinstance(layer, MultiHeadAttention):
            layer.check_kernel(layer.impl, move)


def attn_impl_of(model: nn.Module) -> str | tuple[str, ...]:
    """The impl of the MultiHeadAttention layers inside ``model``: one str when they all agree, else one per layer."""
    impls = tuple(m.impl for m in model.modules() if isinstance(m, MultiHeadAttention))
    return impls[0] if len(set(impls)) == 1 else impls
