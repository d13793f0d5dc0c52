"""Shape invariants after every stage, over random configurations (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from vit_einops import ATTN_IMPLS, ViT


@st.composite
def configs(draw):
    ph, pw = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    square = draw(st.booleans())
    gh = draw(st.integers(1, 4))
    gw = gh if square and ph == pw else draw(st.integers(1, 4))
    heads = draw(st.integers(1, 4))
    return dict(
        image_size=(gh * ph, gw * pw) if not (square and ph == pw) else gh * ph,
        patch_size=(ph, pw) if ph != pw else ph,
        in_channels=draw(st.integers(1, 4)),
        num_classes=draw(st.integers(0, 12)),
        dim=heads * draw(st.integers(1, 6)),
        depth=draw(st.integers(1, 3)),
        heads=heads,
        mlp_dim=draw(st.integers(1, 24)),
        pool=draw(st.sampled_from(["cls", "mean"])),
        attn_impl=draw(st.sampled_from(ATTN_IMPLS)),
        patchify=draw(st.sampled_from(["conv", "linear"])),
        representation_size=draw(st.one_of(st.none(), st.integers(1, 8))),
    )


@given(config=configs(), batch=st.integers(1, 3))
def test_shape_after_every_stage(config, batch):
    model = ViT(**config).eval()
    cfg = model.config
    (h, w), (ph, pw) = cfg.image_size, cfg.patch_size
    n_patches = (h // ph) * (w // pw)
    x = torch.randn(batch, cfg.in_channels, h, w)
    tokens = model.patch_embed(x)
    assert tokens.shape == (batch, n_patches + 1, cfg.dim) == (batch, cfg.num_tokens, cfg.dim)
    for block in model.blocks:
        after_attn = block.attn(tokens)
        assert after_attn.shape == tokens.shape
        tokens = block.mlp(after_attn)
        assert tokens.shape == (batch, n_patches + 1, cfg.dim)
    features = model.head[:-1](tokens)
    width = cfg.representation_size or cfg.dim
    assert features.shape == (batch, width)
    logits = model.head.fc(features)
    assert logits.shape == ((batch, cfg.num_classes) if cfg.num_classes else (batch, width))
    torch.testing.assert_close(model(x), logits)
