"""An interactive attention explorer: one self-contained HTML page per model and handful of images
(``vit-einops explore``). Pick a layer and head, click a patch, and see its row of A over the image, beside the
rollout, the gradient-weighted relevance and per-head statistics by layer."""

from .page import write_explorer

__all__ = ["write_explorer"]
