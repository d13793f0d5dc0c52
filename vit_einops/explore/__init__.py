"""An interactive attention explorer: one self-contained HTML page per model, or per two models side by side, and
handful of images (``vit-einops explore``). Pick a layer and head, click a patch or a prefix token (class,
distillation, register), and see its row of A over the image with the prefix tokens' shares beside it, DINO's
60% mask of the last layer's class-token attention, the rollout, the gradient-weighted relevance, token norms
and per-head statistics by layer."""

from .page import write_explorer

__all__ = ["write_explorer"]
