"""Attention rollout (Abnar and Zuidema 2020) and class-token attention, mapped back onto the patch grid.

Axes: l layers, b images, h heads, i queries, j keys, gh gw the patch grid. Tokens are in the order of the input's
``layout`` (:class:`~vit_einops.network.patch_embed.TokenLayout`): the prefix tokens, then the patches in row-major order.
"""

from __future__ import annotations

import torch
from einops import reduce

from ..base.checks import check_choice, check_dense_tensor, check_index, check_probability, check_real_in_range
from ..network.patch_embed import TokenLayout
from .tokens import CLASS_TOKEN, check_layout

HEAD_FUSIONS = ("mean", "max", "min")


def check_maps(maps: torch.Tensor) -> None:
    """ValueError unless ``maps`` are attention maps (layers, b, h, n, n): a dense float tensor of at least one
    layer, its values finite and non-negative (each row a distribution over the keys, as softmax makes it)."""
    if not isinstance(maps, torch.Tensor) or maps.ndim != 5 or maps.shape[-1] != maps.shape[-2]:
        got = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise ValueError(f"expected attention maps (layers, b, h, n, n), got {got}")
    check_dense_tensor("maps", maps)
    if not maps.is_floating_point():
        raise TypeError(f"attention maps are floating point (softmax outputs), got dtype {maps.dtype}")
    if maps.numel() == 0:
        raise ValueError(f"the attention maps (layers, b, h, n, n) are empty: shape {tuple(maps.shape)}")
    if not torch.isfinite(maps).all():
        raise ValueError("the attention maps hold non-finite values (nan or inf)")
    if (maps < 0).any():
        raise ValueError(
            f"the attention maps hold negative values (down to {maps.min().item():.4g}); attention weights are "
            "softmax outputs, each row a distribution over the keys"
        )


def discard_lowest(fused: torch.Tensor, ratio: float, kept: int | None = None) -> torch.Tensor:
    """vit-explain's ``discard_ratio``: in each map (..., n, n), the ``int(n * n * ratio)`` lowest entries set to 0,
    except entry (``kept``, ``kept``), the class token's own (None: no entry is spared, a model without one). As
    there, the spared entry still counts among the lowest, so one fewer is zeroed when it is one of them. Ties at
    the cut are broken by ``torch.topk``. Returns a new tensor; ``ratio`` 0 returns ``fused`` itself."""
    ratio = check_probability("discard_ratio", ratio)
    n = fused.shape[-1]
    if kept is not None:
        kept = check_index("kept", kept, n, f"maps of {n} tokens")
    count = int(n * n * ratio)  # vit-explain's own rounding: int(flat.size(-1) * discard_ratio)
    if count == 0:
        return fused
    flat = fused.flatten(-2)
    lowest = flat.topk(count, dim=-1, largest=False).indices
    drop = torch.zeros_like(flat, dtype=torch.bool).scatter_(-1, lowest, True)
    if kept is not None:
        drop[..., kept * n + kept] = False
    return flat.masked_fill(drop, 0.0).unflatten(-1, (n, n))


def _roll_out(
    fused: torch.Tensor, residual: float, discard_ratio: float, kept: int | None, what: str, hint: str = ""
) -> torch.Tensor:
    """The product every rollout takes of its fused maps (l, b, n, n): the lowest entries discarded
    (:func:`discard_lowest`), ``A' = residual * I + (1 - residual) * A``, each row of A' renormalised to sum 1
    (over the keys: ``A' / A'.sum(-1, keepdim=True)``), then ``R = A'_L ... A'_1`` -> (b, n, n). ``what`` names
    the fused maps in the error for a row of zeros (residual 0), ``hint`` ends it."""
    residual = check_real_in_range("residual", residual, 0.0, 1.0)
    fused = discard_lowest(fused, discard_ratio, kept)
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    mixed = residual * eye + (1.0 - residual) * fused
    totals = mixed.sum(dim=-1, keepdim=True)
    empty = (totals == 0).nonzero()
    if len(empty):
        layer, image, token = empty[0, :3].tolist()
        raise ValueError(
            f"with residual {residual:g}, {what} is all zeros in layer {layer}, image {image}, row {token} "
            f"({len(empty)} such row{'s' * (len(empty) > 1)} in all): nothing to renormalise; use a residual above 0"
            + hint
        )
    mixed = mixed / totals
    rollout = eye.expand_as(mixed[0])
    for layer in mixed:
        rollout = layer @ rollout  # layer l acts on what layers 1..l-1 already mixed
    return rollout


