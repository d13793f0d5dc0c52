"""What a full forward shows to forward hooks: independent of running the model in parts (the methods under test)."""

from __future__ import annotations

import torch

from vit_einops import ViT


def block_outputs(model: ViT, x: torch.Tensor) -> list[torch.Tensor]:
    """Every encoder block's output z_l, in order."""
    seen = []
    handles = [b.register_forward_hook(lambda m, inp, out: seen.append(out)) for b in model.blocks]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def classifier_input(model: ViT, x: torch.Tensor) -> torch.Tensor:
    """What ``head.fc`` reads: (b, head_hidden_size)."""
    seen = []
    handle = model.head.fc.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return seen[0]
