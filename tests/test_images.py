"""Images in and out (vit_einops.images): files that are not sane images are refused with their name, every mode
becomes 8-bit grey or RGB, and a model input is drawn in [0, 1]. (Images in any form becoming a model's batch:
test_inputs.py.)"""

from __future__ import annotations

import os
import struct
import threading
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from vit_einops.images import (
    MAX_PIXELS,
    open_image,
    sample_images,
    to_display,
    to_model_mode,
    to_uint8,
)
from vit_einops.preprocess import Preprocessing


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
    with pytest.raises(ValueError, match=r"notes.png.*not an image of a format vit-einops reads \(PNG, JPEG, GIF"):
        open_image(tmp_path / "notes.png")
    Image.new("RGB", (64, 64)).save(tmp_path / "ok.png")
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.png"):
        open_image(tmp_path / "cut.png")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    """Opening a FIFO blocks until a writer comes: the check runs in a thread, and a writer is sent to release it
    if it blocks (the failure is then the test's, not a hung suite)."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(refusal(fifo)), daemon=True)
    thread.start()
    thread.join(timeout=30)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("open_image blocked on a FIFO")
    assert outcome and "not a regular file" in outcome[0]


def refusal(path) -> str:
    """open_image's ValueError message for ``path`` (which it must refuse)."""
    with pytest.raises(ValueError) as error:
        open_image(path)
    return str(error.value)


def png_header(path, width: int, height: int) -> None:
    """A PNG whose header declares width x height over one row of pixel data: what a decompression bomb shows
    before decoding (a decoder would fail on the missing rows; the check must refuse it first)."""
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack(">II", width, height)  # IHDR: 8-byte signature, length, type, then width, height
    data[29:33] = struct.pack(">I", zlib.crc32(data[12:29]))  # the chunk's CRC over its type and data
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("side", [12000, 20000], ids=["over MAX_PIXELS", "over PIL's own guard"])
def test_a_decompression_bomb_is_a_clear_error_before_decoding(tmp_path, side):
    # 12000^2 is over MAX_PIXELS and under PIL's error (which it only warns about); 20000^2 is over both.
    assert side * side > MAX_PIXELS
    png_header(tmp_path / "bomb.png", side, side)
    with pytest.raises(ValueError, match=rf"bomb.png.*{side * side} pixels.*(over the )?limit"):
        open_image(tmp_path / "bomb.png")


def test_model_inputs_are_drawn_as_they_are_or_scaled_into_range():
    digits = torch.rand(1, 16, 16) * 0.5
    assert torch.equal(to_display(digits), digits)  # already in [0, 1]: as they are
    normalised = torch.tensor([[[-1.0, 0.0], [1.0, 3.0]]])
    assert torch.equal(to_display(normalised), torch.tensor([[[0.0, 0.25], [0.5, 1.0]]]))
    assert to_uint8(to_display(normalised)).tolist() == [[0, 64], [128, 255]]
    assert to_uint8(torch.ones(3, 2, 5)).shape == (2, 5, 3)


def test_sample_images_are_scikit_learns_two_photos():
    pictures, names = sample_images()
    assert names == ["china.jpg", "flower.jpg"]
    assert [(p.mode, p.size) for p in pictures] == [("RGB", (640, 427))] * 2
