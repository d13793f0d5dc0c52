"""A ViT at a new resolution (paper, Section 3.2): the same weights, E_pos's patch rows interpolated to the new
patch grid (:func:`vit_einops.network.patch_embed.resample_pos_embed`, in the convention of the library the weights were
trained with: "torchvision", "timm" or "hf"), the prefix tokens' rows kept as they are."""

from __future__ import annotations

from ..base.checks import to_pair
from ..network.config import ViTConfig
from ..network.model import ViT
from ..network.patch_embed import RESAMPLE_MODES, resample_pos_embed
from ..statedict import build_vit

__all__ = ["RESAMPLE_MODES", "resample_pos_embed", "resample_vit"]


def resample_vit(model: ViT, image_size: int | tuple[int, int], *, mode: str = "timm") -> ViT:
    """A new ViT for ``image_size`` with ``model``'s weights, its position embedding resampled to the new patch grid.

    The patch size stays; ``image_size`` must be divisible by it. ``model`` is left unchanged.
    """
    if not isinstance(model, ViT):
        raise TypeError(f"resample_vit expects a vit_einops.ViT, got {type(model).__name__}")
    config = ViTConfig.from_dict({**model.config.to_dict(), "image_size": list(to_pair("image_size", image_size))})
    state_dict = model.state_dict()
    key = "patch_embed.pos_embed.weight"
    prefix = config.num_prefix_tokens if config.pos_embed_prefix else 0  # rows copied unchanged
    state_dict[key] = resample_pos_embed(
        state_dict[key], config.grid_size, model.config.grid_size, num_prefix_tokens=prefix, mode=mode
    )
    return build_vit(config, state_dict, model.attn_impl).train(model.training)
