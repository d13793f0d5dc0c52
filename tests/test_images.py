"""Images in and out (vit_einops.images): files that are not sane images are refused with their name, every mode
becomes 8-bit grey or RGB, a list of paths and PIL images becomes the model's batch, and the picture drawn is the
one the model saw (resized and cropped, not normalised)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vit_einops import ViT
from vit_einops.images import (
    MAX_PIXELS,
    display_images,
    load_images,
    open_image,
    sample_images,
    to_display,
    to_model_mode,
    to_uint8,
)
from vit_einops.preprocess import Preprocessing

TINY = dict(image_size=16, patch_size=8, dim=16, depth=1, heads=2, mlp_dim=32, num_classes=3)


def test_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    deep = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    img = open_image(tmp_path / "deep.png")
    assert img.mode.startswith("I")
    out = Preprocessing(resize=(1, 4), mean=(0.0,), std=(1.0,))(img)
    assert torch.equal(out, torch.tensor([[[0.0, 1.0, 128.0, 255.0]]]) / 255)  # PIL's convert would give 0, 1, 1, 1


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "1", "CMYK", "I;16", "F"])
def test_every_mode_becomes_rgb_or_grey(mode):
    img = Image.new("RGB", (5, 3), (200, 100, 50)).convert(mode)
    for channels, target in ((3, "RGB"), (1, "L")):
        assert to_model_mode(img, channels).mode == target
    assert Preprocessing.plain((3, 5))(img).shape == (3, 3, 5)


def test_transparency_is_dropped_as_torchvision_loaders_do():
    img = Image.new("RGBA", (2, 2), (10, 20, 30, 0))
    assert to_model_mode(img, 3).getpixel((0, 0)) == (10, 20, 30)




def test_files_that_are_not_sane_images(tmp_path):
    with pytest.raises(ValueError, match="absent.png.*No such file"):
        open_image(tmp_path / "absent.png")
    with pytest.raises(ValueError, match="not a regular file"):
        open_image(tmp_path)
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(ValueError, match="notes.png.*not an image PIL can decode"):
        open_image(tmp_path / "notes.png")
    Image.new("RGB", (64, 64)).save(tmp_path / "ok.png")
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.png"):
        open_image(tmp_path / "cut.png")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    code = (
        "from vit_einops.images import open_image\ntry:\n    open_image(%r)\nexcept ValueError as e:\n    print(e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code % str(tmp_path / "pipe.png")], capture_output=True, text=True, timeout=60
    )
    assert "not a regular file" in out.stdout


def test_a_decompression_bomb_is_a_clear_error_before_decoding(tmp_path):
    # A 20000 x 20000 PNG of one colour compresses to a few hundred KB; decoding it would take 1.2 GB.
    side = 20000
    assert side * side > MAX_PIXELS
    Image.new("L", (side, 1)).resize((side, side)).save(tmp_path / "bomb.png", optimize=False)
    with pytest.raises(ValueError, match=r"bomb.png.*400000000 pixels.*(over the )?limit"):
        open_image(tmp_path / "bomb.png")


@pytest.fixture
def model():
    m = ViT(**TINY)
    m.preprocessing = Preprocessing(resize=20, crop=(16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    return m


def test_paths_and_pil_images_become_the_models_batch(model, tmp_path):
    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    photo.save(tmp_path / "photo.png")
    batch = load_images(model, [tmp_path / "photo.png", photo])
    assert batch.shape == (2, 3, 16, 16)
    assert torch.equal(batch[0], model.transforms()(photo)) and torch.equal(batch[1], batch[0])
    assert torch.equal(load_images(model, str(tmp_path / "photo.png")), batch[:1])
    assert torch.equal(load_images(model, batch), batch) and torch.equal(load_images(model, batch[0]), batch[:1])


@pytest.mark.parametrize(
    ("images", "error", "words"),
    [
        ([], TypeError, "non-empty list"),
        (42, TypeError, "images must be a path.*got int"),
        ([np.zeros((16, 16, 3))], TypeError, "each image must be.*got ndarray"),
        (torch.zeros(1, 3, 8, 8), ValueError, r"expected height, width \(16, 16\)"),
    ],
)
def test_bad_images_are_named(model, images, error, words):
    with pytest.raises(error, match=words):
        load_images(model, images)


def test_the_picture_shown_is_what_the_model_saw_before_normalising(model):
    rng = np.random.default_rng(1)
    photo = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    shown = display_images(model, [photo])
    assert shown.shape == (1, 3, 16, 16) and 0 <= shown.min() and shown.max() <= 1
    torch.testing.assert_close(shown[0], model.transforms()(photo) * 0.25 + 0.5)  # the normalisation undone
    expected = np.asarray(photo.resize((26, 20), Image.Resampling.BILINEAR))[2:18, 5:21]  # resize 20, centre 16
    assert np.array_equal(to_uint8(shown[0]), expected)


def test_model_inputs_are_drawn_as_they_are_or_scaled_into_range(model):
    digits = torch.rand(2, 1, 16, 16) * 0.5
    assert torch.equal(display_images(model, digits), digits)  # already in [0, 1]: as they are
    normalised = torch.tensor([[[-1.0, 0.0], [1.0, 3.0]]])
    assert torch.equal(to_display(normalised), torch.tensor([[[0.0, 0.25], [0.5, 1.0]]]))
    assert to_uint8(to_display(normalised)).tolist() == [[0, 64], [128, 255]]
    assert to_uint8(torch.ones(3, 2, 5)).shape == (2, 5, 3)


def test_sample_images_are_scikit_learns_two_photos():
    pictures, names = sample_images()
    assert names == ["china.jpg", "flower.jpg"]
    assert [(p.mode, p.size) for p in pictures] == [("RGB", (640, 427))] * 2
