"""EVA-02 through the whole pipeline, without timm: create_vit builds timm's two names with the parameters a formula
counts, `summary`'s table counts each of them, `inspect` and `explore` record a tiny EVA-02's attention (RoPE inside)
as record_attention does, and `convert --to hf` refuses it naming what Hugging Face's classes cannot hold.
Equality with timm's own Eva is tests/test_interop_eva02.py's."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _interop import perturbed
from PIL import Image
from test_explore import decode, embedded

from vit_einops import create_vit, load_vit, parameter_count, save_vit
from vit_einops.commands.cli import main
from vit_einops.inspect import record_attention

# (D, L) of timm's two names; their P 14, 224 px, no classifier (mim_in22k).
SIZES = {"eva02_tiny_patch14_224": (192, 12), "eva02_small_patch14_224": (384, 12)}


def eva02_parameters(dim: int, depth: int, patch: int = 14, tokens: int = 257) -> int:
    """3 P^2 D + D (patch projection) + D (class token) + N D (positions) + L block + 2 D (fc_norm), a block being
    2 D (norm1) + 3 D^2 (qkv, no bias) + 2 D (q and v biases) + D^2 + D (proj) + 2 D (norm2) + 2 M D + 2 M (fc1:
    SwiGLU's gate and value) + M D + D (fc2), with M = 8 D / 3."""
    hidden = dim * 8 // 3
    block = 2 * dim + 3 * dim**2 + 2 * dim + dim**2 + dim + 2 * dim + 2 * hidden * dim + 2 * hidden + hidden * dim + dim
    return 3 * patch**2 * dim + dim + dim + tokens * dim + depth * block + 2 * dim


@pytest.mark.parametrize("name", list(SIZES))
def test_create_vit_builds_the_parameters_the_formula_counts(name):
    model = create_vit(name)
    count = eva02_parameters(*SIZES[name])
    assert parameter_count(model.config) == sum(p.numel() for p in model.parameters()) == count


def test_summary_table_counts_every_parameter(capsys):
    """The q and v biases (held by the attention module itself, beside its Linears) and the SwiGLU's 2 M wide fc1
    count in torchsummary's table: its total is the formula's, and the line after it."""
    assert main(["summary", "eva02_tiny_patch14_224"]) == 0
    out = capsys.readouterr().out
    count = f"{eva02_parameters(*SIZES['eva02_tiny_patch14_224']):,}"
    assert f"Total params: {count}\n" in out
    assert out.rstrip().endswith(f"eva02_tiny_patch14_224: {count} parameters")


@pytest.fixture
def tiny_eva02(tmp_path):
    """A 2-block EVA-02-Ti at 56 px (a 4 x 4 grid, RoPE's reference still 16 x 16) saved with its family's
    preprocessing, and a photo to look at."""
    model = perturbed(create_vit("eva02_tiny_patch14_224", depth=2, image_size=56), std=0.05)
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)).save(photo)
    return save_vit(model, tmp_path / "eva.safetensors"), photo


def _recorded(model_file, photo) -> torch.Tensor:
    """(layers, 1, h, n, n): record_attention of the saved model on the photo, through its own preprocessing."""
    _, maps, layout = record_attention(load_vit(model_file), str(photo))
    assert layout.prefix == ("cls",) and layout.grid == (4, 4)
    return maps


def test_inspect_records_the_attention_with_rope(tiny_eva02, tmp_path, capsys, unrendered):
    model_file, photo = tiny_eva02
    out = tmp_path / "out"
    assert main(["inspect", str(model_file), "--image", str(photo), "--out", str(out), "--arrays", "full"]) == 0
    arrays = np.load(out / "arrays.npz")
    attention = arrays["attention"]
    assert attention.shape == (2, 1, 3, 17, 17)  # (layers, images, heads, 1 + 4 x 4 tokens, the same)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(attention, _recorded(model_file, photo).numpy(), atol=1e-6, rtol=0)
    layer = int(arrays["class_attention_layer"])
    assert np.array_equal(arrays["class_attention"], attention[layer][:, :, 0, 1:].reshape(1, 3, 4, 4))


def test_explore_embeds_the_attention_with_rope(tiny_eva02, tmp_path, capsys):
    model_file, photo = tiny_eva02
    page = tmp_path / "e.html"
    assert main(["explore", str(model_file), "--image", str(photo), "--out", str(page)]) == 0
    data = embedded(page)
    [pane] = data["panes"]
    assert pane["layout"] == {"prefix": ["cls"], "grid": [4, 4]} and (pane["depth"], pane["heads"]) == (2, 3)
    maps = _recorded(model_file, photo)[:, 0].double().numpy()  # (layers, h, n, n)
    [image] = pane["images"]
    levels = data["attention_levels"]
    codes = decode(image["attention"], np.uint8, maps.shape)
    rowmax = decode(image["attention_rowmax"], np.float32, maps.shape[:-1]).astype(np.float64)
    np.testing.assert_allclose(rowmax, maps.max(-1), atol=1e-6, rtol=0)
    error = np.abs(codes * (rowmax[..., None] / levels) - maps)
    assert (error <= rowmax[..., None] / (2 * levels) * (1 + 1e-6) + 1e-6).all()  # the page's stated precision


def test_convert_to_hf_refuses_naming_what_hf_cannot_hold(tiny_eva02, tmp_path, capsys):
    """No transformers class holds RoPE, SwiGLU or q and v biases: the refusal names each field and its value, and
    nothing is written (never a plain ViT without them)."""
    model_file, _ = tiny_eva02
    out = tmp_path / "hf"
    assert main(["convert", str(model_file), str(out), "--to", "hf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-einops convert: error: ") and err.count("\n") == 1
    for field in ("qkv_bias 'qv'", "ffn 'swiglu'", "rope_grid (16, 16)"):
        assert re.search(rf"\b{re.escape(field)}", err), field
    assert not out.exists()
