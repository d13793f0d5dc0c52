"""timm's ViT families against timm itself: DINO, DINOv2 (with registers), DeiT (distilled), DeiT III, CLIP (and
OpenAI's quick-GELU), SigLIP and MAE, each as a tiny timm model built with that family's own kwargs (written here as
timm's registered model functions pass them, not derived from our timm_kwargs), loaded, compared, and sent back.

Each family is compared at its native size and at two others, timm with ``dynamic_img_size=True`` and ours with
``dynamic_size="timm"``, both resampling E_pos inside their forward. float32, max |difference| <= 1e-5 on
``forward_features`` and on the logits (the pooled features for a model without a classifier); every measurement
goes to the interop report (tests/_interop.py report_diffs) under the family's timm name.

The registry of families (vit_einops.presets.FAMILIES) is held to timm's own models: each name's state dict
(built on the meta device, nothing computed) reads back as the table's config, with timm's parameter count.
"""

from __future__ import annotations

import importlib
from functools import partial

import pytest
import torch
from _interop import assert_same_state, interop_library, perturbed, report_diffs

from vit_einops import ViTConfig, create_vit, parameter_count
from vit_einops.interop import load_timm, timm_class, timm_config, timm_kwargs, to_timm
from vit_einops import presets
from vit_einops.presets import TIMM_ARCHS, tags_of, timm_arch, timm_preprocessing

timm = interop_library("timm")
from timm.models.deit import VisionTransformerDistilled  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

TOL = 1e-5
DIFFS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    report_diffs(DIFFS)


# The family kwargs of each timm name (timm 1.0's vision_transformer.py / deit.py model functions), at a tiny size:
# D 32, L 2, h 2, patch 8 (7 for the patch-14 families). ``act`` and ``eps`` are what no tensor holds: we are told.
TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
FAMILIES: dict[str, dict] = {
    "vit_small_patch16_224.dino": dict(num_classes=0),
    "vit_small_patch14_dinov2": dict(patch_size=7, init_values=0.5, num_classes=0),
    "vit_small_patch14_reg4_dinov2": dict(patch_size=7, init_values=0.5, reg_tokens=4, no_embed_class=True,
                                          num_classes=0),
    "deit_tiny_distilled_patch16_224": dict(cls=VisionTransformerDistilled, num_classes=10),
    "deit3_small_patch16_224": dict(init_values=0.5, no_embed_class=True, num_classes=10),
    "vit_base_patch16_clip_224": dict(pre_norm=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5), num_classes=10,
                                      eps=1e-5),
    "vit_base_patch16_clip_quickgelu_224": dict(pre_norm=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5),
                                                act_layer="quick_gelu", num_classes=10, eps=1e-5, act="quick_gelu"),
    "vit_base_patch16_siglip_224": dict(class_token=False, global_pool="map", num_classes=0),
    "vit_base_patch16_224.mae": dict(num_classes=0),
}  # fmt: skip
# (native size, two others): patch 8 -> 32 px (4 x 4), 48, 24 x 40; patch 7 -> 28 px, 56, 21 x 35.
SIZES = {8: (32, 48, (24, 40)), 7: (28, 56, (21, 35))}


def _size_name(size) -> str:
    return f"{size[0]}x{size[1]}" if isinstance(size, tuple) else str(size)


def _tiny_timm(name: str) -> tuple[torch.nn.Module, dict]:
    kwargs = dict(FAMILIES[name])
    cls = kwargs.pop("cls", VisionTransformer)
    # What no tensor holds, as timm builds it (nn.GELU, LayerNorm eps 1e-6 unless the family says otherwise): a tiny
    # family model fits no arch of the table, so it is read as told.
    ours = {"act": kwargs.pop("act", "gelu"), "layer_norm_eps": kwargs.pop("eps", 1e-6)}
    patch = kwargs.setdefault("patch_size", 8)
    torch.manual_seed(0)
    model = cls(img_size=SIZES[patch][0], dynamic_img_size=True, **TINY, **kwargs)
    return perturbed(model), ours


