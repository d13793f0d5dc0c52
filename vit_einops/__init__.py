"""vit_einops: the Vision Transformer of Dosovitskiy et al. (2021) written with einops, read beside the paper.

Names load on first use (PEP 562): ``import vit_einops`` and the command line's ``--help`` do not import torch.
"""

from __future__ import annotations

from .base.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ATTN_IMPLS": "network.kernels",
    "Kernel": "network.kernels",
    "register_kernel": "network.kernels",
    "unregister_kernel": "network.kernels",
    "ViTConfig": "network.config",
    "Attend": "network.attention",
    "MultiHeadAttention": "network.attention",
    "attention_scores": "network.attention",
    "set_attn_impl": "network.attention",
    "FeedForwardBlock": "network.blocks",
    "ResidualAdd": "network.blocks",
    "TransformerEncoder": "network.blocks",
    "TransformerEncoderBlock": "network.blocks",
    "chunked_attention": "network.chunked",
    "ClassificationHead": "network.head",
    "TokenPool": "network.head",
    "ViT": "network.model",
    "read_config": "network.model",
    "ClassToken": "network.patch_embed",
    "PatchEmbedding": "network.patch_embed",
    "PositionEmbedding": "network.patch_embed",
    "TokenLayout": "network.patch_embed",
    "conv_to_linear_weight": "network.patch_embed",
    "linear_to_conv_weight": "network.patch_embed",
    "Preprocessing": "preprocess",
    "open_image": "images",
    "SOURCES": "sources",
    "load_model": "sources",
    "load_vit": "modelfile",
    "read_vit_config": "modelfile",
    "save_vit": "modelfile",
    "StateDictMismatchError": "statedict",
    "Prediction": "prediction",
    "predict": "prediction",
    "PRESETS": "presets",
    "FAMILIES": "presets",
    "create_vit": "pretrained",
    "list_presets": "presets",
    "max_build_time": "base.budget",
    "max_memory": "base.budget",
    "parameter_count": "network.sizes",
    "thread_policy": "base.threads",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
