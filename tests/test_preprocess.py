"""Preprocessing without the reference libraries (those comparisons are in test_interop_hf.py): the geometry of the
resize and crop, normalisation, the conventions by name, and the Hugging Face preprocessor_config round trip."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from vit_einops.interop.hf import preprocessing_from_hf, preprocessing_to_hf
from vit_einops.preprocess import CONVENTIONS, Preprocessing


def test_shorter_side_resize_and_centre_crop_geometry():
    img = Image.fromarray(np.arange(300 * 400 * 3, dtype=np.uint32).reshape(300, 400, 3).astype(np.uint8))
    p = Preprocessing(resize=256, crop=(224, 224), interpolation="nearest")
    assert p._target_size(300, 400) == (256, 341)  # int(256 * 400 / 300)
    assert p._target_size(400, 300) == (341, 256)
    assert p(img).shape == (3, 224, 224)
    # No resize needed, crop only: the centre 2x2 of a 4x4 ramp, offsets round((4 - 2) / 2) = 1.
    ramp = Image.fromarray(np.arange(16, dtype=np.uint8).reshape(4, 4) * 10)
    out = Preprocessing(resize=4, crop=(2, 2), mean=(0.0,), std=(1.0,))(ramp)
    assert torch.equal(out, torch.tensor([[[50.0, 60.0], [90.0, 100.0]]]) / 255)


def test_normalisation_is_per_channel():
    img = Image.new("RGB", (8, 8), (255, 0, 51))
    out = Preprocessing(resize=(8, 8), mean=(0.5, 0.0, 0.1), std=(0.5, 1.0, 0.2))(img)
    assert torch.allclose(out[:, 0, 0], torch.tensor([1.0, 0.0, (0.2 - 0.1) / 0.2]), atol=1e-6)


def test_timm_crop_pct_rule():
    assert Preprocessing.timm(crop=224, crop_pct=0.9).resize == 248  # floor(224 / 0.9)
    assert Preprocessing.timm(crop=224, crop_pct=0.875).resize == 256
    with pytest.raises(ValueError, match="crop_pct.*got 1.5"):
        Preprocessing.timm(crop_pct=1.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"resize": 0}, ValueError, r"resize.*got 0"),
        ({"resize": 8, "interpolation": "lanczos"}, ValueError, r"interpolation 'lanczos'"),
        ({"resize": 8, "mean": (0.1, 0.2)}, ValueError, r"mean.*got 2: \[0.1, 0.2\]"),
        ({"resize": 8, "std": (0.0, 1.0, 1.0)}, ValueError, r"std.*got \(0.0, 1.0, 1.0\)"),
        ({"resize": 8, "mean": (float("nan"),) * 3}, ValueError, r"mean.*got \[nan, nan, nan\]"),
        ({"resize": 8, "mean": "0.5"}, TypeError, r"mean.*got '0.5'"),
        ({"resize": 8, "backend": "cv2"}, ValueError, r"backend 'cv2'"),
    ],
)
def test_bad_records(kwargs, error, words):
    with pytest.raises(error, match=words):
        Preprocessing(**kwargs)


def test_record_round_trips_through_json_dict():
    p = Preprocessing.timm(crop=(32, 48), crop_pct=0.9)
    assert Preprocessing.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match=r"fields \['colour'\]"):
        Preprocessing.from_dict({**p.to_dict(), "colour": "yes"})


def test_not_a_pil_image():
    with pytest.raises(TypeError, match="PIL image, got Tensor"):
        Preprocessing.plain(8)(torch.zeros(3, 8, 8))


def test_each_convention_is_built_by_name_at_the_models_size():
    expected = {
        "torchvision": Preprocessing.torchvision(crop=(32, 48)),
        "timm": Preprocessing.timm(crop=(32, 48)),
        "hf": Preprocessing.hf((32, 48)),
        "plain": Preprocessing.plain((32, 48)),
    }
    assert sorted(CONVENTIONS) == sorted(expected)
    for name in CONVENTIONS:
        p = Preprocessing.convention(name, (32, 48))
        assert p == expected[name] and p(Image.new("RGB", (70, 50))).shape == (3, 32, 48)


def test_an_unknown_convention_is_named():
    with pytest.raises(ValueError, match="convention 'keras'"):
        Preprocessing.convention("keras", 32)


def test_hf_processor_config_round_trips_and_its_defaults_are_the_hf_convention():
    p = Preprocessing.hf((32, 48), channels=1)
    config = preprocessing_to_hf(p)
    assert config["size"] == {"height": 32, "width": 48} and config["image_mean"] == [0.5]
    assert preprocessing_from_hf(config, channels=1) == p
    assert preprocessing_from_hf({}) == Preprocessing.hf(224)  # ViTImageProcessor's defaults
    shorter = preprocessing_from_hf({"size": {"shortest_edge": 40}, "do_center_crop": True, "crop_size": 32})
    assert (shorter.resize, shorter.crop) == (40, (32, 32))


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"size": "big"}, "'size' must be an object or an int, got 'big'"),
        ({"size": {"wide": 3}}, "'size' {'wide': 3}"),
        ({"do_resize": False}, "do_resize false"),
        ({"resample": 1}, "resample 1"),
        ({"rescale_factor": 0.5}, "rescale_factor 0.5"),
        ({"do_center_crop": True, "crop_size": {"h": 2}}, "'crop_size' {'h': 2}"),
    ],
)
def test_bad_hf_processor_configs(config, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        preprocessing_from_hf(config)


def test_what_vit_image_processor_cannot_express():
    with pytest.raises(ValueError, match=r"ViTImageProcessor cannot express .*resize=256, crop=\(224, 224\).*crop_s"):
        preprocessing_to_hf(Preprocessing.torchvision())
    with pytest.raises(TypeError, match="preprocessing.*got dict"):
        preprocessing_to_hf({"resize": 224})
