"""Preprocessing without the reference libraries (those comparisons are in test_interop_hf.py): the geometry of the
resize and crop, and normalisation. Reading image files is tested in test_images.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vit_einops.preprocess import Preprocessing


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


def test_crop_larger_than_the_image_pads_with_zeros():
    img = Image.new("L", (2, 2), 255)
    out = Preprocessing(resize=(2, 2), crop=(4, 4), mean=(0.0,), std=(1.0,))(img)
    assert out.shape == (1, 4, 4) and out.sum() == 4 and out[0, 1:3, 1:3].eq(1).all()


def test_normalisation_is_per_channel():
    img = Image.new("RGB", (8, 8), (255, 0, 51))
    out = Preprocessing(resize=(8, 8), mean=(0.5, 0.0, 0.1), std=(0.5, 1.0, 0.2))(img)
    assert torch.allclose(out[:, 0, 0], torch.tensor([1.0, 0.0, (0.2 - 0.1) / 0.2]), atol=1e-6)


def test_timm_crop_pct_rule():
    assert Preprocessing.timm(crop=224, crop_pct=0.9).resize == 248  # floor(224 / 0.9)
    assert Preprocessing.timm(crop=224, crop_pct=0.875).resize == 256
    with pytest.raises(ValueError, match="crop_pct must be in"):
        Preprocessing.timm(crop_pct=1.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"resize": 0}, ValueError, "resize"),
        ({"resize": 8, "interpolation": "lanczos"}, ValueError, "interpolation"),
        ({"resize": 8, "mean": (0.1, 0.2)}, ValueError, "1 \\(grey\\) or 3 \\(RGB\\) values"),
        ({"resize": 8, "std": (0.0, 1.0, 1.0)}, ValueError, "std must be positive"),
        ({"resize": 8, "mean": (float("nan"),) * 3}, ValueError, "finite numbers"),
        ({"resize": 8, "mean": "0.5"}, TypeError, "sequence of numbers"),
        ({"resize": 8, "backend": "cv2"}, ValueError, "backend"),
    ],
)
def test_bad_records(kwargs, error, words):
    with pytest.raises(error, match=words):
        Preprocessing(**kwargs)


def test_record_round_trips_through_json_dict():
    p = Preprocessing.timm(crop=(32, 48), crop_pct=0.9)
    assert Preprocessing.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="unknown preprocessing fields"):
        Preprocessing.from_dict({**p.to_dict(), "colour": "yes"})


def test_not_a_pil_image():
    with pytest.raises(TypeError, match="takes a PIL image, got Tensor; read files with"):
        Preprocessing.plain(8)(torch.zeros(3, 8, 8))
