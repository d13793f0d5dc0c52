"""save_hf writes each family's own image processor (preprocessor_config.json), which our reader reads back to the
model's preprocessing, and `convert --to hf` names the class it wrote. Without transformers; what transformers makes
of these files is in tests/test_interop_hf_processor.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from PIL import Image

from vit_einops.commands.cli import main
from vit_einops.interop import load_hf, preprocessing_from_hf, preprocessing_to_hf, save_hf
from vit_einops.modelfile import save_vit
from vit_einops.preprocess import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, Preprocessing

HALF = (0.5, 0.5, 0.5)
# architecture -> (our options for it at TINY_RGB16's 16x16, its usual preprocessing at that size, its processor)
EXPORTS = {
    "ViTForImageClassification": ({}, Preprocessing.hf(16), "ViTImageProcessor"),
    "ViTModel": (
        dict(num_classes=0, representation_size=32),
        Preprocessing((20, 20), (16, 16), "bilinear", HALF, HALF, "torch"),
        "ViTImageProcessor",
    ),
    "DeiTForImageClassificationWithTeacher": (
        dict(distill_token=True),
        Preprocessing((18, 18), (16, 16), "bicubic", IMAGENET_MEAN, IMAGENET_STD, "torch"),
        "DeiTImageProcessor",
    ),
    "Dinov2Model": (
        dict(layer_scale=1e-5, num_classes=0),
        Preprocessing(18, (16, 16), "bicubic", IMAGENET_MEAN, IMAGENET_STD, "torch"),
        "BitImageProcessor",
    ),
    "Dinov2WithRegistersModel": (
        dict(layer_scale=1e-5, num_classes=0, register_tokens=4, pos_embed_prefix=False),
        Preprocessing(18, (16, 16), "bicubic", IMAGENET_MEAN, IMAGENET_STD, "torch"),
        "BitImageProcessor",
    ),
    "CLIPVisionModel": (
        dict(pre_norm=True, patch_bias=False, act="quick_gelu", num_classes=0),
        Preprocessing(16, (16, 16), "bicubic", CLIP_MEAN, CLIP_STD, "torch"),
        "CLIPImageProcessor",
    ),
    "CLIPVisionModelWithProjection": (
        dict(pre_norm=True, patch_bias=False, act="quick_gelu", head_bias=False, embedding=True),
        Preprocessing(16, (16, 16), "bicubic", CLIP_MEAN, CLIP_STD, "torch"),
        "CLIPImageProcessor",
    ),
    "SiglipVisionModel": (
        dict(class_token=False, pool="map", act="gelu_tanh", num_classes=0),
        Preprocessing((16, 16), None, "bicubic", HALF, HALF, "torch"),
        "SiglipImageProcessor",
    ),
}


def _model(arch: str, preprocessing: Preprocessing | None = None):
    options, usual, _ = EXPORTS[arch]
    model = tiny_vit(TINY_RGB16, **options)
    model.preprocessing = usual if preprocessing is None else preprocessing
    return model


@pytest.mark.parametrize("arch", EXPORTS)
def test_each_family_writes_its_own_processor_and_reads_back_the_same_preprocessing(tmp_path, arch):
    model = _model(arch)
    directory = save_hf(model, tmp_path / arch)
    written = json.loads((directory / "preprocessor_config.json").read_text())
    assert written["image_processor_type"] == EXPORTS[arch][2]
    assert written["do_center_crop"] is (model.preprocessing.crop is not None)  # never the class's default
    assert json.loads((directory / "config.json").read_text())["architectures"] == [arch]
    assert preprocessing_from_hf(written) == model.preprocessing
    assert load_hf(directory).preprocessing == model.preprocessing


def test_every_field_is_written_so_that_no_class_default_applies():
    """BitImageProcessor crops and CLIPImageProcessor normalises by default: a file without those fields would
    crop or normalise a model that does not."""
    p = Preprocessing((16, 16), None, "bilinear", HALF, HALF, "torch")
    written = preprocessing_to_hf(p, "BitImageProcessor")
    assert written == {
        "image_processor_type": "BitImageProcessor",
        "do_resize": True,
        "size": {"height": 16, "width": 16},
        "resample": 2,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


@pytest.mark.parametrize(("backend", "offset"), [("torch", 1), ("pil", 2)])
def test_a_crop_of_an_odd_margin_is_centred_as_transformers_does_after_a_torch_resize(backend, offset):
    """11 px cropped to 8: transformers' processors start at floor(3 / 2) = 1, torchvision and timm at round(1.5)."""
    pixels = torch.arange(11 * 11, dtype=torch.uint8).view(1, 11, 11)
    image = Image.fromarray(pixels[0].numpy())  # mode L
    p = Preprocessing((11, 11), (8, 8), "bilinear", (0.0,), (1.0,), backend)
    window = pixels[:, offset : offset + 8, offset : offset + 8]
    assert torch.equal(p(image), window.float() / 255)


