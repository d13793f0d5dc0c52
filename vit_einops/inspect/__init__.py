"""Look inside a ViT: record attention on any attention implementation, roll it out, weigh it by its gradient
(relevance), measure how far heads look and how spread out they are, see how much attention the prefix tokens
(class, distillation, register) take and how long the tokens grow, split a score exactly into what each head and MLP
writes (``decompose``, the logit lens, head ablation and patching), draw DINO's view (the class token's attention
and the mask keeping 60% of it) and DINOv2's PCA of the patch features, and draw the paper's Figure 6, 7 and 11
style plots (``vit-einops inspect``): each plot function returns a matplotlib Figure, shown inline in a notebook,
and ``save_figure(fig, path)`` writes it atomically. Every tool reads the tokens by the input's token layout
(``recorder.layout``, ``model.patch_embed.layout(image_size)``): the prefix tokens by name, then the patch grid.

``run_study`` computes once what both of a study's renderers draw (``write_report``'s figures and arrays, the
explorer's page): the recorded pass, every explanation method, the rollout, DINO's view, the patch PCA and a target's
relevance, as a ``Study``."""

from ..base.plot import save_figure
from .decompose import (
    Decomposition,
    ablate_heads,
    decompose,
    logit_lens,
    patch_heads,
    patch_passes,
    patch_positions,
)
from .dino import DINO_KEEP, DinoView, dino_mask, dino_view
from .distance import mean_attention_distance, patch_distances
from .embeddings import (
    embedding_filter_components,
    model_position_similarity,
    patch_embedding_matrix,
    position_similarity,
)
from .faithfulness import METRICS, Faithfulness, faithfulness
from .figures import (
    plot_attention_distance,
    plot_attention_overlays,
    plot_decomposition,
    plot_dino_view,
    plot_filters,
    plot_methods,
    plot_position_similarity,
    plot_prefix_share,
    plot_target_relevance,
    plot_token_norms,
    show_attention,
)
from .methods import METHODS, Method, explain, explain_all, token_grid
from .gradcam import grad_cam
from .integrated_gradients import Attributions, integrated_gradients
from .lrp import lrp
from .pca import PatchPCA, fit_patch_pca, patch_feature_pca, plot_patch_pca
from .record import AttentionRecorder, attention_matrix, record_attention
from .recorded import RecordedPass, record_pass
from .relevance import attention_gradients, attention_relevance, relevance_from_gradients
from .report import write_report
from .study import Study, TargetRelevance, run_study
from .targets import EmbeddingTarget, ImageTarget, PatchTarget, load_embedding, patch_similarity
from .rollout import attention_rollout, class_attention_grid, gradient_rollout, patch_attention_grid
from .stats import (
    TokenNorms,
    attention_entropy,
    head_statistics,
    prefix_token_share,
    token_norms,
)

__all__ = [
    "DINO_KEEP",
    "METHODS",
    "Method",
    "AttentionRecorder",
    "Attributions",
    "EmbeddingTarget",
    "Faithfulness",
    "METRICS",
    "ImageTarget",
    "PatchTarget",
    "Decomposition",
    "DinoView",
    "PatchPCA",
    "RecordedPass",
    "Study",
    "TargetRelevance",
    "TokenNorms",
    "ablate_heads",
    "attention_entropy",
    "attention_gradients",
    "attention_matrix",
    "attention_relevance",
    "attention_rollout",
    "class_attention_grid",
    "decompose",
    "dino_mask",
    "dino_view",
    "embedding_filter_components",
    "explain",
    "explain_all",
    "faithfulness",
    "fit_patch_pca",
    "grad_cam",
    "gradient_rollout",
    "head_statistics",
    "integrated_gradients",
    "load_embedding",
    "logit_lens",
    "lrp",
    "mean_attention_distance",
    "model_position_similarity",
    "patch_attention_grid",
    "patch_distances",
    "patch_heads",
    "patch_passes",
    "patch_positions",
    "patch_similarity",
    "patch_embedding_matrix",
    "patch_feature_pca",
    "plot_attention_distance",
    "plot_attention_overlays",
    "plot_decomposition",
    "plot_dino_view",
    "plot_filters",
    "plot_methods",
    "plot_patch_pca",
    "plot_position_similarity",
    "plot_prefix_share",
    "plot_target_relevance",
    "plot_token_norms",
    "position_similarity",
    "prefix_token_share",
    "record_attention",
    "record_pass",
    "relevance_from_gradients",
    "run_study",
    "save_figure",
    "show_attention",
    "token_grid",
    "token_norms",
    "write_report",
]
