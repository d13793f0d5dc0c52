"""A timm file read without ``arch=`` / ``--arch``: the arch its tensors determine, or a refusal listing the
candidates, never the paper's defaults for a family's file; and the offline hint's command names the arch. The real
archs are shrunk in the table (monkeypatch), so their files are tiny and made with torch alone."""

from __future__ import annotations

import pytest
import torch
from _interop import TINY, assert_same_state, perturbed

from vit_einops import ViT, ViTConfig, create_vit, load_model, load_vit
from vit_einops import presets
from vit_einops.base.download import DownloadError
from vit_einops.commands.cli import main
from vit_einops.interop import load_timm, save_state_dict_file, timm_config, to_timm
from vit_einops.preprocess import CLIP_MEAN, IMAGENET_MEAN, Preprocessing

CLIP = "vit_base_patch16_clip_224"
QUICKGELU = "vit_base_patch16_clip_quickgelu_224"
DINOV2 = "vit_small_patch14_reg4_dinov2"
SMALL = dict(dim=32, depth=1, heads=2, mlp_dim=64)


def _shrink(monkeypatch, name: str, **fields) -> ViT:
    """Arch ``name`` at SMALL's width in the table, and a model of it with noise on every weight."""
    monkeypatch.setitem(presets.TIMM_ARCHS, name, {**presets.TIMM_ARCHS[name], **SMALL, "image_size": 32, **fields})
    return perturbed(create_vit(name))


def test_a_clip_file_without_arch_is_read_as_clip(monkeypatch, tmp_path, capsys):
    """Pre-norm and no patch bias fit CLIP alone (its quick-GELU sibling is still ViT-B wide): LayerNorm eps 1e-5 and
    CLIP's mean and std, as with arch=, on every path: load_timm, load_model and `convert` without --arch."""
    model = _shrink(monkeypatch, CLIP)
    theirs = to_timm(model)
    loaded = load_timm(theirs)
    assert loaded.config == model.config and loaded.config.layer_norm_eps == 1e-5
    assert loaded.preprocessing == model.preprocessing and loaded.preprocessing.mean == CLIP_MEAN
    assert loaded.source["arch"] == CLIP
    assert_same_state(loaded.state_dict(), model.state_dict())
    src = save_state_dict_file(theirs, tmp_path / "clip.safetensors")
    assert load_model(src).config.layer_norm_eps == 1e-5
    dst = tmp_path / "out.safetensors"
    assert main(["convert", str(src), str(dst)]) == 0
    converted = load_vit(dst)
    assert (converted.config, converted.preprocessing) == (model.config, model.preprocessing)
    assert converted.source["arch"] == CLIP


def test_a_file_two_archs_fit_is_refused_listing_them(monkeypatch, tmp_path, capsys):
    """CLIP with GELU and with quick-GELU hold the same tensors: neither is guessed; the message names both, what
    tells them apart, and the flag to pass. Nothing is written."""
    model = _shrink(monkeypatch, CLIP)
    _shrink(monkeypatch, QUICKGELU, num_classes=model.config.num_classes)
    listed = (
        rf"^the timm state dict fits 2 of timm's architectures, which differ in what no tensor holds: {CLIP} \(act "
        rf"'gelu', its preprocessing\), {QUICKGELU} \(act 'quick_gelu', its preprocessing\)\. Name the one it is: "
        r"arch=NAME \(on the command line, --arch NAME\)$"
    )
    with pytest.raises(ValueError, match=listed):
        load_timm(to_timm(model))
    src = save_state_dict_file(to_timm(model), tmp_path / "clip.safetensors")
    assert main(["convert", str(src), str(tmp_path / "out.safetensors")]) == 2
    assert f"{QUICKGELU} (act 'quick_gelu', its preprocessing)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.safetensors"]
    assert main(["convert", str(src), str(tmp_path / "out.safetensors"), "--arch", QUICKGELU]) == 0
    assert load_vit(tmp_path / "out.safetensors").config.act == "quick_gelu"


def test_a_dinov2_file_without_arch_gets_dinov2s_preprocessing(monkeypatch):
    """Registers and LayerScale fit DINOv2 with registers alone: ImageNet's mean and std at crop_pct 1.0, not the
    augreg ViTs' 0.5 and a resize of crop / 0.9."""
    model = _shrink(monkeypatch, DINOV2, image_size=28)
    loaded = load_timm(to_timm(model))
    assert loaded.config == model.config and loaded.source["arch"] == DINOV2
    assert loaded.preprocessing == Preprocessing.timm(28, 1.0, mean=IMAGENET_MEAN, std=(0.229, 0.224, 0.225))
    assert loaded.preprocessing.resize == 28


