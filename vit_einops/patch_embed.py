"""Eq. 1: z_0 = [x_class; x_p^1 E; ...; x_p^N' E] + E_pos, then dropout (Appendix B.1)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from ._budget import check_memory
from ._checks import check_choice, check_nonnegative_int, to_pair
from ._init import trunc_normal_
from ._sequential import Sequential
from .config import ViTConfig, check_config

# ViT's own init for the class token and positions (timm, torchvision): a small truncated normal.
EMBED_INIT_STD = 0.02


class PrefixTokens(nn.Module):
    """Inserts ``count`` learned tokens after the first ``after`` tokens: (b, n, D) -> (b, n + count, D).

    Kept as a module with a ``weight`` (1, count, D) so tools that count module weights (torchsummary) see it.
    """

    def __init__(self, count: int, dim: int, after: int = 0) -> None:
        super().__init__()
        self.after = after
        self.weight = nn.Parameter(torch.empty(1, count, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = repeat(self.weight, "1 r d -> b r d", b=x.shape[0])
        return torch.cat([x[:, : self.after], tokens, x[:, self.after :]], dim=1)


class ClassToken(PrefixTokens):
    """Prepends the learnable x_class of Eq. 1 to the patch tokens: (b, n, D) -> (b, n + 1, D)."""

    def __init__(self, dim: int) -> None:
        super().__init__(1, dim, after=0)


class DistillationToken(PrefixTokens):
    """DeiT's distillation token (Touvron et al. 2021), inserted right after the class token:
    (b, 1 + n, D) -> (b, 2 + n, D). The head's second classifier ``fc_dist`` reads its final state."""

    def __init__(self, dim: int) -> None:
        super().__init__(1, dim, after=1)


class RegisterTokens(PrefixTokens):
    """Inserts R learnable register tokens after the ``after`` tokens before them (the class token), before the
    patches (Darcet et al. 2024): (b, after + n, D) -> (b, after + R + n, D)."""

    def __init__(self, count: int, dim: int, after: int = 1) -> None:
        super().__init__(count, dim, after=after)

    def extra_repr(self) -> str:
        return f"count={self.weight.shape[1]}"


# F.interpolate arguments of each library's way to resample E_pos (see resample_pos_embed).
RESAMPLE_MODES: dict[str, dict[str, Any]] = {
    "torchvision": dict(mode="bicubic", align_corners=True, antialias=False),
    "timm": dict(mode="bicubic", align_corners=False, antialias=True),
    "hf": dict(mode="bicubic", align_corners=False, antialias=False),
}


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: int | tuple[int, int],
    old_grid: int | tuple[int, int] | None = None,
    *,
    num_prefix_tokens: int = 1,
    mode: str = "timm",
) -> torch.Tensor:
    """Interpolate the patch rows of a position embedding to a new patch grid (paper, Section 3.2: "2D
    interpolation of the pre-trained position embeddings, according to their location in the original image").

    The libraries all interpolate bicubically, but not identically (:data:`RESAMPLE_MODES`):
    - "torchvision" (``interpolate_embeddings``): ``align_corners=True``: the corner patches keep their embeddings
      exactly, the grid is stretched between them;
    - "timm" (``resample_abs_pos_embed``, also HF's Dinov2WithRegisters): ``align_corners=False``,
      ``antialias=True``: pixel-centre sampling, and a low-pass filter when shrinking the grid;
    - "hf" (``interpolate_pos_encoding`` of HF's ViT, DeiT, DINOv2, CLIP, SigLIP): ``align_corners=False``, no
      antialiasing.

    Args:
        pos_embed: (1, prefix + gh * gw, D), the ``num_prefix_tokens`` rows (the class token's) first,
            then the patch rows in row-major (h w) order.
        new_grid: (gh', gw') patches, or an int for a square grid.
        old_grid: (gh, gw) of ``pos_embed``; by default the patch rows are assumed to form a square.
        num_prefix_tokens: rows copied unchanged (1: the class token).
        mode: "torchvision", "timm" or "hf".

    Returns: (1, prefix + gh' * gw', D) in ``pos_embed``'s dtype; ``pos_embed`` itself when the grid is unchanged.
    Interpolation runs in float32 at least, as every library does (bicubic in half precision shifts the values).
    """
    options = RESAMPLE_MODES[check_choice("resample mode", mode, RESAMPLE_MODES)]
    if not isinstance(pos_embed, torch.Tensor) or pos_embed.ndim != 3 or pos_embed.shape[0] != 1:
        got = tuple(pos_embed.shape) if isinstance(pos_embed, torch.Tensor) else type(pos_embed).__name__
        raise ValueError(f"pos_embed must be a (1, N, D) tensor, got {got}")
    check_nonnegative_int("num_prefix_tokens", num_prefix_tokens)
    new_grid = to_pair("new_grid", new_grid)
    num_patches = pos_embed.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = round(max(num_patches, 0) ** 0.5)
        if num_patches <= 0 or side * side != num_patches:
            raise ValueError(f"pos_embed has {num_patches} patch rows, not a square grid; pass old_grid=(gh, gw)")
        old_grid = (side, side)
    old_grid = to_pair("old_grid", old_grid)
    if old_grid[0] * old_grid[1] != num_patches:
        raise ValueError(
            f"old_grid {old_grid} has {old_grid[0] * old_grid[1]} cells, pos_embed {num_patches} patch rows"
        )
    if new_grid == old_grid:
        return pos_embed
    # The new rows in float32 for the interpolation, in pos_embed's dtype, and once more concatenated.
    rows, dim = new_grid[0] * new_grid[1], pos_embed.shape[2]
    check_memory(
        rows * dim * (4 + 2 * pos_embed.element_size()),
        f"resampling the position embedding to a {new_grid[0]}x{new_grid[1]} grid ({rows:,} rows of {dim})",
    )
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    grid = rearrange(patches, "1 (h w) d -> 1 d h w", h=old_grid[0], w=old_grid[1])
    compute_dtype = torch.promote_types(grid.dtype, torch.float32)
    grid = F.interpolate(grid.to(compute_dtype), size=new_grid, **options).to(pos_embed.dtype)
    return torch.cat([prefix, rearrange(grid, "1 d h w -> 1 (h w) d")], dim=1)


