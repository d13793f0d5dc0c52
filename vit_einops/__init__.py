"""vit_einops: the Vision Transformer of Dosovitskiy et al. (2021) written with einops, read beside the paper."""

from .attention import Attend, MultiHeadAttention, attention_scores
from .blocks import FeedForwardBlock, ResidualAdd, TransformerEncoder, TransformerEncoderBlock
from .chunked import chunked_attention
from .config import ATTN_IMPLS, ViTConfig
from .head import ClassificationHead, TokenPool
from .model import ViT, set_attn_impl
from .patch_embed import ClassToken, PatchEmbedding, PositionEmbedding, conv_to_linear_weight, linear_to_conv_weight
from .presets import PRESETS, create_vit, list_presets

__version__ = "0.1.0"

__all__ = [
    "ATTN_IMPLS",
    "Attend",
    "ClassToken",
    "ClassificationHead",
    "FeedForwardBlock",
    "MultiHeadAttention",
    "PRESETS",
    "PatchEmbedding",
    "PositionEmbedding",
    "ResidualAdd",
    "TokenPool",
    "TransformerEncoder",
    "TransformerEncoderBlock",
    "ViT",
    "ViTConfig",
    "attention_scores",
    "chunked_attention",
    "conv_to_linear_weight",
    "create_vit",
    "linear_to_conv_weight",
    "list_presets",
    "set_attn_impl",
]