def attention_rollout(
    maps: torch.Tensor,
    residual: float = 0.5,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    kept: int | None = None,
) -> torch.Tensor:
    """How much each token's final state draws on each input token, through every layer.

    Per layer, heads are fused (their mean by default, or max or min as vit-explain offers), the lowest
    ``discard_ratio`` of the fused map's entries are set to zero except token ``kept``'s own entry (the class
    token's, ``layout.index("cls")``: :func:`discard_lowest`, vit-explain's ``discard_ratio``; None, the default,
    spares none), the residual connection
    is mixed in as ``A' = residual * I + (1 - residual) * A`` (Abnar and Zuidema use 0.5), every row is
    renormalised to sum to 1, and the layers are multiplied in order: ``R = A'_L ... A'_2 A'_1``. The maps are
    checked by :func:`check_maps`; with ``residual`` 0 a fused row of zeros cannot be renormalised, and is a
    ValueError.

    vit-explain's code divides by ``a.sum(dim=-1)`` without ``keepdim``, which broadcasts the row sums along the
    last axis: entry (i, j) is divided by row j's sum. With mean fusion and no discarding every row already sums
    to 1, so it makes no difference there; with max or min fusion or a discard ratio it does. Here each row is
    divided by its own sum.

    The heads are fused and the product taken in float64, a layer at a time; R has the maps' dtype.

    Shapes: maps (l, b, h, n, n) -> R (b, n, n); row i of R is token i's mixture over input tokens.
    """
    check_maps(maps)
    check_choice("head_fusion", head_fusion, HEAD_FUSIONS)
    # A layer at a time in float64: the float64 copy of one layer's maps, never of all.
    fused = torch.stack([reduce(layer.double(), "b h i j -> b i j", head_fusion) for layer in maps])
    what = f"the {head_fusion} of the heads' attention" + (" after discarding" if discard_ratio else "")
    hint = " or another head_fusion" * (head_fusion == "min")
    return _roll_out(fused, residual, discard_ratio, kept, what, hint).to(maps.dtype)


def gradient_rollout(maps: torch.Tensor, grads: torch.Tensor, discard_ratio: float = 0.9, kept: int | None = None):
    """Gradient attention rollout, as vit-explain defines it (jacobgil/vit-explain, ``vit_grad_rollout.py``).

    Per layer the heads are fused by the mean of the attention weighted by its gradient, negative values
    zeroed, ``Abar_l = (mean_h dy/dA_l * A_l)^+`` (the mean before the clamp: Chefer et al.'s relevance clamps each
    head first), then rolled out as :func:`attention_rollout` rolls (:func:`_roll_out`, residual 0.5): the lowest
    ``discard_ratio`` of entries zeroed except token ``kept``'s own (vit-explain's default 0.9), ``(Abar + I) / 2``
    with each row renormalised to sum 1, and ``R = A'_L ... A'_1``.

    Three places where vit-explain's code differs, and this does what its text means: its rows are divided
    along the wrong axis (``a / a.sum(dim=-1)``, see :func:`attention_rollout`), which here always matters, since
    the weighted rows do not sum to 1; its gradients, gathered by backward hooks, arrive last layer first and are
    zipped with the attention first layer first, so each layer's map meets another layer's gradient (vit-explain
    issue #6); and the line that spares the class token's entry from discarding is commented out there, though
    its comment says it is spared, as its attention rollout spares it.

    Shapes: maps (l, b, h, n, n), grads (l, b, h, n, n) (``attention_gradients``' ``grads[t]``) -> R (b, n, n).
    """
    check_maps(maps)
    if not isinstance(grads, torch.Tensor) or grads.shape != maps.shape:
        got = tuple(grads.shape) if isinstance(grads, torch.Tensor) else type(grads).__name__
        raise ValueError(f"expected grads of the maps' shape {tuple(maps.shape)}, got {got}")
    fused = reduce(grads * maps, "l b h i j -> l b i j", "mean").clamp(min=0)
    return _roll_out(fused, 0.5, discard_ratio, kept, "the gradient-weighted attention")


def class_attention_grid(attention: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The class token's row over the patch keys, laid out on the patch grid of ``layout`` (the recorded input's):
    every prefix token's column is skipped, so the map covers the patches alone. A model without a class token is
    refused with what to read instead (:func:`patch_attention_grid`).

    Shapes: (..., n, n) with n = layout.num_tokens -> (..., gh, gw).
    """
    if CLASS_TOKEN not in check_layout(layout, attention.shape[-1]).prefix:  # SigLIP: read the patches' own
        raise ValueError(
            "class_attention_grid reads the class token's row, but this model has none (prefix tokens "
            f"{layout.shown()}); use the mean over patch queries (patch_attention_grid) instead"
        )
    return layout.split(attention[..., layout.index(CLASS_TOKEN), :])[1]


def patch_attention_grid(attention: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The attention each patch receives from the patches, laid out on the grid: the mean over patch queries of
    their rows over the patch keys (prefix tokens' rows and columns skipped). The map to read where a model has
    no class token (SigLIP), or pools the mean of its patches.

    Shapes: (..., n, n) with n = layout.num_tokens -> (..., gh, gw).
    """
    queries = check_layout(layout, attention.shape[-1]).split(attention, dim=-2)[1]  # (..., gh, gw, n)
    return layout.split(reduce(queries, "... gh gw j -> ... j", "mean"))[1]