def test_nearest_resampling_is_refused_by_name():
    p = Preprocessing(18, (16, 16), "nearest", IMAGENET_MEAN, IMAGENET_STD, "torch")
    with pytest.raises(ValueError, match="BitImageProcessor cannot express .*resample 0 resizes with nearest-exact"):
        preprocessing_to_hf(p, "BitImageProcessor")


def test_an_unknown_processor_is_named():
    with pytest.raises(ValueError, match="processor 'Dinov2ImageProcessor' is not one of"):
        preprocessing_to_hf(Preprocessing.hf(16), "Dinov2ImageProcessor")


def _convert(capsys, tmp_path, arch: str, preprocessing: Preprocessing | None = None) -> list[str]:
    src = save_vit(_model(arch, preprocessing), tmp_path / "m.safetensors")
    assert main(["convert", str(src), str(tmp_path / "hf"), "--to", "hf"]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("arch", ["Dinov2WithRegistersModel", "CLIPVisionModel", "SiglipVisionModel"])
def test_convert_names_the_class_and_processor_it_wrote(capsys, tmp_path, arch):
    lines = _convert(capsys, tmp_path, arch)
    processor = EXPORTS[arch][2]
    assert lines == [
        f"wrote {tmp_path / 'hf'}/: Hugging Face {arch} "
        f"(config.json, model.safetensors, preprocessor_config.json for {processor})"
    ]


def test_convert_of_a_pil_resize_says_how_transformers_resizes_the_same_way(capsys, tmp_path):
    timm_style = Preprocessing((16, 16), None, "bicubic", HALF, HALF, "pil")
    lines = _convert(capsys, tmp_path, "SiglipVisionModel", timm_style)
    assert lines[1:] == [
        '  it resizes with PIL: load it with AutoImageProcessor.from_pretrained(DST, backend="pil")'
    ]
    assert load_hf(tmp_path / "hf").preprocessing == dataclasses.replace(timm_style, backend="torch")


@pytest.mark.parametrize(
    ("preprocessing", "words"),
    [
        (
            Preprocessing(18, (16, 16), "bicubic", IMAGENET_MEAN, IMAGENET_STD, "pil"),
            "its crop_size centres an odd margin as transformers does, not as torchvision and timm do",
        ),
        (
            Preprocessing(18, (16, 16), "nearest", IMAGENET_MEAN, IMAGENET_STD, "torch"),
            "its resample 0 resizes with nearest-exact, not nearest",
        ),
    ],
)
def test_convert_writes_no_processor_it_cannot_express_and_says_which_field(capsys, tmp_path, preprocessing, words):
    lines = _convert(capsys, tmp_path, "Dinov2Model", preprocessing)
    assert lines[0].endswith("Hugging Face Dinov2Model (config.json, model.safetensors)")
    assert lines[1].startswith("  no preprocessor_config.json: BitImageProcessor cannot express Preprocessing(")
    assert words in lines[1] and len(lines) == 2
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
