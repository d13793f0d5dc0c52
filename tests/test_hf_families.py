"""The Hugging Face families without transformers: save_hf writes each family's architecture and load_hf reads it
back to the same model; a config.json field a family cannot express, or a wrong one, is one ValueError (or
TypeError) naming the field; a model no transformers architecture holds is refused before anything is written.
The values against transformers itself are in tests/test_interop_hf_families.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from _interop import perturbed
from _tiny import TINY_RGB16, tiny_vit

from vit_einops.interop import load_hf, save_hf, to_hf
from vit_einops.sources import detect_source, load_model
from vit_einops.statedict import StateDictMismatchError

# Our options that make each architecture (TINY_RGB16's sizes: 16x16 in 4x4 patches, width 32 in 4 heads).
FAMILIES = {
    "Dinov2Model": dict(layer_scale=1e-5, num_classes=0),
    "Dinov2WithRegistersModel": dict(layer_scale=1e-5, num_classes=0, register_tokens=4, pos_embed_prefix=False),
    "DeiTForImageClassificationWithTeacher": dict(distill_token=True),
    "CLIPVisionModel": dict(pre_norm=True, patch_bias=False, act="quick_gelu", num_classes=0),
    "CLIPVisionModelWithProjection": dict(pre_norm=True, patch_bias=False, act="quick_gelu", head_bias=False,
                                          embedding=True),
    "SiglipVisionModel": dict(class_token=False, pool="map", act="gelu_tanh", num_classes=0),
}


def _saved(tmp_path, arch: str):
    model = perturbed(tiny_vit(TINY_RGB16, **FAMILIES[arch]))
    return model, save_hf(model, tmp_path / arch)


@pytest.mark.parametrize("arch", FAMILIES)
def test_each_family_is_written_as_its_architecture_and_read_back_to_the_same_model(tmp_path, arch):
    model, directory = _saved(tmp_path, arch)
    written = json.loads((directory / "config.json").read_text())
    assert written["architectures"] == [arch]
    assert detect_source(directory / "model.safetensors") == "hf"  # a weights file beside its config.json
    again = load_model(directory)
    expected = {**model.config.to_dict(), "dynamic_size": "timm" if "Registers" in arch else "hf"}
    assert again.config.to_dict() == expected
    assert again.source["architecture"] == arch
    state, loaded = model.state_dict(), again.state_dict()
    assert sorted(state) == sorted(loaded)
    assert all(torch.equal(state[k], loaded[k]) for k in state)  # the registers' class token: + a zero row
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_a_siglip_tower_without_its_head_reads_as_mean_pooling_and_writes_back_without_it(tmp_path):
    model = tiny_vit(TINY_RGB16, class_token=False, pool="mean", num_classes=0)
    directory = save_hf(model, tmp_path / "siglip")
    assert json.loads((directory / "config.json").read_text())["vision_use_head"] is False
    assert load_hf(directory).config.pool == "mean"


def _with(tmp_path, arch: str, **changes):
    _, directory = _saved(tmp_path, arch)
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("arch", "changes", "error", "message"),
    [
        ("Dinov2Model", {"hidden_size": 30}, ValueError,
         r"config.json describes no valid Dinov2Model: dim 30 is not divisible by heads 4 \(config.json's "
         r"hidden_size, num_attention_heads\)"),
        ("Dinov2Model", {"image_size": 18}, ValueError,
         r"image height 18 is not divisible by patch height 4 .*\(config.json's image_size, patch_size\)"),
        ("Dinov2Model", {"hidden_act": "relu"}, ValueError,
         r"config.json hidden_act 'relu' is not supported; expected one of gelu, gelu_pytorch_tanh, quick_gelu"),
        ("Dinov2Model", {"use_swiglu_ffn": True}, ValueError, r"config.json use_swiglu_ffn True is not supported"),
        ("Dinov2Model", {"qkv_bias": False}, ValueError, r"config.json qkv_bias False is not supported"),
        ("Dinov2Model", {"mlp_ratio": "4"}, TypeError, r"config.json mlp_ratio must be int or float, got '4' \(str\)"),
        ("Dinov2Model", {"mlp_ratio": 0}, ValueError, r"config.json mlp_ratio must be a positive finite number, got 0"),
        ("Dinov2Model", {"layerscale_value": 0}, ValueError,
         r"layer_scale must be a positive finite float, got 0.0 \(config.json's layerscale_value\)"),
        ("Dinov2Model", {"head_dim": 16}, ValueError,
         r"config.json head_dim 16 is not hidden_size / num_attention_heads"),
        ("Dinov2WithRegistersModel", {"num_register_tokens": -1}, ValueError,
         r"config.json num_register_tokens must be a positive int, got -1"),
        ("Dinov2WithRegistersModel", {"num_register_tokens": 2.5}, TypeError,
         r"config.json num_register_tokens must be int, got 2.5 \(float\)"),
        ("Dinov2WithRegistersModel", {"model_type": "dinov2"}, ValueError,
         r"config.json model_type 'dinov2' does not fit architecture Dinov2WithRegistersModel \(expected "
         r"'dinov2_with_registers'\)"),
        ("DeiTForImageClassificationWithTeacher", {"num_attention_heads": 0}, ValueError,
         r"heads must be a positive int.*\(config.json's num_attention_heads\)"),
        ("CLIPVisionModelWithProjection", {"projection_dim": 0}, ValueError,
         r"config.json projection_dim must be a positive int, got 0"),
        ("CLIPVisionModel", {"model_type": "clip"}, ValueError,
         r"config.json model_type 'clip' does not fit architecture 'CLIPVisionModel' \(expected 'CLIPModel'\)"),
        ("CLIPVisionModel", {"model_type": "clip", "architectures": ["CLIPModel"], "vision_config": [1]}, TypeError,
         r"config.json vision_config must be a JSON object, got \[1\]"),
        ("SiglipVisionModel", {"vision_use_head": "yes"}, TypeError,
         r"config.json vision_use_head must be bool, got 'yes' \(str\)"),
        ("SiglipVisionModel", {"layer_norm_eps": -1.0}, ValueError,
         r"layer_norm_eps must be a positive finite float, got -1.0 \(config.json's layer_norm_eps\)"),
        ("SiglipVisionModel", {"architectures": ["SiglipForImageClassification"]}, ValueError,
         r"config.json architecture 'SiglipForImageClassification' is not supported; expected one of "
         r"ViTForImageClassification, "),
    ],
)  # fmt: skip
def test_a_wrong_or_inexpressible_field_is_one_error_naming_it(tmp_path, arch, changes, error, message):
    directory = _with(tmp_path, arch, **changes)
    with pytest.raises(error, match=message) as caught:
        load_hf(directory)
    assert str(caught.value).startswith(str(directory / "config.json"))  # the file in full


def test_weights_that_do_not_fit_the_family_name_the_keys(tmp_path):
    from safetensors.torch import load_file, save_file

    _, directory = _saved(tmp_path, "Dinov2WithRegistersModel")
    weights = directory / "model.safetensors"
    state = load_file(weights)
    position = state["embeddings.position_embeddings"]
    save_file({**state, "embeddings.position_embeddings": position[:, 1:].contiguous()}, weights)
    with pytest.raises(StateDictMismatchError, match=r"mis-shaped embeddings.position_embeddings: got \(1, 16, 32\), "
                       r"expected \(1, 17, 32\)"):
        load_hf(directory)
    save_file({**state, "vit.embeddings.cls_token": state["embeddings.cls_token"].clone()}, weights)
    with pytest.raises(ValueError, match=r"hf state dict holds 'embeddings.cls_token' twice, with and without a "
                       r"prefix \('vit.embeddings.cls_token'\)"):
        load_hf(directory)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(register_tokens=4), r"Hugging Face's ViT cannot express this model: it has register_tokens 4 "
         r"\(ViT has 0\)"),
        (dict(qk_norm=True), r"Hugging Face's ViT cannot express this model: it has qk_norm True \(ViT has False\)"),
        (dict(pool="mean"), r"it has pool 'mean' \(ViT has 'cls'\)"),
        (dict(layer_scale=1e-5), r"Hugging Face's Dinov2Model cannot express this model: it has num_classes 5 "
         r"\(Dinov2Model has 0\)"),
        (dict(layer_scale=1e-5, num_classes=0, mlp_dim=48), r"Dinov2Model cannot express this model: it has mlp_dim "
         r"48, not a whole multiple of dim 32 \(DINOv2's mlp_ratio\)"),
        (dict(layer_scale=1e-5, num_classes=0, register_tokens=4), r"Hugging Face's Dinov2WithRegistersModel cannot "
         r"express this model: it has pos_embed_prefix True \(Dinov2WithRegistersModel has False\)"),
        (dict(class_token=False, pool="mean"), r"Hugging Face's SiglipVisionModel cannot express this model: it has "
         r"num_classes 5 \(SiglipVisionModel has 0\)"),
        (dict(distill_token=True, pre_norm=True), r"DeiTForImageClassificationWithTeacher cannot express this "
         r"model: it has pre_norm True \(DeiTForImageClassificationWithTeacher has False\)"),
        (dict(pre_norm=True, num_classes=0), r"Hugging Face's CLIPVisionModel cannot express this model: it has "
         r"patch_bias True \(CLIPVisionModel has False\)"),
        (dict(pre_norm=True, patch_bias=False), r"CLIPVisionModelWithProjection cannot express this model: it has "
         r"head_bias True \(CLIPVisionModelWithProjection has False\)"),
        # a CLIP tower with a classifier is no projection: written as one, it would come back an embedding
        (dict(pre_norm=True, patch_bias=False, head_bias=False), r"CLIPVisionModelWithProjection cannot express this "
         r"model: it has embedding False \(CLIPVisionModelWithProjection has True\)$"),
    ],
)  # fmt: skip
def test_a_model_no_transformers_architecture_holds_is_refused_before_writing(tmp_path, options, message):
    model = tiny_vit(TINY_RGB16, **options)
    with pytest.raises(ValueError, match=message):
        to_hf(model)
    with pytest.raises(ValueError, match=message):
        save_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
