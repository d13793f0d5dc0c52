"""Look inside a ViT: record attention on any attention implementation, roll it out, measure how far heads
look, and draw the paper's Figure 6, 7 and 11 style plots (``vit-einops inspect``): each plot function returns a
matplotlib Figure, shown inline in a notebook, and ``save_figure(fig, path)`` writes it atomically."""

from .._plot import save_figure
from .distance import mean_attention_distance, patch_distances
from .embeddings import embedding_filter_components, patch_embedding_matrix, position_similarity
from .figures import (
    plot_attention_distance,
    plot_attention_overlays,
    plot_filters,
    plot_position_similarity,
    show_attention,
)
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
    "plot_attention_distance",
    "plot_attention_overlays",
    "plot_filters",
    "plot_position_similarity",
    "position_similarity",
    "record_attention",
    "save_figure",
    "show_attention",
    "write_report",
]
