"""A pretrained ViT as a feature extractor, as the ViT course uses torchvision's vit_b_16: the representation
before the classifier, the tokens of chosen intermediate layers, and a frozen backbone under a new head.

Because ViT is an ``nn.Sequential`` (patch_embed, blocks, head), each function runs a prefix of it: no hooks,
and nothing after the requested layer is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from .._checks import check_index
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
    model.check_input(x)
    x = model.blocks(model.patch_embed(x))
    for name, stage in model.head.named_children():
        if name != "fc":
            x = stage(x)
    return x


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

    Returns: one (b, N, D) tensor per entry of ``layers``, the class token first in each.
    """
    _check_vit(model)
    if norm and model.config.fc_norm:
        raise ValueError("norm=True needs a LayerNorm on every token; this model's (fc_norm=True) follows the pooling")
    depth = len(model.blocks)
    if isinstance(layers, (int, str)) or not isinstance(layers, Sequence) or not layers:
        raise TypeError(f"layers must be a non-empty sequence of block indices, got {layers!r}")
    wanted = [check_index("layer index", i, depth, f"a ViT of depth {depth}") for i in layers]
    model.check_input(x)
    x = model.patch_embed(x)
    outputs = {}
    for i, block in enumerate(model.blocks):
        x = block(x)
        if i in wanted:
            outputs[i] = model.head.norm(x) if norm else x
        if i == max(wanted):  # the blocks after the deepest one asked for are never run
            break
    return [outputs[i] for i in wanted]


def freeze_backbone(model: ViT) -> list[str]:
    """Stop gradients everywhere but the classifier ``head.fc``; returns the names of the parameters left trainable.

    Combined with :func:`replace_head`, this is transfer learning with a frozen feature extractor (a linear probe).
    """
    _check_vit(model)
    trainable = []
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith("head.fc."))
        if param.requires_grad:
            trainable.append(name)
    return trainable


def replace_head(model: ViT, num_classes: int) -> ViT:
    """Swap the classifier for a zero-initialised D x K layer, as the paper fine-tunes (Section 3.2: "remove the
    pre-trained prediction head and attach a zero-initialized D x K feedforward layer"). A ``pre_logits`` layer is
    removed with the old head. ``model.config`` is updated (``num_classes``, ``representation_size=None``); a
    ``num_classes`` of 0 leaves no classifier (the head returns the pooled D features). Returns the model.
    """
    _check_vit(model)
    config = replace(model.config, num_classes=num_classes, representation_size=None)  # validates num_classes
    if hasattr(model.head, "pre_logits"):
        del model.head.pre_logits
    device, dtype = model.head.norm.weight.device, model.head.norm.weight.dtype
    if num_classes:
        fc = nn.Linear(config.dim, num_classes, device=device, dtype=dtype)
        nn.init.zeros_(fc.weight)
        nn.init.zeros_(fc.bias)
    else:
        fc = nn.Identity()
    model.head.fc = fc
    model.config = config
    return model
