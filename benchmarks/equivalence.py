"""Measured maximum errors of every equivalence the tests assert, at ViT shapes, in float32 and float64.

    python benchmarks/equivalence.py            # prints a table; --json FILE also writes it
    python benchmarks/equivalence.py --smoke    # the same rows on tiny shapes, in seconds (tests/ runs it)

Errors are max |ours - torch| (absolute) and that divided by max |torch| (relative to the tensor's scale).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from vit_einops import (
    ATTN_IMPLS,
    MultiHeadAttention,
    PatchEmbedding,
    TransformerEncoderBlock,
    ViT,
    ViTConfig,
    conv_to_linear_weight,
)
from vit_einops.base.io import atomic_write_bytes
from vit_einops.reference import forward_backward, torch_encoder_layer_from, torch_mha_from, torch_reference_vit


# The shapes of each row: ViT-B/16's attention and block and ViT-Ti/16 whole at 224 px, or (--smoke) the same code
# on shapes small enough that the whole table takes a second or two: every impl, mask and dtype, tiny tensors.
SHAPES = {
    "vit": dict(
        attention=dict(b=2, n=197, heads=12, head_dim=64),
        block=dict(b=2, n=197, dim=768, heads=12),
        model=dict(name="ViT-Ti/16", image_size=224, patch_size=16, dim=192, depth=12, heads=3, mlp_dim=768),
        patchify=dict(image_size=224, patch_size=16, dim=768),
    ),
    "smoke": dict(
        attention=dict(b=2, n=17, heads=2, head_dim=8),
        block=dict(b=2, n=17, dim=16, heads=2),
        model=dict(name="tiny ViT/8", image_size=32, patch_size=8, dim=48, depth=2, heads=4, mlp_dim=96),
        patchify=dict(image_size=32, patch_size=8, dim=48),
    ),
}


def errors(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (ours - ref).abs().max().item()
    return diff, diff / ref.abs().max().item()


def attention_rows(dtype: torch.dtype, b: int, n: int, heads: int, head_dim: int):
    dim = heads * head_dim
    g = torch.Generator().manual_seed(0)
    x, up = torch.randn(b, n, dim, generator=g, dtype=dtype), torch.randn(b, n, dim, generator=g, dtype=dtype)
    mask = (torch.rand(b, heads, n, n, generator=g) < 0.5) | torch.eye(n, dtype=torch.bool)
    mha = MultiHeadAttention(dim, heads).to(dtype)
    ref = torch_mha_from(mha)
    for masked in (False, True):
        m = mask if masked else None
        torch_mask = None if m is None else ~m.reshape(b * heads, n, n)
        r_out, r_grads = forward_backward(
            lambda t, tm=torch_mask: ref(t, t, t, attn_mask=tm, need_weights=False)[0], x, [ref.in_proj_weight], up
        )
        for impl in ATTN_IMPLS:
            mha.impl = impl
            out, grads = forward_backward(lambda t, m=m: mha(t, mask=m), x, [mha.qkv.weight], up)
            name = f"MultiHeadAttention[{impl}] vs nn.MultiheadAttention{' (masked)' if masked else ''}"
            yield name, dtype, errors(out, r_out), errors(grads[0], r_grads[0]), errors(grads[1], r_grads[1])


def block_rows(dtype: torch.dtype, b: int, n: int, dim: int, heads: int):
    g = torch.Generator().manual_seed(1)
    x, up = torch.randn(b, n, dim, generator=g, dtype=dtype), torch.randn(b, n, dim, generator=g, dtype=dtype)
    block = TransformerEncoderBlock(ViTConfig(dim=dim, heads=heads, mlp_dim=4 * dim)).to(dtype)
    ref = torch_encoder_layer_from(block)
    r_out, r_grads = forward_backward(ref, x, [ref.linear1.weight], up)
    for impl in ATTN_IMPLS:
        block.attn.mha.impl = impl
        out, grads = forward_backward(block, x, [block.mlp.ff.fc1.weight], up)
        yield (
            f"TransformerEncoderBlock[{impl}] vs nn.TransformerEncoderLayer",
            dtype,
            errors(out, r_out),
            errors(grads[0], r_grads[0]),
            errors(grads[1], r_grads[1]),
        )


def model_rows(dtype: torch.dtype, name: str, image_size: int, **size):
    model = ViT(image_size=image_size, **size).to(dtype).eval()
    x = torch.randn(4, 3, image_size, image_size, generator=torch.Generator().manual_seed(2), dtype=dtype)
    with torch.inference_mode():
        ref = torch_reference_vit(model).eval()(x)
        for impl in ATTN_IMPLS:
            model.set_attn_impl(impl)
            yield f"{name}[{impl}] logits vs torch encoder layers (eval)", dtype, errors(model(x), ref), None, None


def patchify_rows(dtype: torch.dtype, image_size: int, patch_size: int, dim: int):
    conv = PatchEmbedding(image_size, patch_size, 3, dim).to(dtype)
    linear = PatchEmbedding(image_size, patch_size, 3, dim, patchify="linear").to(dtype)
    state = dict(conv.state_dict())
    state["proj.weight"] = conv_to_linear_weight(state["proj.weight"])
    linear.load_state_dict(state)
    x = torch.randn(4, 3, image_size, image_size, generator=torch.Generator().manual_seed(3), dtype=dtype)
    name = f"PatchEmbedding linear vs conv ({image_size} px, P {patch_size}, D {dim})"
    with torch.no_grad():
        yield name, dtype, errors(linear(x), conv(x)), None, None


def fmt(e):
    return "-" if e is None else f"{e[0]:.2e} ({e[1]:.1e})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--force", action="store_true", help="replace an existing --json file")
    parser.add_argument("--smoke", action="store_true", help="every row on tiny shapes (seconds; what CI runs)")
    args = parser.parse_args(argv)
    if args.json and os.path.lexists(args.json) and not args.force:
        parser.error(f"--json {args.json} already exists; pass --force to replace it")
    torch.manual_seed(0)
    shapes = SHAPES["smoke" if args.smoke else "vit"]
    rows = []
    for dtype in (torch.float64, torch.float32):
        for part, gen in (("attention", attention_rows), ("block", block_rows), ("model", model_rows),
                          ("patchify", patchify_rows)):  # fmt: skip
            rows.extend(gen(dtype, **shapes[part]))
    header = (
        f"{'equivalence':<66} {'dtype':<8} {'output abs (rel)':<20} {'grad x abs (rel)':<20} {'grad W abs (rel)':<20}"
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(header)
    print("-" * len(header))
    for name, dtype, out, gx, gw in rows:
        print(f"{name:<66} {str(dtype).replace('torch.', ''):<8} {fmt(out):<20} {fmt(gx):<20} {fmt(gw):<20}")
    if args.json:
        records = [
            dict(name=name, dtype=str(dtype), output=out, grad_x=gx, grad_weight=gw)
            for name, dtype, out, gx, gw in rows
        ]
        atomic_write_bytes(args.json, (json.dumps(records, indent=2) + "\n").encode())


if __name__ == "__main__":
    main()
