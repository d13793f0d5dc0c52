"""vit_einops: the Vision Transformer of Dosovitskiy et al. (2021) written with einops, read beside the paper.

Names load on first use (PEP 562): ``import vit_einops`` and the command line's ``--help`` do not import torch.
"""

from __future__ import annotations

from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ATTN_IMPLS": "config",
    "ViTConfig": "config",
    "Attend": "attention",
    "MultiHeadAttention": "attention",
    "attention_scores": "attention",
    "set_attn_impl": "attention",
    "FeedForwardBlock": "blocks",
    "ResidualAdd": "blocks",
    "TransformerEncoder": "blocks",
    "TransformerEncoderBlock": "blocks",
    "chunked_attention": "chunked",
    "ClassificationHead": "head",
    "TokenPool": "head",
    "ViT": "model",
    "read_config": "model",
    "ClassToken": "patch_embed",
    "PatchEmbedding": "patch_embed",
    "PositionEmbedding": "patch_embed",
    "TokenLayout": "patch_embed",
    "conv_to_linear_weight": "patch_embed",
    "linear_to_conv_weight": "patch_embed",
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
    "max_build_time": "_budget",
    "max_memory": "_budget",
    "parameter_count": "sizes",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
