"""timm's ViT families in timm's key layout, with torch alone (tests/test_interop_timm_families.py holds them against
timm itself): every new part's keys both ways, what the keys tell and what arch= (TIMM_ARCHS) must tell, timm_kwargs
for each, create_vit(TIMM_NAME), ``--arch`` on the command line, and the refusals."""

from __future__ import annotations

import pytest
import torch
from _interop import TINY, assert_same_state, perturbed

from vit_einops import ViT, ViTConfig, create_vit, load_vit, parameter_count, save_vit
from vit_einops import presets
from vit_einops.commands.cli import main
from vit_einops.interop import (
    from_timm,
    load_state_dict_file,
    load_timm,
    save_state_dict_file,
    timm_class,
    timm_config,
    timm_kwargs,
    to_timm,
)
from vit_einops.preprocess import CLIP_MEAN
from vit_einops.presets import TIMM_ARCHS, timm_arch

# Each family's parts at TINY's size (4 heads; act and eps are what no key tells, passed to timm_config).
FAMILIES = {
    "dinov2 registers": dict(register_tokens=4, layer_scale=1e-5, pos_embed_prefix=False, num_classes=0),
    "deit distilled": dict(distill_token=True),
    "deit3": dict(layer_scale=1e-6, pos_embed_prefix=False),
    "clip quick-gelu": dict(pre_norm=True, patch_bias=False, layer_norm_eps=1e-5, act="quick_gelu"),
    "siglip": dict(class_token=False, pool="map", num_classes=0),
    "qk-norm gelu_tanh": dict(qk_norm=True, act="gelu_tanh"),
    "no class token, avg": dict(class_token=False, pool="mean"),
}
# The timm keys each family adds, and the one it drops.
NEW_KEYS = {
    "dinov2 registers": (["reg_token", "blocks.1.ls2.gamma"], "head.weight"),
    "deit distilled": (["dist_token", "head_dist.weight", "head_dist.bias"], None),
    "deit3": (["blocks.0.ls1.gamma"], None),
    "clip quick-gelu": (["norm_pre.weight", "norm_pre.bias"], "patch_embed.proj.bias"),
    "siglip": ([f"attn_pool.{k}" for k in ("latent", "q.weight", "kv.bias", "proj.weight", "norm.bias",
                                           "mlp.fc1.weight", "mlp.fc2.bias")], "cls_token"),  # fmt: skip
    "qk-norm gelu_tanh": (["blocks.1.attn.q_norm.weight", "blocks.1.attn.k_norm.bias"], None),
    "no class token, avg": ([], "cls_token"),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_round_trip_is_exact(family):
    """Our model -> timm keys -> the same config read off them (told only heads, act and eps) -> the same tensors."""
    model = perturbed(ViT(**{**TINY, **FAMILIES[family]}))
    theirs = to_timm(model)
    added, dropped = NEW_KEYS[family]
    assert set(added) <= set(theirs) and dropped not in theirs
    told = {k: getattr(model.config, k) for k in ("act", "layer_norm_eps")}
    config = timm_config(theirs, heads=4, **told)
    # LayerScale's init is not in the weights: without arch=, timm's DINOv2 value
    assert config == ViTConfig(**{**model.config.to_dict(), "layer_scale": config.layer_scale})
    assert (config.layer_scale is None) == (model.config.layer_scale is None)
    assert_same_state(from_timm(theirs, config), model.state_dict())
    assert_same_state(to_timm(load_timm(theirs, heads=4, **told)), theirs)


def test_timm_kwargs_name_each_part():
    clip = timm_kwargs(ViT(**{**TINY, **FAMILIES["clip quick-gelu"]}).config)
    assert clip["pre_norm"] is True and clip["act_layer"] == "quick_gelu"
    assert clip["norm_layer"].keywords == {"eps": 1e-5}
    siglip = timm_kwargs(ViT(**{**TINY, **FAMILIES["siglip"]}).config)
    assert (siglip["class_token"], siglip["global_pool"], siglip["num_classes"]) == (False, "map", 0)
    assert "act_layer" not in siglip and "norm_layer" not in siglip  # timm's defaults: GELU, LayerNorm eps 1e-6
    assert timm_kwargs(ViT(**{**TINY, "qk_norm": True}).config)["qk_norm"] is True
    assert timm_kwargs(ViT(**{**TINY, "dynamic_size": "timm"}).config)["dynamic_img_size"] is True
    deit = ViT(**{**TINY, **FAMILIES["deit distilled"]}).config
    assert timm_class(deit) == "timm.models.deit.VisionTransformerDistilled"
    assert timm_class(ViT(**TINY).config) == "timm.models.vision_transformer.VisionTransformer"


def _timm_shapes(name: str, **overrides) -> dict[str, torch.Tensor]:
    """timm's state dict of ``name``, as shapes only (meta tensors: nothing allocated)."""
    with torch.device("meta"):
        return to_timm(create_vit(name, **overrides))


@pytest.mark.parametrize("name", [*TIMM_ARCHS, "vit_small_patch16_224.dino", "vit_base_patch16_clip_224.openai"])
def test_create_vit_builds_each_arch_and_arch_reads_it_back(name):
    with torch.device("meta"):
        model = create_vit(name)
    assert model.config == ViTConfig(**timm_arch(name))
    assert parameter_count(model.config) == sum(p.numel() for p in model.parameters())
    assert timm_config(to_timm(model), arch=name) == model.config


def test_arch_supplies_what_no_key_holds():
    """Quick-GELU, eps 1e-5, h 12 and DeiT III's init 1e-6 are nowhere in the tensors: arch= tells them."""
    clip = _timm_shapes("vit_base_patch16_clip_quickgelu_224")
    with pytest.raises(ValueError, match=r"fits 2 of timm's architectures, which differ in what no tensor holds: "
                       r"vit_base_patch16_clip_224 \(act 'gelu', its preprocessing\), "
                       r"vit_base_patch16_clip_quickgelu_224 \(act 'quick_gelu', its preprocessing\)\. Name the one "
                       r"it is: arch=NAME \(on the command line, --arch NAME\)$"):  # fmt: skip
        timm_config(clip)
    told = timm_config(clip, arch="vit_base_patch16_clip_quickgelu_224")
    assert (told.act, told.layer_norm_eps, told.heads, told.pre_norm, told.patch_bias) == ("quick_gelu", 1e-5, 12,
                                                                                          True, False)  # fmt: skip
    assert timm_config(_timm_shapes("deit3_small_patch16_224"), arch="deit3_small_patch16_224").layer_scale == 1e-6
    assert timm_config(_timm_shapes("vit_base_patch16_siglip_224")).pool == "map"  # read off attn_pool.*


@pytest.mark.parametrize(
    ("name", "arch", "embedding"),
    [
        ("vit_base_patch16_clip_224.openai", "vit_base_patch16_clip_224.openai", True),
        ("vit_base_patch16_clip_224.openai", "vit_base_patch16_clip_224", True),  # all its 512-wide tags project
        ("vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_clip_quickgelu_224", True),  # default: metaclip
        ("vit_base_patch16_clip_224.openai_ft_in1k", "vit_base_patch16_clip_224.openai_ft_in1k", False),
        ("vit_base_patch16_clip_224", "vit_base_patch16_clip_224", False),  # default: fine-tuned on ImageNet-1k
    ],
)  # fmt: skip
def test_a_clip_tags_projection_head_reads_as_an_embedding(name, arch, embedding):
    """The family registry says which of CLIP's tags hold the image projection (presets' ``projections``): a model
    of one, built or read from timm's keys with that arch, outputs an embedding, not class logits."""
    with torch.device("meta"):
        model = create_vit(name)
    assert (model.config.embedding, model.has_classifier) == (embedding, not embedding)
    config = timm_config(to_timm(model), arch=arch)
    assert (config.embedding, config.num_classes) == (embedding, model.num_classes)
    assert not timm_config(to_timm(model), arch=arch, embedding=False).embedding  # a loader may be told otherwise


def test_only_the_registrys_projection_tags_are_embeddings():
    """A plain ViT of 512 outputs, and a CLIP tower read without its head, are no projection."""
    assert not timm_config(_timm_shapes("vit_base_patch16_224", num_classes=512), arch="vit_base_patch16_224").embedding
    headless = _timm_shapes("vit_base_patch16_clip_224.openai", num_classes=0)
    assert timm_config(headless, arch="vit_base_patch16_clip_224").embedding is False
    with torch.device("meta"):  # a new head of other outputs (timm's create_model(name, num_classes=10)) classifies
        assert create_vit("vit_base_patch16_clip_224.openai", num_classes=10).has_classifier
    with pytest.raises(ValueError, match=r"^family x: projections \['openai'\] are not tags of it with a head$"):
        presets.Family("x", "", members={}, tags={"vit_base_patch16_224": {"orig_in21k": 0}}, norm=presets._CLIP,
                       projections=("openai",))  # fmt: skip


# ---- refusals ----


def test_unknown_arch_lists_close_names():
    shapes = _timm_shapes("vit_small_patch14_dinov2")
    with pytest.raises(ValueError, match=r"unknown preset 'vit_small_patch14_dinov3'; .*; close names: "
                       r"vit_small_patch14_dinov2, vit_small_patch14_reg4_dinov2"):  # fmt: skip
        timm_config(shapes, arch="vit_small_patch14_dinov3")
    with pytest.raises(ValueError, match=r"unknown timm pretrained tag 'lvd' of vit_small_patch14_dinov2; known tags: "
                       r"vit_small_patch14_dinov2.lvd142m$"):  # fmt: skip
        timm_config(shapes, arch="vit_small_patch14_dinov2.lvd")
    with pytest.raises(TypeError, match="a timm model name is a str, got 3 of type int"):
        timm_config(shapes, arch=3)


def test_arch_that_disagrees_with_the_state_dict_names_each_field():
    with pytest.raises(ValueError, match=r"^the timm state dict is not a vit_small_patch14_reg4_dinov2: "
                       r"register_tokens 0 \(timm's vit_small_patch14_reg4_dinov2 has 4\); pos_embed_prefix True "
                       r"\(timm's vit_small_patch14_reg4_dinov2 has False\)\. Load it without arch="):  # fmt: skip
        timm_config(_timm_shapes("vit_small_patch14_dinov2"), arch="vit_small_patch14_reg4_dinov2")
    with pytest.raises(ValueError, match=r"layer_scale None \(timm's deit3_small_patch16_224 has 1e-06\); "
                       r"pos_embed_prefix True \(timm's deit3_small_patch16_224 has False\)\."):  # fmt: skip
        timm_config(_timm_shapes("vit_small_patch16_224"), arch="deit3_small_patch16_224")
    with pytest.raises(ValueError, match=r"num_classes 512 \(timm's vit_base_patch16_clip_224.laion2b_ft_in1k has "
                       r"1000\); the tags with 512 classes: vit_base_patch16_clip_224.datacompxl, "):  # fmt: skip
        timm_config(_timm_shapes("vit_base_patch16_clip_224.openai"), arch="vit_base_patch16_clip_224.laion2b_ft_in1k")
    with pytest.raises(ValueError, match=r"image_size \(224, 224\) \(timm's vit_small_patch14_dinov2 has "
                       r"\(518, 518\)\); image_size= names a checkpoint's other resolution\."):  # fmt: skip
        timm_config(_timm_shapes("vit_small_patch14_dinov2.lvd142m", image_size=224), arch="vit_small_patch14_dinov2")
    at_224 = _timm_shapes("vit_small_patch14_dinov2", image_size=224)
    assert timm_config(at_224, arch="vit_small_patch14_dinov2", image_size=224).image_size == (224, 224)
    with pytest.raises(ValueError, match=r"register_tokens 0 \(timm's vit_small_patch14_reg4_dinov2 has 4\)"):
        timm_config(at_224, arch="vit_small_patch14_reg4_dinov2", image_size=224)  # a size given, the rest checked
    # untagged, the classes are the file's own (a fine-tuned head), as create_vit(name, weights=...) allows
    openai = _timm_shapes("vit_base_patch16_clip_224.openai")
    assert timm_config(openai, arch="vit_base_patch16_clip_224").num_classes == 512


def test_global_pool_that_contradicts_the_keys_is_refused():
    with pytest.raises(ValueError, match=r"global_pool 'map' does not fit the timm state dict, which has no attention "
                       r"pooling \(attn_pool.\*\): its global_pool is 'token'"):  # fmt: skip
        timm_config(to_timm(ViT(**TINY)), heads=4, global_pool="map")
    with pytest.raises(ValueError, match=r"global_pool 'avg' does not fit .* which has attention pooling"):
        timm_config(to_timm(ViT(**{**TINY, **FAMILIES["siglip"]})), heads=4, global_pool="avg")


def test_configs_timm_cannot_build_are_refused():
    with pytest.raises(ValueError, match=r"timm's VisionTransformerDistilled gives its prefix tokens position rows"):
        to_timm(ViT(**TINY, distill_token=True, pos_embed_prefix=False))
    with pytest.raises(ValueError, match=r"patch_bias False with pre_norm False"):
        timm_kwargs(ViT(**TINY, patch_bias=False).config)


# ---- the command line and create_vit(name, weights=PATH), on a tiny arch in the table ----

TINY_ARCH = "vit_tiny_test_clip_quickgelu"


@pytest.fixture
def tiny_arch(monkeypatch, tmp_path):
    """A CLIP-like tiny family in the registry, and a timm file of it (quick-GELU: no key says so)."""
    fields = {**TINY, "heads": 2, **FAMILIES["clip quick-gelu"]}
    family = presets.Family("tiny", "a test", members={TINY_ARCH: fields}, tags={TINY_ARCH: {"test": 5}},
                            norm=presets.FAMILIES["clip"].norm)  # fmt: skip
    monkeypatch.setitem(presets.FAMILIES, family.name, family)
    monkeypatch.setitem(presets.TIMM_ARCHS, TINY_ARCH, fields)
    model = perturbed(ViT(**fields))
    return model, save_state_dict_file(to_timm(model), tmp_path / "clip.safetensors")


def test_convert_with_arch_and_create_vit_with_weights(tiny_arch, tmp_path, capsys):
    model, src = tiny_arch
    dst = tmp_path / "m.safetensors"
    assert main(["convert", str(src), str(dst), "--from", "timm", "--arch", TINY_ARCH]) == 0
    loaded = load_vit(dst)
    assert loaded.config == model.config and loaded.source["arch"] == TINY_ARCH
    assert_same_state(loaded.state_dict(), model.state_dict())
    back = tmp_path / "back.safetensors"
    assert main(["convert", str(dst), str(back), "--to", "timm"]) == 0
    out = capsys.readouterr().out
    assert "timm.models.vision_transformer.VisionTransformer(**{" in out and "'act_layer': 'quick_gelu'" in out
    assert_same_state(load_state_dict_file(back), load_state_dict_file(src))
    assert create_vit(TINY_ARCH, weights=src).config == model.config  # the name is the arch: act, eps, h


def test_arch_flag_on_a_file_that_is_not_timms_is_refused(tiny_arch, tmp_path, capsys):
    model, src = tiny_arch
    ours = tmp_path / "ours.safetensors"
    save_vit(model, ours)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["convert", str(ours), str(tmp_path / "x.safetensors"), "--arch", TINY_ARCH]) == 2
    assert "--arch describes torchvision/timm files; a vit-einops or Hugging Face model states its own" in (
        capsys.readouterr().err
    )
    assert main(["convert", str(src), str(tmp_path / "x.pth"), "--from", "torchvision", "--arch", TINY_ARCH]) == 2
    assert "--arch describes timm files; " in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    siglip = "vit_base_patch16_siglip_224"
    assert main(["convert", str(src), str(tmp_path / "y.safetensors"), "--from", "timm", "--arch", siglip]) == 2
    assert "the timm state dict is not a vit_base_patch16_siglip_224: patch_size (8, 8)" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"])