def test_a_family_file_no_arch_fits_is_refused_naming_its_parts(tmp_path, capsys):
    """A CLIP-like file of a size no arch has: the paper's eps 1e-6 would read it as another model, so it is refused,
    naming what it holds; told heads, act and eps, it is read as told."""
    fields = {**TINY, "pre_norm": True, "patch_bias": False, "layer_norm_eps": 1e-5}
    theirs = to_timm(perturbed(ViT(**fields)))
    refused = (
        r"^the timm state dict holds pre_norm True, patch_bias False, parts of "
        r"timm's ViT families, but fits none of their architectures \(vit_einops.presets.FAMILIES\): its heads, "
        r"activation and LayerNorm eps are nowhere in its tensors\. Name its architecture: arch=NAME \(on the command "
        r"line, --arch NAME\), or pass heads=, act= and layer_norm_eps= \(--heads, --act and --layer-norm-eps\)$"
    )
    with pytest.raises(ValueError, match=refused):
        load_timm(theirs, heads=TINY["heads"])
    with pytest.raises(ValueError, match=refused):
        timm_config(theirs, heads=TINY["heads"], act="gelu")
    told = timm_config(theirs, heads=TINY["heads"], act="gelu", layer_norm_eps=1e-5)
    assert told == ViT(**fields).config
    src = save_state_dict_file(theirs, tmp_path / "clip.safetensors")
    assert main(["convert", str(src), str(tmp_path / "out.safetensors"), "--heads", str(TINY["heads"])]) == 2
    assert "holds pre_norm True, patch_bias False" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.safetensors"]
    told_flags = ["--heads", str(TINY["heads"]), "--act", "gelu", "--layer-norm-eps", "1e-5"]
    assert main(["convert", str(src), str(tmp_path / "out.safetensors"), *told_flags]) == 0
    assert load_model(tmp_path / "out.safetensors").config == ViT(**fields).config


def test_a_plain_vit_file_still_loads_without_arch():
    """No family part, no arch of its size: the paper's defaults and the augreg preprocessing, no arch recorded; at
    ViT-B/16's size the plain timm name fits, which is the same reading."""
    model = perturbed(ViT(**TINY))
    loaded = load_timm(to_timm(model), heads=TINY["heads"])
    assert loaded.config == model.config and "arch" not in loaded.source
    assert loaded.preprocessing == Preprocessing.timm(crop=model.config.image_size)
    with torch.device("meta"):
        base = to_timm(create_vit("vit_base_patch16_224"))
    assert timm_config(base) == ViTConfig(**presets.timm_arch("vit_base_patch16_224"))


def test_the_offline_hint_for_a_timm_family_gives_a_command_that_works(monkeypatch, tmp_path, capsys):
    """Offline, create_vit(NAME, pretrained=True) suggests `convert ... --from timm --arch NAME`; run on that file,
    the command gives the model create_vit(NAME, weights=...) gives."""
    model = _shrink(monkeypatch, DINOV2, image_size=28)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError) as caught:
        create_vit(DINOV2, pretrained=True)
    command = f"vit-einops convert model.safetensors {DINOV2}.safetensors --from timm --arch {DINOV2}"
    assert f"`{command}`" in str(caught.value)
    monkeypatch.chdir(tmp_path)
    save_state_dict_file(to_timm(model), tmp_path / "model.safetensors")
    assert main(command.split()[1:]) == 0
    converted = load_vit(tmp_path / f"{DINOV2}.safetensors")
    direct = create_vit(DINOV2, weights=tmp_path / "model.safetensors")
    assert (converted.config, converted.preprocessing) == (direct.config, direct.preprocessing)
    assert_same_state(converted.state_dict(), direct.state_dict())


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda sd: sd.pop("blocks.0.attn.k_norm.weight"), r"missing keys \(1\): blocks\.0\.attn\.k_norm\.weight"),
        (lambda sd: sd["reg_token"].fill_(float("nan")), r"non-finite values .* 'reg_token'"),
    ],
    ids=["a key missing", "a value not finite"],
)
def test_a_broken_family_file_no_arch_fits_names_its_own_defect_first(break_it, message):
    """A file with a family's parts that fits no arch is refused asking for arch=; where it is also broken, the
    defect is the closer reason and is said instead."""
    theirs = to_timm(perturbed(ViT(**TINY, register_tokens=2, qk_norm=True, layer_scale=0.1)))
    with pytest.raises(ValueError, match="fits none of their architectures"):
        load_timm(dict(theirs), heads=TINY["heads"])
    break_it(theirs)
    with pytest.raises(ValueError, match=message):
        load_timm(theirs, heads=TINY["heads"])


def test_a_patch_projection_with_a_side_of_0_is_refused_by_name():
    theirs = to_timm(ViT(**TINY))
    theirs["patch_embed.proj.weight"] = torch.zeros(TINY["dim"], 3, 0, 0)
    with pytest.raises(ValueError, match=r"patch_embed\.proj\.weight has shape \(\d+, 3, 0, 0\); .* no side of 0"):
        load_timm(theirs, heads=TINY["heads"])


def test_an_eva_file_no_arch_fits_is_refused_even_when_heads_act_and_eps_are_told():
    """EVA-02's q and v biases and SwiGLU show in the tensors, its RoPE does not, and no argument can tell it: without
    a fitting arch the file is refused (read as told, it would silently lose the rotation), naming what to pass."""
    from vit_einops import ViT
    from vit_einops.interop.timm import load_timm, to_timm

    eva = ViT(image_size=28, patch_size=7, dim=192, depth=1, heads=3, mlp_dim=40, num_classes=0, pool="mean",
              fc_norm=True, qkv_bias="qv", ffn="swiglu", rope_grid=4)  # fmt: skip
    refused = (
        r"^the timm state dict holds qkv_bias 'qv', ffn 'swiglu', parts of timm's Eva \(EVA-02\), but fits none of its "
        r"architectures \(vit_einops.presets.FAMILIES\): whether it rotates q and k by RoPE, and on which reference "
        r"grid, is nowhere in its tensors\. Name its architecture: arch=NAME \(on the command line, --arch NAME\)$"
    )
    for told in ({}, {"heads": 3, "act": "gelu", "layer_norm_eps": 1e-6}):
        with pytest.raises(ValueError, match=refused):
            load_timm(to_timm(eva), **told)
