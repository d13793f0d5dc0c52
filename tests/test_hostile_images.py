"""Images: only the formats vit-einops means to read are decoded (never EPS/PS, which Pillow hands to Ghostscript),
and float and 16/32-bit images are scaled by their value range, never clipped to black or white."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import EpsImagePlugin, Image

from vit_einops.images import FORMATS, open_image, to_model_mode

# A valid EPS (Pillow identifies it by its first bytes, whatever the file's suffix) and a PostScript file.
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n0 0 moveto 8 8 lineto stroke\nshowpage\n%%EOF\n"
PS = b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n%%EOF\n"
DOS_EPS = b"\xc5\xd0\xd3\xc6" + (32).to_bytes(4, "little") + len(EPS).to_bytes(4, "little") + bytes(20) + EPS


@pytest.fixture
def eps_opened(monkeypatch):
    """Every call of Pillow's EPS decoder, recorded: none may happen."""
    calls = []
    original = EpsImagePlugin.EpsImageFile._open
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", lambda self: calls.append(self) or original(self))
    return calls


@pytest.mark.parametrize("name, data", [("photo.png", EPS), ("photo.eps", EPS), ("doc.jpg", PS), ("x.png", DOS_EPS)])
def test_postscript_is_refused_and_never_reaches_the_eps_decoder(tmp_path, eps_opened, name, data):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError, match=rf"{name}': not an image of a format vit-einops reads \(PNG, JPEG, GIF, "):
        open_image(tmp_path / name)
    assert eps_opened == []
    assert Image.open(io.BytesIO(EPS)).format == "EPS"  # Pillow alone would have read it, so the list is what refused


@pytest.mark.parametrize("fmt", ["ICO", "PCX", "TGA", "DDS"])
def test_formats_outside_the_list_are_refused(tmp_path, fmt):
    Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "x.img", format=fmt)
    with pytest.raises(ValueError, match=r"x.img': not an image of a format vit-einops reads"):
        open_image(tmp_path / "x.img")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_listed_format_is_read(tmp_path, fmt):
    lossless = {"lossless": True} if fmt == "WEBP" else {}
    Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "x.img", format=fmt, **lossless)
    image = to_model_mode(open_image(tmp_path / "x.img"), 3)
    assert image.size == (8, 8)
    assert np.abs(np.asarray(image, dtype=int) - (10, 20, 30)).max() <= (4 if fmt == "JPEG" else 0)


def grey(image) -> list[int]:
    return np.asarray(to_model_mode(image, 1)).ravel().tolist()


@pytest.mark.parametrize(
    "values, expected, rule",
    [
        ([0.0, 0.5, 1.0, 0.25], [0, 128, 255, 64], "within [0, 1]: times 255"),
        ([0.0, 127.5, 255.0, 51.0], [0, 128, 255, 51], "outside [0, 1]: min-max"),
        ([-1.0, 0.0, 1.0, 3.0], [0, 64, 128, 255], "negative: min-max"),
        ([300.0] * 4, [255] * 4, "constant outside [0, 1]: its value clipped"),
        ([0.5] * 4, [128] * 4, "constant within [0, 1]: times 255"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_float_images_are_scaled_by_their_range(values, expected, rule):
    assert grey(Image.fromarray(np.array([values], dtype=np.float32), mode="F")) == expected


@pytest.mark.parametrize(
    "mode, values, expected",
    [
        ("I;16", [0, 257, 32896, 65535], [0, 1, 128, 255]),  # 16-bit: 65535 full scale, /257
        ("I", [0, 257, 32896, 65535], [0, 1, 128, 255]),  # 16-bit PNG read as 32-bit by Pillow
        ("I", [-1000, 0, 1000, 3000], [0, 64, 128, 255]),  # 32-bit beyond 16 bits: min-max
        ("I", [0, 70000, 140000, 35000], [0, 128, 255, 64]),
    ],
)
def test_integer_images_are_scaled_not_clipped(mode, values, expected):
    array = np.array([values], dtype=np.uint16 if mode == "I;16" else np.int32)
    image = Image.fromarray(array) if mode == "I;16" else Image.fromarray(array, mode="I")
    assert image.mode == mode
    assert grey(image) == expected


def test_a_float_tiff_is_not_read_as_black(tmp_path):
    """The issue's case: a float TIFF in [0, 255] (an 8-bit photo saved as float) read as black."""
    ramp = np.linspace(0, 255, 64, dtype=np.float32).reshape(8, 8)
    Image.fromarray(ramp, mode="F").save(tmp_path / "f.tif")
    image = open_image(tmp_path / "f.tif")
    assert image.mode == "F"
    assert grey(image) == np.rint(ramp).astype(int).ravel().tolist()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_float_pixels_are_refused(bad):
    with pytest.raises(ValueError, match=r"a F image holds non-finite pixels \(nan or inf\)"):
        to_model_mode(Image.fromarray(np.array([[0.0, bad]], dtype=np.float32), mode="F"), 1)


def test_an_empty_path_is_named_as_empty_not_as_the_current_directory():
    # Path("") is "."; the error said "cannot read image '.': not a regular file"
    with pytest.raises(ValueError, match=r"^cannot read image '': the path is an empty string$"):
        open_image("")
