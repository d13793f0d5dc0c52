"""What a ViT of a config will need, from the config alone: its parameters and modules, the memory and time to build
or load it, and the memory of a forward pass. Nothing is allocated or built, and every count is arithmetic on the
fields (never a list as long as one of them), so a config that asks for terabytes or for 50,000 blocks is refused in
microseconds (:func:`vit_einops.base.budget.check_memory`, :func:`vit_einops.base.budget.check_build_time`) instead of
after minutes of building.

The counts follow the modules one to one (tests hold :func:`parameter_count` equal to a built model's count for
random configs): Eq. 1's projection E, class token and E_pos; per block (Eqs. 2-3) two LayerNorms, the fused qkv
and output projections, the MLP's two Linears; the head's LayerNorm, pre-logits layer and classifier; and the
options beyond the paper (registers, LayerScale, qk-norm, pre-norm, attention pooling, a distillation classifier).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..base import budget as _budget
from ..base.budget import check_memory, format_bytes
from .attention import Attend
from .chunk_plan import chunk_elements
from .config import ViTConfig

# Python's own memory per encoder block, beside its tensors: ten modules with their dicts and hooks (tracemalloc
# measures 52 KB a block with torch 2.13 on the meta device, rounded up).
BLOCK_OVERHEAD_BYTES = 64 * 1024
# Seconds to construct one module of a ViT, whatever its width (torch's nn.Module set-up, a Linear's or LayerNorm's
# parameters made and reset, our own __init__s): the least of the medians measured by the command in
# docs/reliability.md (builds of 44,012 modules) on a shared 2-core AMD EPYC, 60 to 77 us, with torch 2.13. Real
# ViTs have a few hundred modules (ViT-H/14: 652), so their estimate is a few hundredths of a second.
MODULE_SECONDS = 60e-6
# The modules of one encoder block: the block; the attention branch ResidualAdd(LayerNorm, MultiHeadAttention(qkv,
# split_heads, Attend(softmax, dropout), merge_heads, proj, dropout)); the MLP branch ResidualAdd(LayerNorm,
# FeedForwardBlock(fc1, act, drop1, fc2, drop2)).
BLOCK_MODULES = 1 + 11 + 8


def block_parameters(config: ViTConfig) -> int:
    """The parameters of one encoder block (Eqs. 2-3): two LayerNorms, qkv and output projections, the MLP, and
    LayerScale's and qk-norm's when the config has them (and SwiGLU's wider fc1, or q and v biases only)."""
    d, m = config.dim, config.mlp_dim
    qkv_bias = {True: 3 * d, "qv": 2 * d, False: 0}[config.qkv_bias]
    fc1 = 2 * m if config.ffn == "swiglu" else m  # SwiGLU's fc1 computes the gate and the value at once
    block = 2 * d + (3 * d * d + qkv_bias) + (d * d + d) + 2 * d + (d * fc1 + fc1) + (m * d + d)
    if config.layer_scale is not None:
        block += 2 * d  # gamma of each branch
    if config.qk_norm:
        block += 4 * config.head_dim  # LayerNorms over D_h on q and k
    return block


def _classifier_parameters(config: ViTConfig) -> int:
    features = config.dim if config.representation_size is None else config.representation_size
    classifiers = 1 + config.distill_token  # DeiT's second classifier reads the distillation token
    return classifiers * (features * config.num_classes + config.num_classes * config.head_bias)


def parameter_count(config: ViTConfig) -> int:
    """The number of parameters of ``ViT.from_config(config)``, in exact integers however large."""
    c, (ph, pw), d, m = config.in_channels, config.patch_size, config.dim, config.mlp_dim
    mlp = (d * m + m) + (m * d + d)
    # E (conv or linear, same count) and its bias, the prefix tokens (class, distillation, registers), E_pos,
    # CLIP's pre-norm
    embed = d * c * ph * pw + d * config.patch_bias + config.num_prefix_tokens * d + config.num_pos_tokens * d
    embed += 2 * d * config.pre_norm
    head = 2 * d  # the final LayerNorm (on every token, or after pooling with fc_norm)
    if config.pool == "map":  # latent query, q, kv, output projection, LayerNorm and MLP
        head += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + mlp
    if config.representation_size is not None:
        head += d * config.representation_size + config.representation_size
    return embed + config.depth * block_parameters(config) + head + _classifier_parameters(config)


def module_count(config: ViTConfig) -> int:
    """The number of modules of ``ViT.from_config(config)`` (``len(list(model.modules()))``), exactly."""
    block = BLOCK_MODULES + 2 * (config.layer_scale is not None) + 2 * config.qk_norm  # LayerScales; q and k norms
    # patch_embed with proj, flatten, pos_embed and dropout, and the prefix tokens' and pre-norm's modules
    embed = 5 + config.class_token + config.distill_token + (config.register_tokens > 0) + config.pre_norm
    # head with norm, pool (attention pooling: 16 more), fc, DeiT's fc_dist, pre_logits (Sequential, Linear, Tanh)
    head = 4 + config.distill_token + 16 * (config.pool == "map") + 3 * (config.representation_size is not None)
    return 1 + embed + 1 + config.depth * block + head  # the ViT and its blocks container count one each


def size_fields(config: ViTConfig) -> str:
    """The fields that make a config's size, for a message: its depth and dim, and its tokens (from the image and
    patch size and the register tokens) or its classifier where those hold more than a third of its parameters."""
    words = [f"depth {config.depth}", f"dim {config.dim}"]
    third = parameter_count(config) / 3
    if (config.num_prefix_tokens + config.num_pos_tokens) * config.dim > third:
        sources = [f"image_size {config.image_size}", f"patch_size {config.patch_size}"]
        sources += [f"register_tokens {config.register_tokens}"] * bool(config.register_tokens)
        words.append(f"{config.num_tokens:,} tokens from {', '.join(sources[:-1])} and {sources[-1]}")
    if _classifier_parameters(config) > third:  # K classes of representation_size features (else dim)
        if config.representation_size is not None:
            words.append(f"representation_size {config.representation_size}")
        words.append(f"num_classes {config.num_classes}")
    return ", ".join(words)


def model_bytes(config: ViTConfig, itemsize: int = 4, *, copies: int = 1) -> int:
    """Memory to hold ``copies`` of the weights of ``config`` at ``itemsize`` bytes each, and the modules."""
    return copies * parameter_count(config) * itemsize + config.depth * BLOCK_OVERHEAD_BYTES


def check_model_memory(config: ViTConfig, itemsize: int = 4, *, copies: int = 1, action: str = "building") -> None:
    """Refuse a model whose weights (``copies`` of them at once, e.g. 2 while a file's tensors are copied into the
    model) would not fit the memory budget, before anything of it is built."""
    count = parameter_count(config)
    check_memory(
        model_bytes(config, itemsize, copies=copies),
        f"{action} this ViT ({size_fields(config)}, {count:,} parameters"
        + (f", {copies} copies while loading" if copies > 1 else "")
        + ")",
    )


def build_seconds(config: ViTConfig) -> float:
    """The time to construct the modules of ``config`` (:data:`MODULE_SECONDS` each); initialising the parameters
    comes on top, in proportion to their memory."""
    return module_count(config) * MODULE_SECONDS


def check_model_build_time(config: ViTConfig, action: str = "building") -> None:
    """Refuse a model whose modules would take longer to construct than the build-time budget allows
    (:func:`vit_einops.base.budget.check_build_time`), before any of them is built."""
    _budget.check_build_time(
        build_seconds(config), f"{action} this ViT ({size_fields(config)}: {module_count(config):,} modules)"
    )


def forward_bytes(
    config: ViTConfig, batch: int, itemsize: int = 4, *, kept: int = 0, fused: bool = False, grad: bool = False
) -> int:
    """Peak activation memory of one forward pass over ``batch`` images.

    Without gradients one block's activations at a time: its tokens, q k v, the MLP's hidden units and the
    attention scores and probabilities (b h n^2 each, as the einsum path holds them; ``fused`` attention, the
    chunked and SDPA paths, holds one block of them at a time instead). With ``grad`` autograd keeps every block's.
    ``kept`` layers' attention matrices are kept besides, as recording them does (recomputed from q and k, so their
    scores exist whatever the path; with ``grad`` the probabilities and scores both stay in the graph).
    """
    n, d, h, m = config.num_tokens, config.dim, config.heads, config.mlp_dim
    attention = batch * h * n * n
    scores = attention if kept or not fused else min(attention, max(batch * n * d, chunk_elements()))
    block = batch * n * (4 * d + 3 * d + 2 * m) + 2 * scores  # x, residual, normed, out; qkv; mlp hidden twice
    total = block * (config.depth if grad else 1) + kept * attention * (2 if grad else 1)
    return total * itemsize


def check_forward_memory(
    config: ViTConfig,
    batch: int,
    *,
    kept: int = 0,
    fused: bool = False,
    grad: bool = False,
    itemsize: int = 4,
) -> None:
    """Refuse a forward pass over ``batch`` images (see :func:`forward_bytes`) whose activations would not fit the
    memory budget, keeping ``kept`` layers' attention matrices beside it."""
    keeping = ""
    if kept:
        keeping = " keeping every layer's attention" if kept >= config.depth else f" keeping {kept} layers' attention"
    gradients = " with gradients" if grad else ""
    check_memory(
        forward_bytes(config, batch, itemsize, kept=kept, fused=fused, grad=grad),
        f"a forward pass of {batch} image{'s' * (batch != 1)} at {config.num_tokens} tokens{keeping}{gradients}",
    )


def check_model_forward(model: Any, x: torch.Tensor, *, kept: int = 0, grad: bool | None = None) -> None:
    """Refuse a forward pass of the ViT ``model`` over the admitted batch ``x`` (b, C, H, W) whose activations would
    not fit the memory budget, before any of them exists: the check each entry point that takes untrusted sizes
    (predict, the study functions, the commands) makes once, early; the forward pass itself checks no budget.

    The estimate counts the attention kernel each layer runs (one that never forms A holds a block of it at a
    time), ``kept`` layers' attention matrices kept beside the pass (a recorder's), and autograd's saved
    activations when ``grad`` (None: when the pass would be differentiable now, under torch's grad mode with x or a
    parameter of the encoder requiring grad). A module that takes no images (one without ``check_input``, such as
    ``model.blocks``) has no config to estimate from and passes.
    """
    if not hasattr(model, "check_input"):
        return
    config = model.config
    if tuple(x.shape[2:]) != config.image_size:
        config = replace(config, image_size=tuple(x.shape[2:]))
    fused = all(not m.forms_attention for m in model.blocks.modules() if isinstance(m, Attend))
    if grad is None:
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in model.blocks.parameters()))
    check_forward_memory(config, x.shape[0], kept=kept, fused=fused, grad=grad, itemsize=x.element_size())


def check_file_holds(config: ViTConfig, file_bytes: int, source: str) -> None:
    """ValueError when a weights file of ``file_bytes`` is too small to hold the parameters its config describes
    (at 4 bits each, the smallest dtype a file can store): a small file whose config claims a huge depth is refused
    at once, before a model of that depth is even laid out."""
    count = parameter_count(config)
    if file_bytes * 2 < count:
        raise ValueError(
            f"{source}: its config describes {count:,} parameters ({size_fields(config)}), at least "
            f"{format_bytes(count / 2)} of weights, but the file holds {format_bytes(file_bytes)}: the config does "
            f"not match the weights"
        )
