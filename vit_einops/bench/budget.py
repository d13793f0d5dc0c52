"""The memory a benchmark grid will need, estimated from its sizes before anything is measured.

Every option of a grid passes its own range (bench/names.py RANGES), yet batch x heads x tokens^2 multiply: ``--batches
64 --tokens 16384`` at ViT-B's 12 heads is an attention matrix of 824 GB. :func:`check_grid_memory` refuses such a grid
at once, naming its largest point, instead of running out of memory in the middle of the run.
"""

from __future__ import annotations

from ..base.budget import check_memory, memory_limit
from ..network.config import ViTConfig
from ..presets import preset_config
from ..network.sizes import forward_bytes, parameter_count


def point_bytes(batch: int, heads: int, tokens: int, head_dim: int, mode: str, layer: bool, itemsize: int) -> int:
    """Peak memory of one attention grid point on the einsum path (the largest): the inputs q, k, v and x, the
    attention matrix A before and after the softmax (b h n^2 each) and the output; forward + backward adds the
    gradients of each. The layer paths add the qkv and output projections and their (D, 3D) and (D, D) weights."""
    b, h, n, d = batch, heads, tokens, head_dim
    dim = h * d
    inputs = 4 * b * n * dim  # q, k, v (b h n d) and x (b n D)
    work = 2 * b * h * n * n + b * n * dim
    if layer:
        work += 4 * b * n * dim + 4 * dim * dim
    if mode != "forward":
        work *= 2  # every forward tensor has a gradient of its size
    return (inputs + work) * itemsize


def model_point_bytes(config: ViTConfig, batch: int, train: bool, itemsize: int) -> int:
    """Peak memory of one whole-model measurement: the weights (with a training step also their gradients and
    Adam's two moments), and the activations: one block's at a time for inference, every block's for a training
    step (backward needs them all)."""
    weights = parameter_count(config) * itemsize * (4 if train else 1)
    activations = forward_bytes(config, batch, itemsize)
    return weights + activations * (config.depth if train else 1)


def check_grid_memory(options) -> None:
    """Refuse (ValueError, one line naming the point and the limit) a grid whose largest attention point or model
    would not fit the memory budget (:mod:`vit_einops.base.budget`)."""
    itemsize = 2 if options.dtype == "bfloat16" else 4
    if options.attention:
        layer = bool(options.layer_paths)
        b, h, n, d, mode = max(
            ((b, h, n, d, m) for b in options.batches for h in options.heads for n in options.tokens
             for d in options.head_dims for m in options.modes),
            key=lambda p: point_bytes(*p, layer, itemsize),
        )  # fmt: skip
        check_memory(
            point_bytes(b, h, n, d, mode, layer, itemsize),
            f"the attention grid point batch {b}, heads {h}, tokens {n}, head dim {d} ({mode})",
        )
    for name in options.models:
        config = ViTConfig(**preset_config(name, image_size=options.image_size, **options.model_overrides))
        train = "train_step" in options.model_modes
        check_memory(
            model_point_bytes(config, options.model_batch, train, itemsize),
            f"{name} at batch {options.model_batch}, image size {options.image_size}"
            + (" (a training step)" if train else ""),
        )


def einsum_memory_tokens(
    batch: int, heads: int, head_dim: int, mode: str, itemsize: int, most: int = 2**24
) -> int | None:
    """The smallest N at which the core einsum path at (batch, heads, head_dim) in ``mode`` needs more than the
    memory budget (:func:`point_bytes`: its A before and after the softmax, b h n^2 each, is most of it); None when
    no N up to ``most`` does. Bisection: the bytes grow with N."""
    limit = memory_limit()[0]

    def over(n: int) -> bool:
        return point_bytes(batch, heads, n, head_dim, mode, False, itemsize) > limit

    if not over(most):
        return None
    low, high = 1, most  # over(high) holds; the answer is in (low, high]
    if over(low):
        return low
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if over(middle) else (middle, high)
    return high