class PositionEmbedding(nn.Module):
    """Adds the learnable 1-D E_pos in R^{rows x D}: (b, rows, D) -> (b, rows, D). Its rows are the ``prefix``
    tokens' (the class token's first, when E_pos covers them) then the patches' of ``grid`` in row-major order.

    With ``dynamic`` ("timm" or "hf") an input of another patch grid gets E_pos resampled to it as that library
    does (:func:`resample_pos_embed`); without, the caller (ViT.check_input) admits the training size only.
    """

    def __init__(
        self, rows: int, dim: int, grid: tuple[int, int] = (0, 0), prefix: int = 0, dynamic: str | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, rows, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)
        self.grid, self.prefix, self.dynamic = grid, prefix, dynamic

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        if grid is None or grid == self.grid or self.dynamic is None:
            return x + self.weight
        return x + resample_pos_embed(self.weight, grid, self.grid, num_prefix_tokens=self.prefix, mode=self.dynamic)

    def extra_repr(self) -> str:
        return f"dynamic={self.dynamic!r}" if self.dynamic else ""


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
    Then ``cls_token`` prepends x_class, ``dist_token`` inserts DeiT's distillation token after it,
    ``reg_token`` the ``register_tokens`` after those (each when the config has it), ``pos_embed`` adds E_pos,
    ``dropout`` follows the addition, and ``norm_pre`` (CLIP's pre-norm) closes. With ``pos_embed_prefix=False``
    E_pos has the patches' rows only and is added before the prefix tokens come (timm's no_embed_class).

    Shapes: (b, C, H, W) -> (b, N' + prefix tokens, D); with ``dynamic_size`` any H, W divisible by P.
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "PatchEmbedding")
        c, dim, (ph, pw) = config.in_channels, config.dim, config.patch_size
        bias = config.patch_bias
        if config.patchify == "conv":
            proj = nn.Conv2d(c, dim, kernel_size=config.patch_size, stride=config.patch_size, bias=bias)
            stages = [("proj", proj), ("flatten", Rearrange("b d h w -> b (h w) d"))]
        else:
            proj = nn.Linear(c * ph * pw, dim, bias=bias)
            stages = [("to_patches", Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=ph, p2=pw)), ("proj", proj)]
        # LeCun normal on the patch projection, as torchvision does (fan_in = C * P^2), in either form.
        trunc_normal_(proj.weight, (c * ph * pw) ** -0.5)
        if bias:
            nn.init.zeros_(proj.bias)
        prefix = []
        if config.class_token:
            prefix.append(("cls_token", ClassToken(dim)))
        if config.distill_token:
            prefix.append(("dist_token", DistillationToken(dim)))
        if config.register_tokens:
            prefix.append(("reg_token", RegisterTokens(config.register_tokens, dim, after=len(prefix))))
        rows_before = config.num_prefix_tokens if config.pos_embed_prefix else 0
        pos = PositionEmbedding(config.num_pos_tokens, dim, config.grid_size, rows_before, config.dynamic_size)
        position = [("pos_embed", pos)]
        stages += prefix + position if config.pos_embed_prefix else position + prefix
        stages.append(("dropout", nn.Dropout(config.dropout)))
        if config.pre_norm:
            stages.append(("norm_pre", nn.LayerNorm(dim, eps=config.layer_norm_eps)))
        super().__init__(OrderedDict(stages))
        self.image_size, self.patch_size, self.grid_size = config.image_size, config.patch_size, config.grid_size
        self.patchify, self.in_channels = config.patchify, c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.grid_for(x.shape[-2:])  # E_pos is resampled for it when the model has dynamic_size
        for name, stage in self.named_children():
            x = stage(x, grid) if name == "pos_embed" else stage(x)
        return x

    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid (gh, gw) of an input of ``image_size`` (H, W): the tokens after the prefix form it."""
        (h, w), (ph, pw) = image_size, self.patch_size
        return (h // ph, w // pw)

