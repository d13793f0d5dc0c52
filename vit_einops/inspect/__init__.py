"""Look inside a ViT: record attention on any attention implementation, roll it out, weigh it by its gradient
(relevance), measure how far heads look and how spread out they are, and draw the paper's Figure 6, 7 and 11 style
plots (``vit-einops inspect``): each plot function returns a matplotlib Figure, shown inline in a notebook, and
``save_figure(fig, path)`` writes it atomically."""

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
from .relevance import attention_gradients, attention_relevance, relevance_from_gradients
from .report import write_report
from .rollout import attention_rollout, class_attention_grid, last_layer_class_attention
from .stats import attention_entropy, class_token_share, head_statistics, token_norms

__all__ = [
    "AttentionRecorder",
    "attention_entropy",
    "attention_gradients",
    "attention_matrix",
    "attention_relevance",
    "attention_rollout",
    "class_attention_grid",
    "class_token_share",
    "embedding_filter_components",
    "head_statistics",
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
    "relevance_from_gradients",
    "save_figure",
    "show_attention",
    "token_norms",
    "write_report",
]
