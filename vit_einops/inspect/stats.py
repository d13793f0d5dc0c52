"""Per-head statistics of recorded attention, and the token norms of the residual stream, layer by layer.

Axes: l layers, b images, h heads, i queries, j keys, n tokens (the class token is token 0).

- :func:`attention_entropy`: how spread out each query's row of A is, in nats: ``H_i = -sum_j A_ij log A_ij``.
  log n for a uniform row, 0 for a row that puts all its weight on one key.
- :func:`class_token_share`: how much of the patches' attention lands on the class token.
- :func:`token_norms`: ``||z_l^i||``, the length of every token after every block; a few tokens with norms far
  above the rest are the "high-norm outlier tokens" that large ViTs grow (Darcet et al. 2024, "Vision
  Transformers Need Registers").
- :func:`head_statistics`: those, the mean attention distance and the patches' attention mass, per image, for the
  explorer's charts.
"""

from __future__ import annotations

import torch
from torch import nn

from .distance import distance_sums, ratio_or_nan


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


def class_token_share(maps: torch.Tensor) -> torch.Tensor:
    """The share of the patches' attention that goes to the class token: the mean over patch queries i >= 1 of
    ``A[i, 0]``.

    1/n where attention is uniform; near 1 where patches mostly read the class token (a "sink"). The class
    token's own query is left out: its row is what the classifier reads, and is drawn in the explorer.

    Shapes: maps (l, b, h, n, n) -> (l, b, h).
    """
    _check_rows(maps)
    if maps.ndim != 5 or maps.shape[-1] != maps.shape[-2] or maps.shape[-1] < 2:
        raise ValueError(f"expected attention maps (layers, b, h, n, n) with n >= 2, got {tuple(maps.shape)}")
    return maps[..., 1:, 0].mean(dim=-1)


def _encoder_blocks(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module) or len(list(blocks.children())) == 0:
        raise ValueError(f"{type(model).__name__} has no `blocks` of encoder blocks to measure token norms on")
    return list(blocks.children())


@torch.no_grad()
def token_norms(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model`` once; return (output, norms): ``norms[l, b, i] = ||z_l^i||_2``, the Euclidean length of
    token i of image b after encoder block l (0-based, so ``norms[0]`` is after the first block), before the
    final LayerNorm. No hook remains afterwards.

    Shapes: images (b, C, H, W) -> output as the model's, norms (l, b, n).
    """
    records: list[torch.Tensor] = []
    handles = [
        block.register_forward_hook(lambda _m, _args, out: records.append(out.detach().norm(dim=-1)))
        for block in _encoder_blocks(model)
    ]
    try:
        output = model(images)
    finally:
        for handle in handles:
            handle.remove()
    return output, torch.stack(records)


def head_statistics(
    maps: torch.Tensor, grid_size: tuple[int, int], patch_size: int | tuple[int, int]
) -> dict[str, torch.Tensor]:
    """Per image, layer and head:

    - ``distance``: the mean attention distance in pixels of that image alone (the definition of
      :func:`~vit_einops.inspect.distance.mean_attention_distance`, over one image); nan where it is undefined,
      exactly where ``patch_mass`` is 0;
    - ``patch_mass``: the mean over patch queries of the weight they put on patch keys, ``sum_{j>=1} A_ij``
      averaged over i >= 1; 0 for a head that attends only to the class token, 1 for one that ignores it
      (``1 - class_share`` up to rounding, but computed from the same sums as ``distance``, so the two agree on
      which heads are undefined);
    - ``entropy``: the mean over queries of :func:`attention_entropy`, nats;
    - ``class_share``: :func:`class_token_share`.

    Shapes: maps (l, b, h, n, n) -> each (l, b, h).
    """
    weighted, mass = distance_sums(maps, grid_size, patch_size)
    return {
        "distance": ratio_or_nan(weighted, mass).to(maps.dtype),
        "patch_mass": (mass / (maps.shape[-2] - 1)).to(maps.dtype),
        "entropy": attention_entropy(maps).mean(dim=-1),
        "class_share": class_token_share(maps),
    }
