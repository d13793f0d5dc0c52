"""torch's own modules carrying our weights: the independent implementations our layers are checked against.

Because our fused ``qkv`` is laid out (qkv h d), it *is* ``in_proj_weight``; no permutation is involved, which is
exactly what the equivalence tests prove.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from .attention import MultiHeadAttention
from .blocks import TransformerEncoderBlock
from .model import ViT


@torch.no_grad()
def torch_mha_from(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` with ``mha``'s weights (dropout 0)."""
    ref = nn.MultiheadAttention(mha.dim, mha.heads, batch_first=True)
    ref = ref.to(dtype=mha.qkv.weight.dtype, device=mha.qkv.weight.device)
    ref.in_proj_weight.copy_(mha.qkv.weight)
    ref.in_proj_bias.copy_(mha.qkv.bias)
    ref.out_proj.weight.copy_(mha.proj.weight)
    ref.out_proj.bias.copy_(mha.proj.bias)
    return ref


@torch.no_grad()
def torch_encoder_layer_from(block: TransformerEncoderBlock) -> nn.TransformerEncoderLayer:
    """An ``nn.TransformerEncoderLayer`` (pre-norm, exact GELU, dropout 0) with ``block``'s weights."""
    attn_norm, mha = block.attn.fn.norm, block.attn.fn.mha
    mlp_norm, ff = block.mlp.fn.norm, block.mlp.fn.ff
    ref = nn.TransformerEncoderLayer(
        mha.dim,
        mha.heads,
        dim_feedforward=ff.fc1.out_features,
        dropout=0.0,
        activation="gelu",
        layer_norm_eps=attn_norm.eps,
        batch_first=True,
        norm_first=True,
    ).to(dtype=mha.qkv.weight.dtype, device=mha.qkv.weight.device)
    ref.self_attn.load_state_dict(torch_mha_from(mha).state_dict())
    for ours, theirs in ((attn_norm, ref.norm1), (mlp_norm, ref.norm2), (ff.fc1, ref.linear1), (ff.fc2, ref.linear2)):
        theirs.load_state_dict(ours.state_dict())
    return ref


def forward_backward(fn, x: torch.Tensor, params: list[torch.Tensor], upstream: torch.Tensor):
    """Return ``fn(x)`` and the gradients of ``<fn(x), upstream>`` with respect to x and each of ``params``.

    A random ``upstream`` (rather than ``.sum()``) makes every output element weigh differently, so a permuted
    output cannot hide in a symmetric gradient.
    """
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    grads = torch.autograd.grad((out * upstream).sum(), [x, *params])
    return out.detach(), grads


def torch_reference_vit(model: ViT) -> nn.Sequential:
    """``model`` with every encoder block replaced by torch's ``nn.TransformerEncoderLayer`` (same weights).

    Patch embedding and head are shared modules (not copies): only the encoder is swapped for torch's.
    """
    return nn.Sequential(
        OrderedDict(
            patch_embed=model.patch_embed,
            blocks=nn.Sequential(*(torch_encoder_layer_from(b) for b in model.blocks)),
            head=model.head,
        )
    )
