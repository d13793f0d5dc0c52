"""A pretrained ViT as a feature extractor, as the ViT course uses torchvision's vit_b_16: the representation
before the classifier, the tokens of chosen intermediate layers, and a frozen backbone under a new head.

Thin functional wrappers over the model's own methods (``forward_head(..., pre_logits=True)``,
``forward_intermediates``, ``freeze_backbone``, ``reset_classifier``), which need no extra installed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._checks import check_index, check_nonnegative_int
from ..model import ViT


def _check_vit(model: ViT) -> None:
    if not isinstance(model, ViT):
        raise TypeError(f"expected a vit_einops.ViT, got {type(model).__name__}")


def pre_logits(model: ViT, x: torch.Tensor) -> torch.Tensor:
    """The image representation the classifier reads: y = LN(z_L^0) (Eq. 4, or the mean of the patch tokens with
    ``pool="mean"``), through the tanh ``pre_logits`` layer when the model has one.

    Shapes: (b, C, H, W) -> (b, D), or (b, representation_size).
    """
    _check_vit(model)
    return model.forward_head(model.forward_features(x), pre_logits=True)


def intermediate_layers(
    model: ViT, x: torch.Tensor, layers: Sequence[int], *, norm: bool = False
) -> list[torch.Tensor]:
    """All tokens z_l of the encoder blocks in ``layers`` (0-based; -1 is the last block), in the order asked.

    Args:
        model: a ViT.
        x: (b, C, H, W) images.
        layers: block indices; negative ones count from the end, as in Python.
        norm: apply the final LayerNorm (``head.norm``) to each, as timm's ``get_intermediate_layers`` can; not for
            a model with ``fc_norm``, whose final LayerNorm acts on the pooled vector, not on tokens.

    Returns: one (b, N, D) tensor per entry of ``layers``, the class token first in each. Blocks after the deepest
    one asked for are not run.
    """
    _check_vit(model)
    depth = len(model.blocks)
    if isinstance(layers, (int, str)) or not isinstance(layers, Sequence) or not layers:
        raise TypeError(f"layers must be a non-empty sequence of block indices, got {layers!r}")
    wanted = [check_index("layer index", i, depth, f"a ViT of depth {depth}") for i in layers]
    taken = sorted(set(wanted))
    pairs = model.forward_intermediates(
        x, taken, return_prefix_tokens=True, norm=norm, stop_early=True, output_fmt="NLC", intermediates_only=True
    )
    tokens = {i: torch.cat([prefix, patches], dim=1) for i, (patches, prefix) in zip(taken, pairs, strict=True)}
    return [tokens[i] for i in wanted]


def freeze_backbone(model: ViT) -> list[str]:
    """:meth:`ViT.freeze_backbone`: stop gradients everywhere but ``head.fc``; returns the trainable names."""
    _check_vit(model)
    return model.freeze_backbone()


def replace_head(model: ViT, num_classes: int) -> ViT:
    """Swap the whole pre-trained head's layers for a zero-initialised D x K classifier, as the paper fine-tunes
    (Section 3.2: "remove the pre-trained prediction head and attach a zero-initialized D x K feedforward layer"):
    a tanh ``pre_logits`` layer goes too, then :meth:`ViT.reset_classifier`. A ``num_classes`` of 0 leaves no
    classifier (the head returns the pooled D features). Returns the model.
    """
    _check_vit(model)
    num_classes = check_nonnegative_int("num_classes", num_classes)  # before anything is removed
    if "pre_logits" in model.head._modules:
        del model.head.pre_logits
    model.reset_classifier(num_classes)
    return model