def _max_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape
    return (actual - expected).abs().max().item()


def _compare(tag: str, ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> None:
    """forward_features and the output (logits, or pooled features without a classifier) within TOL."""
    with torch.no_grad():
        rows = {
            "forward_features": (ours.forward_features(x), theirs.forward_features(x)),
            "logits" if ours.config.num_classes else "pooled": (ours(x), theirs(x)),
        }
    for what, (actual, expected) in rows.items():
        diff = DIFFS[f"{tag} {what}"] = _max_diff(actual, expected)
        assert diff <= TOL, f"{tag} {what}: max |difference| {diff:.2e} > {TOL:g}"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiny_family_both_ways_at_three_sizes(name):
    """timm -> ours: the parts read off the keys (class/distillation/register tokens, pre-norm, patch bias,
    LayerScale, attention pooling, which tokens E_pos covers), equal outputs at three sizes. Ours -> timm: the class
    and kwargs we name build a timm model that takes our export bit for bit and computes the same."""
    tm, told = _tiny_timm(name)
    state = tm.state_dict()
    model = load_timm(state, heads=2, dynamic_size="timm", **told)
    assert model.config.dynamic_size == "timm"
    for size in SIZES[model.config.patch_size[0]]:
        h, w = size if isinstance(size, tuple) else (size, size)
        _compare(f"timm {name} (tiny) {_size_name(size)}", model, tm, torch.randn(2, 3, h, w))
    assert_same_state(to_timm(model), state)
    module, cls = timm_class(model.config).rsplit(".", 1)
    assert getattr(importlib.import_module(module), cls) is type(tm)
    back = type(tm)(**timm_kwargs(model.config)).eval()
    back.load_state_dict(to_timm(model))
    size = SIZES[model.config.patch_size[0]][1]
    _compare(f"timm {name} (tiny) {size} from our export", model, back, torch.randn(2, 3, size, size))


def test_without_dynamic_size_other_sizes_are_refused_as_timm_does():
    """dynamic_size is opt-in, as timm's dynamic_img_size: a model loaded without it takes its own size only."""
    tm, told = _tiny_timm("vit_small_patch14_reg4_dinov2")
    model = load_timm(tm.state_dict(), heads=2, **told)
    assert model.config.dynamic_size is None and timm_kwargs(model.config)["dynamic_img_size"] is False
    with pytest.raises(ValueError, match=r"dynamic_size='timm'"):
        model(torch.randn(1, 3, 56, 56))


# Real sizes, random weights, compared once at the native size: the small ones only (the test time).
@pytest.mark.parametrize("name", ["deit_tiny_distilled_patch16_224", "vit_small_patch16_224.dino",
                                  "vit_small_patch14_reg4_dinov2"])  # fmt: skip
def test_real_size_by_name(name):
    torch.manual_seed(0)
    tm = perturbed(timm.create_model(name, pretrained=False))
    model = load_timm(tm.state_dict(), arch=name)
    assert model.config == ViTConfig(**timm_arch(name))
    size = model.config.image_size[0]
    _compare(f"timm {name} {size}", model, tm, torch.randn(1, 3, size, size))


# The contract every entry of the registry is held to, parametrised over it (a new family or tag is tested without
# new test code): every name and every tag of every family.
TAGGED = [f"{name}.{tag}" for family in presets.FAMILIES.values() for name, tags in family.tags.items() for tag in tags]
ARCH_NAMES = [*TIMM_ARCHS, *TAGGED]


@pytest.mark.parametrize("name", ARCH_NAMES)
def test_table_equals_timms_architecture(name):
    with torch.device("meta"):
        tm = timm.create_model(name, pretrained=False)
        ours = create_vit(name)
    expected = ViTConfig(**timm_arch(name))
    assert ours.config == expected
    count = sum(p.numel() for p in tm.parameters())
    assert parameter_count(expected) == count == sum(p.numel() for p in ours.parameters())
    shapes = {k: torch.empty(v.shape) for k, v in tm.state_dict().items()}
    assert timm_config(shapes, arch=name) == expected
    assert type(tm).__name__ == timm_class(expected).rsplit(".", 1)[1]


PROJECTION_TAGS = [f"{name}.{tag}" for family in presets.FAMILIES.values() for name in family.tags
                   for tag in family.projections]  # fmt: skip


@pytest.mark.parametrize("name", [*PROJECTION_TAGS, "vit_base_patch16_clip_224.openai_ft_in1k"])
def test_clip_projection_tags_read_as_embedding_heads(name):
    """timm's CLIP image towers keep their projection as ``head`` (num_classes its width): read off timm's own model
    of that tag (real size, meta device), with the tag or the name alone, it is an embedding head, not a classifier;
    a fine-tuned tag's head is a classifier."""
    base, _, tag = name.partition(".")
    projection = tag in presets.family_of(name).projections
    with torch.device("meta"):
        tm = timm.create_model(name, pretrained=False)
    shapes = {k: torch.empty(v.shape) for k, v in tm.state_dict().items()}
    for arch in (name, base):
        config = timm_config(shapes, arch=arch)
        assert (config.embedding, config.has_classifier, config.num_classes) == (projection, not projection,
                                                                                 tm.num_classes), arch  # fmt: skip


def test_a_tiny_clip_projection_tower_outputs_timms_embedding_and_predicts_nothing():
    """timm's vit_base_patch16_clip_224.openai built tiny by its own kwargs (its tag's 512-wide projection head):
    no arch of the registry fits its widths, so it is read as told (the projection with embedding=True); its output
    is timm's, and it predicts no class."""
    from vit_einops import predict

    torch.manual_seed(0)
    tm = perturbed(timm.create_model("vit_base_patch16_clip_224.openai", pretrained=False, img_size=32, patch_size=8,
                                     **TINY))  # fmt: skip
    assert tm.num_classes == 512
    model = load_timm(tm.state_dict(), heads=2, act="gelu", layer_norm_eps=1e-5, embedding=True)
    assert (model.config.embedding, model.has_classifier, model.num_classes) == (True, False, 512)
    _compare("timm vit_base_patch16_clip_224.openai (tiny) 32 embedding", model, tm, torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"^this model outputs a 512-wide embedding \(its head is an embedding "
                                         r"projection"):  # fmt: skip
        predict(model, torch.rand(1, 3, 32, 32))


def test_tags_hold_timms_classes():
    for base in TIMM_ARCHS:
        tags = tags_of(base)
        for tag, classes in tags.items():
            assert timm.models.get_pretrained_cfg(f"{base}.{tag}").num_classes == classes, f"{base}.{tag}"
        default = timm.models.get_pretrained_cfg(base)  # the name alone: timm's default tag
        assert next(iter(tags)) == default.tag and timm_arch(base)["num_classes"] == default.num_classes, base


@pytest.mark.parametrize("name", ARCH_NAMES)
def test_family_preprocessing_is_timms_data_config(name):
    """What create_vit(name) and load_timm(arch=name) record equals timm's own eval transform for those weights:
    mean, std, interpolation and the resize its crop_pct gives (timm.data.resolve_data_config on the name's
    pretrained_cfg)."""
    cfg = timm.data.resolve_data_config({}, pretrained_cfg=timm.models.get_pretrained_cfg(name).to_dict())
    ours = timm_preprocessing(name)
    size = cfg["input_size"][1:]
    assert ours.crop == size and ours.interpolation == cfg["interpolation"]
    assert ours.mean == pytest.approx(cfg["mean"], abs=1e-8) and ours.std == pytest.approx(cfg["std"], abs=1e-8)
    assert ours.resize == int(size[0] / cfg["crop_pct"])  # timm: floor(size / crop_pct) on the shorter side
    assert create_vit(name, dim=32, depth=1, heads=2, mlp_dim=64).preprocessing == ours  # small: the same transform