def test_summary_counts_a_family_at_its_own_size_and_classes(name, capsys):
    """DINOv2 at 518 px without a classifier, SigLIP with attention pooling: the table's config, not 224 px and 1000
    classes (timm's count for each: tests/test_interop_timm_families.py)."""
    assert main(["summary", name, "--no-table"]) == 0
    assert capsys.readouterr().out.endswith(f"{name}: {parameter_count(ViTConfig(**timm_arch(name))):,} parameters\n")


def test_a_family_loaded_by_arch_reads_photos_as_timm_does_for_it(monkeypatch):
    """load_timm(arch=) records the family's preprocessing, not the augreg ViTs' mean = std = 0.5: a DINOv2 file
    normalises with ImageNet's mean and std at crop_pct 1.0, CLIP's with OpenAI's at 0.9; without arch=,
    the tensors name the family just as well (each fits one arch alone). The two archs are shrunk in the table, so
    their files are tiny."""
    small = dict(dim=32, depth=1, heads=2, mlp_dim=64)
    for name, size, mean, resize in (
        ("vit_small_patch14_reg4_dinov2", 56, (0.485, 0.456, 0.406), 56),
        ("vit_base_patch16_clip_224", 32, CLIP_MEAN, int(32 / 0.95)),
    ):
        monkeypatch.setitem(presets.TIMM_ARCHS, name, {**presets.TIMM_ARCHS[name], **small, "image_size": size})
        model = create_vit(name)
        loaded = load_timm(to_timm(model), arch=name)
        assert loaded.preprocessing == model.preprocessing
        assert (loaded.preprocessing.mean, loaded.preprocessing.resize) == (mean, resize)
        detected = load_timm(to_timm(model))
        assert (detected.preprocessing, detected.source["arch"], detected.config) == (
            model.preprocessing, name, model.config
        )
