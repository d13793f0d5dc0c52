"""Grad-CAM (Selvaraju et al. 2017) on a ViT's tokens, read through the input's token layout.

Grad-CAM weighs the channels of one layer's activations by the mean gradient of the target's score over the
spatial positions, and keeps the positive part of the weighted sum:

    w_bc = mean_{r,c} dy_b / dA_brc,        CAM_brc = ReLU(sum_c w_bc A_brc)

On a ViT, A is a block's first LayerNorm output (b, n, D), where pytorch-grad-cam's ViT tutorial hooks
(``model.blocks[-1].norm1``), read here at the probe site ``blocks.{l}.ln1.hook_normalized`` (docs/probes.md): the
patch tokens on the grid are the positions, the channels are D. pytorch-grad-cam asks the user for a
``reshape_transform`` that drops the class token and folds the rest onto a square grid, which breaks on registers,
a distillation token and non-square grids; here the input's token layout
(:class:`~vit_einops.network.patch_embed.TokenLayout`) says which tokens are prefix tokens and what the grid is, so
nothing is asked. y is the target class's logit (pytorch-grad-cam's ``ClassifierOutputTarget``) or a backbone
target's score (:mod:`vit_einops.inspect.targets`).

Axes: b images, n tokens, d channels (the model's width), gh gw the patch grid.
"""

from __future__ import annotations

from typing import Any

import torch
from einops import einsum, reduce
from torch import nn

from ..base.checks import check_index
from ..inputs import model_inputs
from ..network.probes import HookPoint, attached
from ..network.sizes import check_model_forward
from .targets import BACKBONE_TARGETS, class_targets, one_class_each, resolve_target, target_scores


def grad_cam(
    model: nn.Module, images: Any, target: Any = None, *, layer: int = -1, preprocessed: bool | None = None
) -> torch.Tensor:
    """The raw Grad-CAM of ``target`` on the patch grid (see the module docstring): before any normalisation or
    resizing, so pytorch-grad-cam's picture is this map min-max scaled and resized to the input.

    Args:
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them (``preprocessed``: how a float tensor is taken).
        target: None (each image's predicted class), a class index, one per image (b,), or a backbone target
            (:class:`~vit_einops.inspect.EmbeddingTarget`, ``ImageTarget``, ``PatchTarget``).
        layer: the block whose first LayerNorm output is A (0 is the first, -1 the last).

    The model's train/eval mode is the caller's (call ``model.eval()`` first); parameters' ``.grad`` are left
    untouched and no hook remains. Shapes: images (b, C, H, W) -> (b, gh, gw), the input's grid.
    """
    depth = len(model.blocks)
    site = model.blocks[check_index("layer", layer, depth, f"a ViT of depth {depth}")].attn.hook_normalized
    images = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, images, grad=True)
    target = resolve_target(model, target, len(images))
    kept: list[torch.Tensor] = []

    def keep(normed: torch.Tensor, hook: HookPoint) -> None:
        kept.append(normed)

    with attached([(site, keep)]), torch.enable_grad():
        # The input requires grad so the graph exists even where every weight is frozen.
        x = images.detach().requires_grad_(True)
        if isinstance(target, BACKBONE_TARGETS):
            scores = target_scores(model, x, target)[1]
        else:
            logits = model(x)
            classes = one_class_each(class_targets(target, logits.detach()), "grad_cam")
            scores = logits.gather(1, classes[:, None])[:, 0]
        (grads,) = torch.autograd.grad(scores.sum(), kept[0])  # images do not interact: one sum serves all
    layout = model.patch_embed.layout(images.shape[-2:])
    activations = layout.split(kept[0].detach(), dim=-2)[1]  # (b, gh, gw, d)
    weights = reduce(layout.split(grads, dim=-2)[1], "b gh gw d -> b d", "mean")
    return einsum(weights, activations, "b d, b gh gw d -> b gh gw").clamp(min=0)
