"""What a ViT of a config will need, from the config alone: its parameters, the memory to build or load it, and
the memory of a forward pass. Nothing is allocated or built, so a config that asks for terabytes is refused in
microseconds (:func:`vit_einops._budget.check_memory`) instead of after minutes of building.

The counts follow the modules one to one (tests hold :func:`parameter_count` equal to a built model's count for
random configs): Eq. 1's projection E, class token and E_pos; per block (Eqs. 2-3) two LayerNorms, the fused qkv
and output projections, the MLP's two Linears; the head's LayerNorm, pre-logits layer and classifier; and the
options beyond the paper (registers, LayerScale, qk-norm, pre-norm, attention pooling, a distillation classifier).
"""

from __future__ import annotations

from ._budget import check_memory, format_bytes
from .config import ViTConfig

# Python's own memory per encoder block, beside its tensors: ten modules with their dicts and hooks (tracemalloc
# measures 52 KB a block with torch 2.13 on the meta device, rounded up).
BLOCK_OVERHEAD_BYTES = 64 * 1024


def parameter_count(config: ViTConfig) -> int:
    """The number of parameters of ``ViT.from_config(config)``, in exact integers however large."""
    c, (ph, pw), d, m = config.in_channels, config.patch_size, config.dim, config.mlp_dim
    mlp = (d * m + m) + (m * d + d)
    # E (conv or linear, same count) and its bias, the prefix tokens (class, distillation, registers), E_pos,
    # CLIP's pre-norm
    embed = d * c * ph * pw + d * config.patch_bias + config.num_prefix_tokens * d + config.num_pos_tokens * d
    embed += 2 * d * config.pre_norm
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + mlp
    if config.layer_scale is not None:
        block += 2 * d  # gamma of each branch
    if config.qk_norm:
        block += 4 * config.head_dim  # LayerNorms over D_h on q and k
    head = 2 * d  # the final LayerNorm (on every token, or after pooling with fc_norm)
    if config.pool == "map":  # latent query, q, kv, output projection, LayerNorm and MLP
        head += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + mlp
    features = d
    if config.representation_size is not None:
        features = config.representation_size
        head += d * features + features
    if config.num_classes:
        classifiers = 1 + config.distill_token  # DeiT's second classifier reads the distillation token
        head += classifiers * (features * config.num_classes + config.num_classes * config.head_bias)
    return embed + config.depth * block + head


def model_bytes(config: ViTConfig, itemsize: int = 4, *, copies: int = 1) -> int:
    """Memory to hold ``copies`` of the weights of ``config`` at ``itemsize`` bytes each, and the modules."""
    return copies * parameter_count(config) * itemsize + config.depth * BLOCK_OVERHEAD_BYTES


def check_model_memory(config: ViTConfig, itemsize: int = 4, *, copies: int = 1, action: str = "building") -> None:
    """Refuse a model whose weights (``copies`` of them at once, e.g. 2 while a file's tensors are copied into the
    model) would not fit the memory budget, before anything of it is built."""
    count = parameter_count(config)
    check_memory(
        model_bytes(config, itemsize, copies=copies),
        f"{action} this ViT (depth {config.depth}, dim {config.dim}, {count:,} parameters"
        + (f", {copies} copies while loading" if copies > 1 else "")
        + ")",
    )


def forward_bytes(config: ViTConfig, batch: int, itemsize: int = 4, *, keep_attention: bool = False) -> int:
    """Peak activation memory of one forward pass over ``batch`` images without gradients: one block's tokens,
    q k v, attention scores and probabilities (b h n^2 each, as the einsum path holds them) and MLP hidden units at
    a time; with ``keep_attention`` also every layer's attention matrix, as recording it does."""
    n, d, h, m = config.num_tokens, config.dim, config.heads, config.mlp_dim
    attention = batch * h * n * n
    block = batch * n * (4 * d + 3 * d + 2 * m) + 2 * attention  # x, residual, normed, out; qkv; mlp hidden twice
    kept = config.depth * attention if keep_attention else 0
    return (block + kept) * itemsize


def check_forward_memory(config: ViTConfig, batch: int, *, keep_attention: bool = False, itemsize: int = 4) -> None:
    """Refuse a forward pass over ``batch`` images whose activations would not fit the memory budget."""
    check_memory(
        forward_bytes(config, batch, itemsize, keep_attention=keep_attention),
        f"a forward pass of {batch} images at {config.num_tokens} tokens"
        + (" keeping every layer's attention" if keep_attention else ""),
    )


def check_file_holds(config: ViTConfig, file_bytes: int, source: str) -> None:
    """ValueError when a weights file of ``file_bytes`` is too small to hold the parameters its config describes
    (at 4 bits each, the smallest dtype a file can store): a small file whose config claims a huge depth is refused
    at once, before a model of that depth is even laid out."""
    count = parameter_count(config)
    if file_bytes * 2 < count:
        raise ValueError(
            f"{source}: its config describes {count:,} parameters (depth {config.depth}, dim {config.dim}), at least "
            f"{format_bytes(count / 2)} of weights, but the file holds {format_bytes(file_bytes)}: the config does "
            f"not match the weights"
        )
