"""EVA-02's layers against timm's own: the RoPE table (RotaryEmbeddingCat), the attention with RoPE and q, v biases
(EvaAttention) and the SwiGLU MLP (GluMlp with SiLU, timm's SwiGLUPacked), each taken from timm's
``eva02_tiny_patch14_224`` and ``eva02_small_patch14_224`` as timm builds them (``dynamic_img_size=True``, so that its
RoPE is computed for any grid), weights copied by their state dicts, keys unchanged.

float32, max |difference| <= 1e-5 at the reference grid 16 x 16 (224 px in patches of 14) and at 24 x 24 and 16 x 20,
our attention on each impl against timm's on both of its paths (SDPA and its written-out softmax); every measurement
goes to the interop report (tests/_interop.py report_diffs).
"""

from __future__ import annotations

import math

import pytest
import torch
from _interop import interop_library, perturbed, report_diffs

from vit_einops import ATTN_IMPLS, MultiHeadAttention
from vit_einops.network.blocks import SwiGLU
from vit_einops.network.rope import RotaryEmbedding

timm = interop_library("timm")

TOL = 1e-5
GRIDS = ((16, 16), (24, 24), (16, 20))
DIFFS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    report_diffs(DIFFS)


@pytest.fixture(scope="module", params=["eva02_tiny_patch14_224", "eva02_small_patch14_224"])
def eva(request):
    torch.manual_seed(0)
    # Noise of std 0.05 (not the usual 0.02) brings the layers' outputs to order 1, where 1e-5 is a tight bound.
    return request.param, perturbed(timm.create_model(request.param, pretrained=False, dynamic_img_size=True), std=0.05)


def _check(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape, name
    diff = DIFFS[name] = (actual - expected).abs().max().item()
    assert diff <= TOL, f"{name}: max |difference| {diff:.2e} > {TOL:g}"


def test_rope_table_equals_timm_rotary_embedding_cat(eva):
    """Our (sin, cos) are timm's get_embed(shape=grid) = [sin, cos] for every grid, and at the reference grid also
    the table timm caches when built without dynamic_img_size."""
    name, model = eva
    head_dim = model.embed_dim // model.blocks[0].attn.num_heads
    rope = RotaryEmbedding(head_dim, (16, 16))
    timm_layout = lambda table: torch.cat((table.sin, table.cos), dim=-1)  # noqa: E731
    for grid in GRIDS:
        _check(f"timm {name} rope table {grid[0]}x{grid[1]}", timm_layout(rope(grid, 1)), model.rope.get_embed(grid))
    cached = timm.create_model(name, pretrained=False).rope.get_embed()
    _check(f"timm {name} rope table 16x16 cached", timm_layout(rope((16, 16), 1)), cached)


def test_attention_with_rope_and_qv_bias_equals_eva_attention(eva):
    """MultiHeadAttention(dim, heads, qkv_bias="qv") takes EvaAttention's state dict as it is, and with RoPE on the
    patch tokens (the class token untouched) computes what it computes, on every impl and grid."""
    name, model = eva
    theirs = model.blocks[0].attn
    ours = MultiHeadAttention(model.embed_dim, theirs.num_heads, qkv_bias="qv").eval()
    ours.load_state_dict(theirs.state_dict())
    rope = RotaryEmbedding(theirs.head_dim, (16, 16))
    for grid in GRIDS:
        x = torch.randn(2, 1 + math.prod(grid), model.embed_dim)
        table = rope(grid, 1)
        for fused in (True, False):
            theirs.fused_attn = fused
            with torch.no_grad():
                expected = theirs(x, rope=model.rope.get_embed(grid))
                for impl in ATTN_IMPLS:
                    ours.impl = impl
                    what = f"timm {name} attention {grid[0]}x{grid[1]} {impl} vs timm {'sdpa' if fused else 'softmax'}"
                    _check(what, ours(x, rope=table), expected)


def test_swiglu_equals_eva_mlp(eva):
    """SwiGLU(dim, int(dim * 4 * 2/3)) takes the state dict of EVA-02's MLP as it is and computes the same."""
    name, model = eva
    theirs = model.blocks[0].mlp
    ours = SwiGLU(model.embed_dim, int(model.embed_dim * 4 * 2 / 3)).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 257, model.embed_dim)
    with torch.no_grad():
        _check(f"timm {name} swiglu", ours(x), theirs(x))
