"""The bench's per-call overhead (vit_einops.bench.overhead): the plain-ops forward it times against the tiny ViT
computes the model's function (else the ratio would compare two different computations), and the row's and the
line's arithmetic on fake timings. No timing here; its presence in a run is checked in tests/test_bench.py."""

from __future__ import annotations

import pytest
import torch

from vit_einops import ViT
from vit_einops.bench import report
from vit_einops.bench.measure import Timing
from vit_einops.bench.overhead import BATCH, TINY, overhead_row, plain_forward


@pytest.mark.parametrize("impl", ["einsum", "sdpa", "chunked"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_plain_forward_is_the_models_function(impl, seed):
    """Within 1e-6 in float32 on the model's own weights (trained-like: every weight random, none at its zero or
    one init, so a bias or norm weight the plain ops forgot would show)."""
    torch.manual_seed(seed)
    model = ViT(**TINY, attn_impl=impl).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    x = torch.randn(BATCH, 3, TINY["image_size"], TINY["image_size"])
    with torch.inference_mode():
        expected, actual = model(x), plain_forward(model)(x)
    assert actual.shape == expected.shape == (BATCH, TINY["num_classes"])
    assert (actual - expected).abs().max().item() <= 1e-6


def test_the_plain_forward_refuses_another_config():
    with pytest.raises(ValueError, match=r"plain_forward computes the TINY config .* only, got ViTConfig\(.*depth=1"):
        plain_forward(ViT(**dict(TINY, depth=1)))


def fake(round_s: tuple[float, ...], median_s: float) -> Timing:
    return Timing(median_s, 0.0, len(round_s), round_s=round_s)


def test_the_row_and_its_line_on_fake_timings():
    """Model 300 us, plain ops 100 us in each of three rounds (one round 280 over 100): the ratio is the median of
    the per-round ratios, 3.0, the difference 200 us a call; the line says both times, the ratio and its interval."""
    row = overhead_row(fake((3e-4, 2.8e-4, 3e-4), 3e-4), fake((1e-4, 1e-4, 1e-4), 1e-4), 0.0)
    assert row["model_s"] == 3e-4 and row["plain_s"] == 1e-4 and row["overhead_s"] == pytest.approx(2e-4)
    assert row["time_ratio"] == pytest.approx(3.0) and row["rounds"] == 3 and not row["ratio_unresolved"]
    assert 2.8 - 1e-9 <= row["time_ratio_low"] <= row["time_ratio"] <= row["time_ratio_high"] <= 3.0 + 1e-9
    line = report.overhead_text(row)
    words = " ".join(line.split())
    assert words.startswith("Per-call overhead: a tiny ViT's forward call (2 blocks of width 48, 32 px images, "
                            "batch 2)")  # fmt: skip
    assert f"takes 300 us, the same math in plain torch ops 100 us: {report.ratio_cell(row)} times as long" in words
    assert words.endswith("(+200 us a call).") and max(map(len, line.splitlines())) <= report.TABLE_WIDTH


def test_one_round_has_no_interval_and_says_so():
    row = overhead_row(fake((2e-4,), 2e-4), fake((1e-4,), 1e-4), 0.0)
    assert row["time_ratio"] == 2.0 and row["time_ratio_low"] is None and row["ratio_unresolved"]
    assert "2.00? [one round] times as long" in " ".join(report.overhead_text(row).split())
