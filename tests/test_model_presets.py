"""Presets against Table 1 and the published parameter counts, torchsummary's total, timm's names, and the
training-readiness of a tiny model."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY_RGB16

from vit_einops import (
    FAMILIES,
    PRESETS,
    ClassificationHead,
    FeedForwardBlock,
    MultiHeadAttention,
    PatchEmbedding,
    ViT,
    ViTConfig,
    create_vit,
    list_presets,
)
from vit_einops.presets import TIMM_ARCHS
from vit_einops.network.sizes import parameter_count
from vit_einops.summary import count_parameters, meta_vit, summarize, zeroed_vit

# Published totals (torchvision's num_params for its vit_* models, and timm's) for 1000 classes at 224 px.
PUBLISHED = {
    "vit_ti_16": 5_717_416,
    "vit_s_16": 22_050_664,
    "vit_b_16": 86_567_656,
    "vit_b_32": 88_224_232,
    "vit_l_16": 304_326_632,
    "vit_l_32": 306_535_400,
    "vit_h_14": 632_045_800,
}


def count_formula(p: int, d: int, layers: int, image: int = 224, classes: int = 1000) -> int:
    """3P^2 D + D (patch projection) + D (class token) + N D (positions) + L (12 D^2 + 13 D) (blocks: qkv 3D^2+3D,
    proj D^2+D, MLP 8D^2+5D, two LayerNorms 4D) + 2 D (final LayerNorm) + D K + K (classifier)."""
    n = (image // p) ** 2 + 1
    return 3 * p * p * d + d + d + n * d + layers * (12 * d * d + 13 * d) + 2 * d + d * classes + classes


def test_presets_are_the_documented_set():
    assert list_presets() == [
        "vit_ti_16",
        "vit_s_16",
        "vit_s_32",
        "vit_b_16",
        "vit_b_32",
        "vit_l_16",
        "vit_l_32",
        "vit_h_14",
    ]


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count(name):
    model = meta_vit(name)
    cfg = model.config
    assert cfg.mlp_dim == 4 * cfg.dim
    expected = count_formula(cfg.patch_size[0], cfg.dim, cfg.depth)
    assert count_parameters(model) == expected
    if name in PUBLISHED:
        assert expected == PUBLISHED[name]


def test_table_1_sizes():
    sizes = {n: (p["depth"], p["dim"], p["mlp_dim"], p["heads"]) for n, p in PRESETS.items()}
    assert sizes["vit_b_16"] == (12, 768, 3072, 12)
    assert sizes["vit_l_16"] == (24, 1024, 4096, 16)
    assert sizes["vit_h_14"] == (32, 1280, 5120, 16)
    assert sizes["vit_ti_16"] == (12, 192, 768, 3) and sizes["vit_s_16"] == (12, 384, 1536, 6)


def torchsummary_total(model: ViT) -> int:
    cfg = model.config
    text = summarize(model.eval(), (cfg.in_channels, *cfg.image_size))
    line = next(row for row in text.splitlines() if row.startswith("Total params:"))
    return int(line.split(":")[1].replace(",", ""))


@pytest.mark.parametrize("name", [*PRESETS, *TIMM_ARCHS])
def test_the_layer_table_counts_every_parameter(name):
    """LayerScale's gamma, SigLIP's pooling query, the class, register and distillation tokens and the positions all
    count: the table's total is the model's parameter count, and the config's. On the meta device, at the preset's
    own size: torchsummary makes its input on the CPU, which a pre-hook moves to meta, so the forward computes
    shapes only (ViT-H in a fraction of a second)."""
    model = meta_vit(name)
    model.register_forward_pre_hook(lambda module, args: tuple(x.to("meta") for x in args))
    assert torchsummary_total(model) == count_parameters(model) == parameter_count(model.config)


def test_the_layer_table_counts_each_parameter_once_and_those_without_a_row():
    """torchsummary counts a Linear's weight again each time it runs, and never a parameter the model holds itself
    (no row is made for the model): the table counts the Linear once, and a row named by its path holds the other."""

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.scale = torch.nn.Parameter(torch.ones(3, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(x)) * self.scale

    lines = summarize(Twice(), (3, 4)).splitlines()
    top, bottom = (i for i, line in enumerate(lines) if line.startswith("="))
    rows = lines[top + 1 : bottom]
    assert [row.split()[0] for row in rows] == ["Linear-1", "Linear-2", "scale"]
    assert [row.split()[-1] for row in rows] == ["20", "0", "12"]
    assert rows[2] == f"{'scale':>20}  {'[3, 4]':>25} {12:>15}"
    assert "Total params: 32" in lines and "Params size (MB): 0.00" in lines


def test_torchsummary_total_vit_b_16_at_224():
    """The one full-size forward of the suite: batch 2 at 224 px through ViT-B/16."""
    assert torchsummary_total(zeroed_vit("vit_b_16")) == 86_567_656


def test_preset_overrides():
    model = create_vit("vit_ti_16", num_classes=10, image_size=32, attn_impl="sdpa")
    assert model.config.num_classes == 10 and model.config.image_size == (32, 32) and model.config.dim == 192
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def tiny(**kw) -> ViT:
    return ViT(**TINY_RGB16, **kw)


@pytest.mark.parametrize(
    "kw", [dict(), dict(pool="mean", patchify="linear"), dict(representation_size=16, attn_impl="sdpa")]
)
def test_every_parameter_gets_a_gradient(kw):
    torch.manual_seed(0)
    model = tiny(dropout=0.1, **kw).train()
    logits = model(torch.randn(4, 3, 16, 16))
    assert torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_eval_is_deterministic_and_train_applies_dropout():
    torch.manual_seed(0)
    model = tiny(dropout=0.3, attn_dropout=0.3)
    x = torch.randn(2, 3, 16, 16)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.allclose(model(x), model(x))


def test_initialisation():
    """Class token, positions and Linear weights: normal(0, 0.02) truncated at 2 std (never ones or zeros).

    Truncating N(0, s) at +-2s leaves a standard deviation of 0.880 s.
    """
    torch.manual_seed(0)
    model = create_vit("vit_ti_16")
    pos, cls = model.patch_embed.pos_embed.weight, model.patch_embed.cls_token.weight
    qkv = model.blocks[0].attn.mha.qkv
    assert pos.shape == (1, 197, 192) and cls.shape == (1, 1, 192)
    for w in (pos, cls, qkv.weight):
        assert w.abs().max() <= 0.04 + 1e-7
        assert abs(w.std().item() - 0.880 * 0.02) < 0.1 * 0.0176
    assert torch.equal(qkv.bias, torch.zeros_like(qkv.bias))


def test_state_dict_keys_are_readable():
    keys = list(tiny(representation_size=8).state_dict())
    assert keys[:4] == [
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "patch_embed.cls_token.weight",
        "patch_embed.pos_embed.weight",
    ]
    for key in [
        "blocks.1.attn.mha.qkv.weight",
        "blocks.1.mlp.ff.fc2.bias",
        "head.pre_logits.fc.weight",
        "head.fc.weight",
    ]:
        assert key in keys


def test_state_dict_keys_are_the_layers_own_under_fixed_paths():
    """A ViT's keys are its layers' keys, each layer built alone, under the paths the interop key tables spell
    (``blocks.{i}.attn.mha.``, ``blocks.{i}.mlp.ff.``...), in order; the layers' own keys are the names
    torchvision, timm and HF map to. Every option that adds a tensor is on."""
    options = dict(qk_norm=True, layer_scale=1e-5, distill_token=True, register_tokens=2, pre_norm=True)
    model = ViT(**TINY_RGB16, **options)
    c, d = model.config, TINY_RGB16["dim"]

    def under(path, module):
        return [f"{path}.{key}" for key in module.state_dict()]

    mha, ff = MultiHeadAttention(d, 4, qk_norm=True), FeedForwardBlock(d, 64)
    expected = under("patch_embed", PatchEmbedding(16, 4, 3, d, distill_token=True, register_tokens=2, pre_norm=True))
    for i in range(c.depth):
        norm = ["norm.weight", "norm.bias"]
        expected += [f"blocks.{i}.attn.{k}" for k in norm] + under(f"blocks.{i}.attn.mha", mha)
        expected += [f"blocks.{i}.attn.ls.gamma"] + [f"blocks.{i}.mlp.{k}" for k in norm]
        expected += under(f"blocks.{i}.mlp.ff", ff) + [f"blocks.{i}.mlp.ls.gamma"]
    expected += under("head", ClassificationHead(c))
    assert list(model.state_dict()) == expected
    qkv_proj = ["qkv.weight", "qkv.bias", "q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"]
    assert list(mha.state_dict()) == qkv_proj + ["proj.weight", "proj.bias"]
    assert list(ff.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert under("patch_embed", PatchEmbedding(16, 4, 3, d)) == [
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "patch_embed.cls_token.weight",
        "patch_embed.pos_embed.weight",
    ]


def test_slices_keep_working():
    model = tiny()
    x = torch.randn(2, 3, 16, 16)
    tokens = model[:2](x)
    assert tokens.shape == (2, 17, 32)
    torch.testing.assert_close(model.head(tokens), model(x))
    assert list(model[:2]._modules) == ["patch_embed", "blocks"]


# timm's vision_transformer.py registers these names with these (patch_size, embed_dim, depth, num_heads) and its
# defaults mlp_ratio 4, class-token pooling, 1000 classes; the _384 ones take 384 px images.
TIMM_ARGS = {
    "vit_tiny_patch16": (16, 192, 12, 3),
    "vit_small_patch16": (16, 384, 12, 6),
    "vit_small_patch32": (32, 384, 12, 6),
    "vit_base_patch16": (16, 768, 12, 12),
    "vit_base_patch32": (32, 768, 12, 12),
    "vit_large_patch16": (16, 1024, 24, 16),
    "vit_large_patch32": (32, 1024, 24, 16),
    "vit_huge_patch14": (14, 1280, 32, 16),
}


@pytest.mark.parametrize("name", [*FAMILIES["vit"].members, *FAMILIES["vit_384"].members])
def test_timm_names_build_timms_architecture(name):
    stem, size = name.rsplit("_", 1)
    p, d, depth, h = TIMM_ARGS[stem]
    cfg = meta_vit(name).config
    # the classes of timm's default tag: 0 for the in21k-only weights of vit_large_patch32_224 and vit_huge_patch14_224
    classes = 0 if name in ("vit_large_patch32_224", "vit_huge_patch14_224") else 1000
    assert cfg == ViTConfig(image_size=int(size), patch_size=p, dim=d, depth=depth, heads=h, mlp_dim=4 * d,
                            num_classes=classes)  # fmt: skip
    assert name in list_presets(timm_names=True) and name not in list_presets()


def test_unknown_name_lists_both_name_sets():
    with pytest.raises(ValueError) as err:
        create_vit("vit_base_patch8_224")
    message = str(err.value)
    assert message.startswith("unknown preset 'vit_base_patch8_224'; expected one of vit_ti_16, ")
    assert "or one of timm's names vit_tiny_patch16_224, " in message and "vit_huge_patch14_224" in message


def test_preset_name_must_be_a_str():
    with pytest.raises(TypeError, match=r"a preset name is a str, got \['vit_b_16'\] of type list"):
        create_vit(["vit_b_16"])
