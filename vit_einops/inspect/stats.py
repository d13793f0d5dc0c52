"""Per-head statistics of recorded attention, and the token norms of the residual stream, layer by layer.

Axes: l layers, b images, h heads, i queries, j keys, n tokens, p prefix tokens (the tokens before the patches,
named by the input's ``layout.prefix``: see :class:`~vit_einops.network.patch_embed.TokenLayout`).

- :func:`attention_entropy`: how spread out each query's row of A is, in nats: ``H_i = -sum_j A_ij log A_ij``.
  log n for a uniform row, 0 for a row that puts all its weight on one key.
- :func:`prefix_token_share`: how much of the patches' attention lands on each prefix token (class,
  distillation, register); the class token's is its column ``layout.index("cls")``.
- :func:`token_norms`: ``||z_l^i||``, the length of every token after every block; a few patch tokens with norms
  far above the rest are the "high-norm outlier tokens" that large ViTs grow, and that register tokens take over
  (Darcet et al. 2024, "Vision Transformers Need Registers").
- :func:`head_statistics`: those, the mean attention distance and the patches' attention mass, per image, for the
  explorer's charts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn

from ..network.patch_embed import TokenLayout
from ..network.probes import HookPoint, attached
from ..network.sizes import check_model_forward
from .distance import distance_sums, ratio_or_nan
from .tokens import check_layout


def _check_rows(maps: torch.Tensor) -> None:
    if not isinstance(maps, torch.Tensor):
        raise TypeError(f"expected attention maps as a torch.Tensor, got {type(maps).__name__}")
    if not maps.is_floating_point() or maps.ndim < 1 or maps.shape[-1] == 0:
        raise ValueError(f"expected floating-point attention rows (..., n), got {maps.dtype} {tuple(maps.shape)}")
    if not torch.isfinite(maps).all():
        raise ValueError("attention maps contain non-finite values (nan or inf)")
    if (maps < 0).any():
        raise ValueError(f"attention weights must be >= 0, got a minimum of {maps.min().item():.3g}")
    sums = maps.double().sum(dim=-1)
    # Rows of a softmax sum to 1 up to rounding, which grows with n and with a low-precision dtype.
    tol = max(1e-4, 16 * torch.finfo(maps.dtype).eps * maps.shape[-1])
    worst = (sums - 1).abs().max().item() if sums.numel() else 0.0
    if worst > tol:
        raise ValueError(f"attention rows must sum to 1 (a softmax), but one is off by {worst:.3g}")


def attention_entropy(maps: torch.Tensor) -> torch.Tensor:
    """The entropy of every row of A, natural log: ``H = -sum_j A_ij log A_ij`` with ``0 log 0 = 0``.

    A masked key (weight exactly 0) contributes 0, never nan. Rows must be distributions (non-negative, summing
    to 1); anything else is a ValueError, since its entropy would mean nothing.

    Shapes: (..., n) -> (...); e.g. maps (l, b, h, n, n) -> (l, b, h, n), one number per layer, image, head and
    query. Uniform rows give log n; one-hot rows give 0.
    """
    _check_rows(maps)
    return -torch.special.xlogy(maps, maps).sum(dim=-1)


def prefix_token_share(maps: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The share of the patches' attention that goes to each prefix token: for prefix token p, the mean over patch
    queries i of ``A[i, p]``.

    1/n where attention is uniform; near 1 for a token the patches mostly read (a "sink": the class token in many
    trained ViTs, the registers in DINOv2 with registers). The prefix tokens' own queries are left out: the class
    token's row is what the classifier reads, drawn as the class attention. ``1 - share.sum(-1)`` is what the
    patches put on patches. ``layout`` is the recorded input's, so that maps of another layout (registers read as
    patches) are refused, not misread.

    Shapes: maps (l, b, h, n, n) with n = layout.num_tokens -> (l, b, h, p), the last axis in ``layout.prefix``
    order.
    """
    _check_rows(maps)
    if maps.ndim != 5 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"expected attention maps (layers, b, h, n, n), got {tuple(maps.shape)}")
    p = check_layout(layout, maps.shape[-1]).num_prefix
    return maps[..., layout.patches, :p].mean(dim=-2)


