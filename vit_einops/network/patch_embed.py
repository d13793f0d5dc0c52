"""Eq. 1: z_0 = [x_class; x_p^1 E; ...; x_p^N' E] + E_pos, then dropout (Appendix B.1)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from ..base.budget import check_memory
from ..base.checks import (
    check_bool,
    check_choice,
    check_grid,
    check_nonnegative_int,
    check_patch_grid,
    check_probability,
    check_size,
    to_pair,
)
from ..base.init import trunc_normal_
from ..base.sequential import Sequential, forward_takes
from .config import DYNAMIC_SIZES, PATCHIFY, ViTConfig, check_config, check_float32
from .probes import HookPoint

# What naming one token costs Python ("reg123", its tuple slot), for the budget of a layout's names.
NAME_BYTES = 72

# ViT's own init for the class token and positions (timm, torchvision): a small truncated normal.
EMBED_INIT_STD = 0.02


@dataclass(frozen=True)
class TokenLayout:
    """The tokens the encoder sees for one input: the prefix tokens, then the gh x gw patches in row-major order,
    so patch (r, c) is token ``num_prefix + r * gw + c``. Rows and columns of every attention map, token norm and
    relevance follow it. Made by the patch embedding: ``model.patch_embed.layout(image_size)``, or the recorders'
    ``.layout``.

    Args:
        prefix: the prefix tokens' names in token order: ("cls",) in the paper, ("cls", "dist") in DeiT,
            ("cls", "reg1", ..., "regR") with registers, () without a class token (SigLIP).
        grid: (gh, gw), the patch grid of this input: the config's at its image_size, another with dynamic_size.
    """

    prefix: tuple[str, ...]
    grid: tuple[int, int]

    def __post_init__(self) -> None:
        names = self.prefix
        if isinstance(names, str) or not isinstance(names, (tuple, list)):
            raise TypeError(f"prefix must be a tuple of token names such as ('cls', 'reg1'), got {names!r}")
        if not all(isinstance(name, str) and name for name in names) or len(set(names)) != len(names):
            raise ValueError(f"prefix must be distinct non-empty names, got {tuple(names)!r}")
        object.__setattr__(self, "prefix", tuple(names))
        object.__setattr__(self, "grid", check_grid("grid", self.grid))

    @property
    def num_prefix(self) -> int:
        """P, the tokens before the patches (timm's ``num_prefix_tokens``)."""
        return len(self.prefix)

    @property
    def num_patches(self) -> int:
        """N' = gh * gw."""
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        """N = P + N'."""
        return self.num_prefix + self.num_patches

    @property
    def patches(self) -> slice:
        """The patch tokens' indices: ``x[:, layout.patches]``."""
        return slice(self.num_prefix, self.num_tokens)

    def index(self, name: str) -> int:
        """The position of the prefix token ``name`` ("cls", "dist", "reg2"), or a ValueError listing them."""
        if name not in self.prefix:
            raise ValueError(f"no {name!r} token here: the prefix tokens are {self.shown()}")
        return self.prefix.index(name)

    def shown(self) -> str:
        """The prefix tokens' names for a message: all of them, or the first eight and how many follow."""
        more = len(self.prefix) - 8
        return repr(self.prefix) if more <= 0 else f"({', '.join(map(repr, self.prefix[:8]))}, ... {more:,} more)"

    def labels(self) -> tuple[str, ...]:
        """A name for each of the N tokens, in order: the prefix tokens', then "patch (r, c)"."""
        check_memory(self.num_tokens * NAME_BYTES, f"naming {self.num_tokens:,} tokens")
        patches = (f"patch ({r}, {c})" for r in range(self.grid[0]) for c in range(self.grid[1]))
        return self.prefix + tuple(patches)

    def check(self, tokens: int) -> None:
        """ValueError unless ``tokens`` is this layout's N."""
        if tokens != self.num_tokens:
            (gh, gw), p = self.grid, self.num_prefix
            raise ValueError(
                f"{tokens} tokens do not fit the layout of {p} prefix tokens {self.shown()} and a {gh}x{gw} patch grid "
                f"({p} + {gh * gw} = {self.num_tokens}); pass the layout of the input the tokens came from "
                "(recorder.layout, model.patch_embed.layout(image_size))"
            )

    def split(self, x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """(prefix tokens, patches on the grid): (..., N, ...) along ``dim`` -> (..., P, ...), (..., gh, gw, ...)."""
        self.check(x.shape[dim])
        prefix, patches = x.split([self.num_prefix, self.num_patches], dim)
        return prefix, patches.unflatten(dim, self.grid)


class PrefixTokens(nn.Module):
    """Inserts ``count`` learned tokens after the first ``after`` tokens: (b, n, D) -> (b, n + count, D).

    Kept as a module with a ``weight`` (1, count, D) so tools that count module weights (torchsummary) see it.
    ``names()`` are the tokens' names in the :class:`TokenLayout`.
    """

    NAME = "token"
    NUMBERED = False  # NAME1..NAMEr even for one token (registers); otherwise only for several

    def __init__(self, count: int, dim: int, after: int = 0) -> None:
        super().__init__()
        self.after = after
        self.weight = nn.Parameter(torch.empty(1, count, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = repeat(self.weight, "1 r d -> b r d", b=x.shape[0])
        return torch.cat([x[:, : self.after], tokens, x[:, self.after :]], dim=1)

    def names(self) -> tuple[str, ...]:
        """``NAME`` for one token, else ``NAME1``..``NAMEr``, made within the memory budget."""
        count = self.weight.shape[1]
        if count == 1 and not self.NUMBERED:
            return (self.NAME,)
        check_memory(count * NAME_BYTES, f"naming {count:,} {self.NAME} tokens")
        return tuple(f"{self.NAME}{i + 1}" for i in range(count))


class ClassToken(PrefixTokens):
    """Prepends the learnable x_class of Eq. 1 to the patch tokens: (b, n, D) -> (b, n + 1, D)."""

    NAME = "cls"

    def __init__(self, dim: int) -> None:
        super().__init__(1, dim, after=0)


class DistillationToken(PrefixTokens):
    """DeiT's distillation token (Touvron et al. 2021), inserted right after the class token:
    (b, 1 + n, D) -> (b, 2 + n, D). The head's second classifier ``fc_dist`` reads its final state."""

    NAME = "dist"

    def __init__(self, dim: int) -> None:
        super().__init__(1, dim, after=1)


class RegisterTokens(PrefixTokens):
    """Inserts R learnable register tokens after the ``after`` tokens before them (the class token), before the
    patches (Darcet et al. 2024): (b, after + n, D) -> (b, after + R + n, D); named "reg1".."regR"."""

    NAME, NUMBERED = "reg", True

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
    return _resampled(pos_embed, new_grid, old_grid, num_prefix_tokens, options)


def _resampled(
    pos_embed: torch.Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int], prefix: int, options: dict
) -> torch.Tensor:
    """resample_pos_embed's interpolation alone, of arguments already checked: what a forward pass of a
    ``dynamic_size`` model runs (its E_pos is its own, the grid that of a checked input, budgeted with the rest of
    its activations by :func:`~vit_einops.network.sizes.check_model_forward`)."""
    prefix, patches = pos_embed[:, :prefix], pos_embed[:, prefix:]
    grid = rearrange(patches, "1 (h w) d -> 1 d h w", h=old_grid[0], w=old_grid[1])
    compute_dtype = torch.promote_types(grid.dtype, torch.float32)
    grid = F.interpolate(grid.to(compute_dtype), size=new_grid, **options).to(pos_embed.dtype)
    return torch.cat([prefix, rearrange(grid, "1 d h w -> 1 (h w) d")], dim=1)


class PositionEmbedding(nn.Module):
    """Adds the learnable 1-D E_pos in R^{rows x D}: (b, rows, D) -> (b, rows, D). Its rows are the ``prefix``
    tokens' (the class token's first, when E_pos covers them) then the patches' of ``grid`` in row-major order.

    With ``dynamic`` ("timm" or "hf") an input of another patch grid gets E_pos resampled to it as that library
    does (:func:`resample_pos_embed`); without, the caller (ViT.check_input) admits the training size only.

    Probe sites: ``hook_embed``, the tokens E_pos is added to (b, rows, D), and ``hook_pos_embed``, E_pos as added
    (1, rows, D), resampled for the input's grid.
    """

    def __init__(
        self, rows: int, dim: int, grid: tuple[int, int] = (0, 0), prefix: int = 0, dynamic: str | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, rows, dim))
        trunc_normal_(self.weight, EMBED_INIT_STD)
        self.grid, self.prefix, self.dynamic = grid, prefix, dynamic
        self.hook_embed = HookPoint("(b, rows, D)")
        self.hook_pos_embed = HookPoint("(1, rows, D)")

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        pos = self.weight
        if grid is not None and grid != self.grid and self.dynamic is not None:
            pos = _resampled(pos, grid, self.grid, self.prefix, RESAMPLE_MODES[self.dynamic])
        return self.hook_embed(x) + self.hook_pos_embed(pos)

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
    ``reg_token`` the ``register_tokens`` after those (each when asked for), ``pos_embed`` adds E_pos,
    ``dropout`` follows the addition, and ``norm_pre`` (CLIP's pre-norm) closes. With ``pos_embed_prefix=False``
    E_pos has the patches' rows only and is added before the prefix tokens come (timm's no_embed_class).

    Built alone as ``PatchEmbedding(224, 16, 3, 768)`` (the paper's ViT-B/16); the model builds it with
    :meth:`from_config`.

    Args:
        image_size: (H, W) of the input, or an int for a square image.
        patch_size: (p1, p2), or an int P for square patches; each side of the image a whole number of them.
        in_channels: C.
        dim: D, the width of the tokens.
        patchify: "conv" or "linear", as above.
        bias: the bias of ``proj`` (CLIP has none).
        class_token: x_class (False for SigLIP).
        distill_token: DeiT's distillation token after the class token (needs ``class_token``).
        register_tokens: R learned tokens after those, before the patches (Darcet et al. 2024).
        pos_embed_prefix: E_pos covers the prefix tokens too (the paper); False gives the patches alone positions.
        dropout: after the addition of E_pos (Appendix B.1).
        pre_norm: a LayerNorm ``norm_pre`` on z_0 (CLIP's ln_pre), with epsilon ``layer_norm_eps``.
        dynamic_size: None (inputs of ``image_size`` only), or "timm" or "hf": any multiple of the patch size, E_pos
            resampled as that library does (:func:`resample_pos_embed`).

    Shapes: (b, C, H, W) -> (b, N' + prefix tokens, D); with ``dynamic_size`` any H, W divisible by P.
    """

    def __init__(
        self,
        image_size: int | tuple[int, int],
        patch_size: int | tuple[int, int],
        in_channels: int,
        dim: int,
        *,
        patchify: str = "conv",
        bias: bool = True,
        class_token: bool = True,
        distill_token: bool = False,
        register_tokens: int = 0,
        pos_embed_prefix: bool = True,
        dropout: float = 0.0,
        pre_norm: bool = False,
        layer_norm_eps: float = 1e-6,
        dynamic_size: str | None = None,
    ) -> None:
        image_size, patch_size = check_patch_grid(image_size, patch_size)
        c, dim, (ph, pw) = check_size("in_channels", in_channels), check_size("dim", dim), patch_size
        flags = dict(bias=bias, class_token=class_token, distill_token=distill_token,
                     pos_embed_prefix=pos_embed_prefix, pre_norm=pre_norm)  # fmt: skip
        for name, value in flags.items():
            check_bool(name, value)
        if distill_token and not class_token:
            raise ValueError("distill_token needs the class token (it goes right after it), but class_token is False")
        register_tokens = check_size("register_tokens", register_tokens, positive=False)
        dropout = check_probability("dropout", dropout)
        layer_norm_eps = check_float32("layer_norm_eps", layer_norm_eps)
        if dynamic_size is not None:
            check_choice("dynamic_size", dynamic_size, DYNAMIC_SIZES)
        if check_choice("patchify", patchify, PATCHIFY) == "conv":
            proj = nn.Conv2d(c, dim, kernel_size=patch_size, stride=patch_size, bias=bias)
            stages = [("proj", proj), ("flatten", Rearrange("b d h w -> b (h w) d"))]
        else:
            proj = nn.Linear(c * ph * pw, dim, bias=bias)
            stages = [("to_patches", Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=ph, p2=pw)), ("proj", proj)]
        # LeCun normal on the patch projection, as torchvision does (fan_in = C * P^2), in either form.
        trunc_normal_(proj.weight, (c * ph * pw) ** -0.5)
        if bias:
            nn.init.zeros_(proj.bias)
        prefix = []
        if class_token:
            prefix.append(("cls_token", ClassToken(dim)))
        if distill_token:
            prefix.append(("dist_token", DistillationToken(dim)))
        if register_tokens:
            prefix.append(("reg_token", RegisterTokens(register_tokens, dim, after=len(prefix))))
        grid = (image_size[0] // ph, image_size[1] // pw)
        rows_before = class_token + distill_token + register_tokens if pos_embed_prefix else 0
        pos = PositionEmbedding(rows_before + grid[0] * grid[1], dim, grid, rows_before, dynamic_size)
        position = [("pos_embed", pos)]
        stages += prefix + position if pos_embed_prefix else position + prefix
        stages.append(("dropout", nn.Dropout(dropout)))
        if pre_norm:
            stages.append(("norm_pre", nn.LayerNorm(dim, eps=layer_norm_eps)))
        super().__init__(OrderedDict(stages))
        self.image_size, self.patch_size, self.grid_size = image_size, patch_size, grid
        self.hook_image = HookPoint("(b, C, H, W)")
        self.patchify, self.in_channels = patchify, c

    @classmethod
    def from_config(cls, config: ViTConfig) -> PatchEmbedding:
        """The patch embedding of ``config``: its image, patch and token fields, ``dropout`` and ``layer_norm_eps``."""
        check_config(config, "PatchEmbedding.from_config")
        return cls(
            config.image_size,
            config.patch_size,
            config.in_channels,
            config.dim,
            patchify=config.patchify,
            bias=config.patch_bias,
            class_token=config.class_token,
            distill_token=config.distill_token,
            register_tokens=config.register_tokens,
            pos_embed_prefix=config.pos_embed_prefix,
            dropout=config.dropout,
            pre_norm=config.pre_norm,
            layer_norm_eps=config.layer_norm_eps,
            dynamic_size=config.dynamic_size,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_image(x)
        grid = (x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1])  # dynamic_size resamples E_pos
        for stage in self:  # the grid goes by name to the stage that takes one (PositionEmbedding)
            x = stage(x, grid=grid) if forward_takes(stage, "grid") else stage(x)
        return x

    def layout(self, image_size: int | tuple[int, int] | None = None) -> TokenLayout:
        """The tokens made of an input of ``image_size`` (H, W), by default this embedding's own: the prefix tokens
        by name, then that input's patch grid. Another size than its own needs ``dynamic_size``."""
        image, (ph, pw) = check_patch_grid(self.image_size if image_size is None else image_size, self.patch_size)
        if image != self.image_size and self.pos_embed.dynamic is None:
            raise ValueError(f"image_size {image}: this embedding takes {self.image_size} only (no dynamic_size)")
        names = (name for m in self.children() if isinstance(m, PrefixTokens) for name in m.names())
        return TokenLayout(tuple(names), (image[0] // ph, image[1] // pw))
