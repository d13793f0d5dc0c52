"""Eq. 1: z_0 = [x_class; x_p^1 E; ...; x_p^N' E] + E_pos, then dropout (Appendix B.1)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from ._init import trunc_normal_
from ._sequential import Sequential
from .config import ViTConfig, check_config

# ViT's own init for the class token and positions (timm, torchvision): a small truncated normal.
EMBED_INIT_STD = 0.02


class ClassToken(nn.Module):
    """Prepends the learnable x_class to the patch tokens: (b, n, D) -> (b, n + 1, D).

    Kept as a module with a ``weight`` so tools that count module weights (torchsummary) see it.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, 1, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cls = repeat(self.weight, "1 1 d -> b 1 d", b=x.shape[0])
        return torch.cat([cls, x], dim=1)


class RegisterTokens(nn.Module):
    """Inserts R learnable register tokens after the class token, before the patches (Darcet et al. 2024):
    (b, 1 + n, D) -> (b, 1 + R + n, D). Kept as a module with a ``weight`` (1, R, D), as :class:`ClassToken`."""

    def __init__(self, count: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, count, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        registers = repeat(self.weight, "1 r d -> b r d", b=x.shape[0])
        return torch.cat([x[:, :1], registers, x[:, 1:]], dim=1)

    def extra_repr(self) -> str:
        return f"count={self.weight.shape[1]}"


class PositionEmbedding(nn.Module):
    """Adds the learnable 1-D E_pos in R^{N x D} (class token's row first): (b, N, D) -> (b, N, D)."""

    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, num_tokens, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight


def conv_to_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """Conv2d kernel (D, C, p1, p2) -> the paper's E^T as a Linear weight (D, p1*p2*C)."""
    return rearrange(weight, "d c p1 p2 -> d (p1 p2 c)")


def linear_to_conv_weight(weight: torch.Tensor, in_channels: int, patch_size: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`conv_to_linear_weight`."""
    return rearrange(weight, "d (p1 p2 c) -> d c p1 p2", c=in_channels, p1=patch_size[0], p2=patch_size[1])


class PatchEmbedding(Sequential):
    """Image to tokens, Eq. 1.

    patchify="conv": ``proj`` = Conv2d(C, D, kernel=stride=P), then ``flatten`` 'b d h w -> b (h w) d'.
    patchify="linear": ``to_patches`` 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', then ``proj`` = Linear(P^2 C, D),
    the matrix E of Eq. 1 literally. Both compute the same map (see :func:`conv_to_linear_weight`).
    Then ``cls_token`` prepends x_class, ``reg_token`` inserts the ``register_tokens`` after it (when there are
    any), ``pos_embed`` adds E_pos, ``dropout`` follows the addition. With ``pos_embed_prefix=False`` E_pos has the
    patches' rows only and is added before the prefix tokens come (timm's no_embed_class). Reads ``image_size``,
    ``patch_size``, ``in_channels``, ``dim``, ``dropout``, ``patchify``, ``register_tokens`` and
    ``pos_embed_prefix`` of its :class:`ViTConfig`.

    Shapes: (b, C, H, W) -> (b, N' + 1 + R, D).
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "PatchEmbedding")
        c, dim, (ph, pw) = config.in_channels, config.dim, config.patch_size
        if config.patchify == "conv":
            proj = nn.Conv2d(c, dim, kernel_size=config.patch_size, stride=config.patch_size)
            stages = [("proj", proj), ("flatten", Rearrange("b d h w -> b (h w) d"))]
        else:
            proj = nn.Linear(c * ph * pw, dim)
            stages = [("to_patches", Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=ph, p2=pw)), ("proj", proj)]
        # LeCun normal on the patch projection, as torchvision does (fan_in = C * P^2), in either form.
        trunc_normal_(proj.weight, (c * ph * pw) ** -0.5)
        nn.init.zeros_(proj.bias)
        prefix = [("cls_token", ClassToken(dim))]
        if config.register_tokens:
            prefix.append(("reg_token", RegisterTokens(config.register_tokens, dim)))
        position = [("pos_embed", PositionEmbedding(config.num_pos_tokens, dim))]
        stages += prefix + position if config.pos_embed_prefix else position + prefix
        stages.append(("dropout", nn.Dropout(config.dropout)))
        super().__init__(OrderedDict(stages))
        self.image_size, self.patch_size, self.grid_size = config.image_size, config.patch_size, config.grid_size
        self.patchify, self.in_channels = config.patchify, c

    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid (gh, gw) of an input of ``image_size`` (H, W): the tokens after the prefix form it."""
        (h, w), (ph, pw) = image_size, self.patch_size
        return (h // ph, w // pw)

