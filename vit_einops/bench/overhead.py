"""Per-call overhead: a tiny ViT's forward call against the same math in plain torch ops.

The tiny ViT (TINY: 32x32 images in patches of 8, 17 tokens, two blocks of width 48, SDPA attention) computes so
little that its time per call is mostly what surrounds the arithmetic: the module calls, the probe sites, the
checks at the entry point. :func:`plain_forward` computes the same function with torch.nn.functional ops on the
model's own Parameters, with no module call and no check (its output equals the model's within 1e-6 in float32:
tests/test_bench_overhead.py), so the ratio of the two times is what the model's structure costs per call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..network.config import ViTConfig
from ..network.model import ViT
from .device import Meter
from .measure import Timing
from .paired import paired_ratio, ratio_fields

TINY = dict(image_size=32, patch_size=8, dim=48, depth=2, heads=4, mlp_dim=96, num_classes=5)
BATCH = 2


def plain_forward(model: ViT) -> Callable[[torch.Tensor], torch.Tensor]:
    """The forward of ``model`` (a ViT of the TINY config, any attention impl) as plain torch ops on its own
    Parameters: Eq. 1 (convolution patchify, class token, position embedding), Eqs. 2-3 per block (pre-norm
    attention through F.scaled_dot_product_attention, pre-norm MLP with exact GELU), Eq. 4 (norm, class token,
    linear head). A ValueError for another config: this function knows no other option."""
    if model.config != ViTConfig(**TINY):
        raise ValueError(f"plain_forward computes the TINY config {TINY} only, got {model.config}")
    w = dict(model.named_parameters())
    dim, heads, patch, eps = TINY["dim"], TINY["heads"], TINY["patch_size"], model.config.layer_norm_eps

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (dim,), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    def forward(x: torch.Tensor) -> torch.Tensor:
        # (b, c, H, W) -> (b, n, D) patches, then the class token and E_pos (Eq. 1)
        patches = F.conv2d(x, w["patch_embed.proj.weight"], w["patch_embed.proj.bias"], stride=patch)
        z = torch.cat([w["patch_embed.cls_token.weight"].expand(x.shape[0], -1, -1), patches.flatten(2).mT], dim=1)
        z = z + w["patch_embed.pos_embed.weight"]
        for i in range(TINY["depth"]):
            # (b, n, 3 D) -> three (b, h, n, d): the qkv layout (qkv h d) of MultiHeadAttention
            q, k, v = linear(norm(z, f"blocks.{i}.attn.norm"), f"blocks.{i}.attn.mha.qkv").unflatten(
                -1, (3, heads, dim // heads)
            ).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
            z = z + linear(attended, f"blocks.{i}.attn.mha.proj")  # Eq. 2
            hidden = F.gelu(linear(norm(z, f"blocks.{i}.mlp.norm"), f"blocks.{i}.mlp.ff.fc1"))
            z = z + linear(hidden, f"blocks.{i}.mlp.ff.fc2")  # Eq. 3
        return linear(norm(z[:, 0], "head.norm"), "head.fc")  # Eq. 4 on the class token

    return forward


def overhead_row(model: Timing, plain: Timing, max_abs_diff: float) -> dict:
    """The bench's record of the comparison: each side's median seconds per call, the difference, and the model's
    time over the plain ops' (paired round by round, with its 95% interval: vit_einops.bench.paired)."""
    return dict(
        model=f"{TINY['depth']} blocks of width {TINY['dim']}, {TINY['image_size']} px images",
        batch=BATCH,
        model_s=model.median_s,
        plain_s=plain.median_s,
        overhead_s=model.median_s - plain.median_s,
        **ratio_fields(paired_ratio(model.round_s, plain.round_s)),
        rounds=len(model.round_s),
        max_abs_diff=max_abs_diff,
    )


def measure_overhead(dtype: torch.dtype, rounds: int, min_run_time: float, meter: Meter) -> dict:
    """:func:`overhead_row` of the TINY ViT (SDPA attention, eval, inference mode) and :func:`plain_forward` on one
    batch of BATCH images, taking turns (meter.time)."""
    torch.manual_seed(0)
    model = ViT(**TINY, attn_impl="sdpa").to(meter.device, dtype).eval()
    plain = plain_forward(model)
    x = torch.randn(BATCH, 3, TINY["image_size"], TINY["image_size"], generator=torch.Generator().manual_seed(0))
    x = x.to(meter.device, dtype)
    with torch.inference_mode():
        diff = (model(x) - plain(x)).abs().max().item()
        timings = meter.time({"model": lambda: model(x), "plain": lambda: plain(x)}, rounds=rounds,
                             min_run_time=min_run_time)  # fmt: skip
    return overhead_row(timings["model"], timings["plain"], diff)