def _encoder_blocks(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    children = list(blocks.children()) if isinstance(blocks, nn.Module) else []
    if not children or not all(hasattr(block, "hook_resid_post") for block in children):
        raise ValueError(f"{type(model).__name__} has no `blocks` of encoder blocks to measure token norms on")
    return children


class TokenNorms(NamedTuple):
    """What :func:`token_norms` returns: the model's ``output``, the ``norms`` (l, b, n) and the ``layout`` of the
    input, whose tokens the norms follow."""

    output: torch.Tensor
    norms: torch.Tensor
    layout: TokenLayout

    @property
    def patch_norms(self) -> torch.Tensor:
        """The patch tokens' norms on the grid: (l, b, gh, gw)."""
        return self.layout.split(self.norms)[1]


@contextmanager
def recording_token_norms(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Inside the ``with`` block, every forward of ``model`` appends each encoder block's token norms (b, n) to the
    list it yields, in block order, read at the blocks' ``hook_resid_post`` probe sites (z_l); they are detached on
    exit."""
    records: list[torch.Tensor] = []

    def keep(z: torch.Tensor, hook: HookPoint) -> None:
        records.append(z.detach().norm(dim=-1))

    with attached([(block.hook_resid_post, keep) for block in _encoder_blocks(model)]):
        yield records


@torch.no_grad()
def token_norms(model: nn.Module, images: torch.Tensor) -> TokenNorms:
    """Run ``model`` once; return (output, norms): ``norms[l, b, i] = ||z_l^i||_2``, the Euclidean length of
    token i of image b after encoder block l (0-based, so ``norms[0]`` is after the first block), before the
    final LayerNorm. No hook remains afterwards.

    The result (:class:`TokenNorms`) carries the ``layout`` of ``images``, which names the rows: the prefix tokens
    (class, distillation, registers), then the patches (``.patch_norms`` lays them on the grid).

    Shapes: images (b, C, H, W) -> output as the model's, norms (l, b, n).
    """
    check_model_forward(model, images)
    with recording_token_norms(model) as records:
        output = model(images)
    return TokenNorms(output, torch.stack(records), model.patch_embed.layout(images.shape[-2:]))


def head_statistics(
    maps: torch.Tensor, layout: TokenLayout, patch_size: int | tuple[int, int]
) -> dict[str, torch.Tensor]:
    """Per image, layer and head, for maps over the tokens of ``layout`` (the recorded input's):

    - ``distance``: the mean attention distance in pixels of that image alone (the definition of
      :func:`~vit_einops.inspect.distance.mean_attention_distance`, over one image); nan where it is undefined,
      exactly where ``patch_mass`` is 0;
    - ``patch_mass``: the mean over patch queries of the weight they put on patch keys; 0 for a head that attends
      only to prefix tokens, 1 for one that ignores them (``1 - prefix_share.sum(-1)`` up to rounding, but
      computed from the same sums as ``distance``, so the two agree on which heads are undefined);
    - ``entropy``: the mean over queries of :func:`attention_entropy`, nats;
    - ``prefix_share``: :func:`prefix_token_share`, (l, b, h, p).

    Shapes: maps (l, b, h, n, n) -> each (l, b, h), ``prefix_share`` (l, b, h, p).
    """
    weighted, mass = distance_sums(maps, layout, patch_size)
    return {
        "distance": ratio_or_nan(weighted, mass).to(maps.dtype),
        "patch_mass": (mass / layout.num_patches).to(maps.dtype),
        "entropy": attention_entropy(maps).mean(dim=-1),
        "prefix_share": prefix_token_share(maps, layout),
    }
