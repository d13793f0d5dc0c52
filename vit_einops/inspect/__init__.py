"""Look inside a ViT: record attention on any attention implementation, roll it out, measure how far heads
look, and draw the paper's Figure 6, 7 and 11 style plots (``vit-einops inspect``)."""

from .distance import mean_attention_distance, patch_distances
from .embeddings import embedding_filter_components, patch_embedding_matrix, position_similarity
from .record import AttentionRecorder, attention_matrix, record_attention
from .report import write_report
from .rollout import attention_rollout, class_attention_grid, last_layer_class_attention

__all__ = [
    "AttentionRecorder",
    "attention_matrix",
    "attention_rollout",
    "class_attention_grid",
    "embedding_filter_components",
    "last_layer_class_attention",
    "mean_attention_distance",
    "patch_distances",
    "patch_embedding_matrix",
    "position_similarity",
    "record_attention",
    "write_report",
]
