"""One input contract (vit_einops.inputs): predict, record_attention, attention_relevance, show_attention and
write_explorer take a photo as a path, a PIL image, a uint8 tensor, raw float pixels (preprocessed=False) or the
model's input (preprocessed=True), and give the same answer for each; a float tensor whose reading matters and is
not given is refused with one message naming both options."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _interop import perturbed
from hypothesis import example, given
from hypothesis import strategies as st
from _tiny import TINY_DIGITS, TINY_RGB, tiny_vit
from PIL import Image

from vit_einops.explore import write_explorer
from vit_einops.images import sample_images, to_uint8
from vit_einops.inputs import model_inputs, model_inputs_and_pictures
from vit_einops.inspect import attention_relevance, record_attention, show_attention
from vit_einops.prediction import predict
from vit_einops.preprocess import CONVENTIONS, Preprocessing


def ambiguous(name: str, shape: tuple, lo: str, hi: str) -> str:
    return re.escape(
        f"{name} is a float tensor of shape {shape} with values in [{lo}, {hi}]: say how to take it. Raw pixels in "
        "[0, 1] (what torchvision's ToTensor() gives) need the model's preprocessing: pass preprocessed=False. A "
        "tensor already preprocessed for this model (what model.transforms() gives) goes in as it is: pass "
        "preprocessed=True."
    )


@pytest.fixture(scope="module")
def photo():
    """A 60 x 80 crop of scikit-learn's china.jpg (bundled): resized to 36 and centre-cropped to 32 below."""
    return sample_images()[0][0].crop((300, 150, 380, 210))


def photo_model():
    # Noise on every weight: a zero-initialised head would give every image the same uniform prediction.
    torch.manual_seed(0)
    m = perturbed(tiny_vit(TINY_RGB), std=0.5)
    m.preprocessing = Preprocessing.torchvision(crop=32)
    m.class_names = ["ant", "bee", "cat", "dog", "eel"]
    return m


@pytest.fixture(scope="module")
def model():
    """One model for the module (the entry points leave it as they found it), so each reference is computed once."""
    return photo_model()


def pixels(photo) -> torch.Tensor:
    """(3, H, W) uint8: the photo's pixels as a tensor (torchvision's PILToTensor)."""
    return torch.from_numpy(np.array(photo)).permute(2, 0, 1).contiguous()


@pytest.fixture(scope="module")
def forms(photo, model, tmp_path_factory) -> dict[str, tuple]:
    """The photo in every form a user holds it, each with the keyword it needs."""
    folder = tmp_path_factory.mktemp("photo")
    photo.save(folder / "photo.png")  # lossless: the file holds the same pixels
    to_tensor = pixels(photo).float() / 255  # torchvision's ToTensor(): raw pixels in [0, 1]
    x = model.transforms()(photo)
    return {
        "str path": (str(folder / "photo.png"), {}),
        "PathLike": (folder / "photo.png", {}),
        "PIL": (photo, {}),
        "list": ([photo], {}),
        "uint8 (C, H, W)": (pixels(photo), {}),
        "uint8 (1, C, H, W)": (pixels(photo)[None], {}),
        "raw float (C, H, W)": (to_tensor, {"preprocessed": False}),
        "raw float (1, C, H, W)": (to_tensor[None], {"preprocessed": False}),
        "preprocessed (C, H, W)": (x, {"preprocessed": True}),
        "preprocessed (1, C, H, W)": (x[None], {"preprocessed": True}),
    }


FORMS = [
    "str path",
    "PathLike",
    "PIL",
    "list",
    "uint8 (C, H, W)",
    "uint8 (1, C, H, W)",
    "raw float (C, H, W)",
    "raw float (1, C, H, W)",
    "preprocessed (C, H, W)",
    "preprocessed (1, C, H, W)",
]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_is_the_same_model_input(photo, model, forms, form):
    """Bit-identical (tolerance 0) to the model's preprocessing of the PIL image."""
    images, kwargs = forms[form]
    batch = model_inputs(model, images, **kwargs)
    assert batch.dtype == torch.float32 and torch.equal(batch, model.transforms()(photo)[None])


def panels(fig) -> list[np.ndarray]:
    """The attention maps drawn over each head panel of a show_attention figure."""
    return [ax.get_images()[-1].get_array().data for ax in fig.get_axes() if "head" in ax.get_title()]


def explorer_numbers(page: Path) -> dict:
    """The explorer's embedded data without its pictures (a preprocessed input is drawn min-max scaled)."""
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', text, re.S).group(1))
    for pane in data["panes"]:
        for image in pane["images"]:
            image.pop("png")
    return data


ENTRY_POINTS = {
    "predict": lambda model, images, kw, folder: predict(model, images, top_k=5, **kw),
    "record_attention": lambda model, images, kw, folder: record_attention(model, images, **kw),
    "attention_relevance": lambda model, images, kw, folder: attention_relevance(model, images, **kw),
    "show_attention": lambda model, images, kw, folder: (
        (fig := show_attention(model, images, **kw)).get_suptitle(),
        panels(fig),
    ),
    "write_explorer": lambda model, images, kw, folder: explorer_numbers(
        write_explorer(model, images, folder / "e.html", overwrite=True, **kw)
    ),
}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def reference(photo, model, tmp_path_factory) -> dict:
    """Each entry point's answer for the preprocessed tensor, computed once."""
    folder = tmp_path_factory.mktemp("reference")
    x = model.transforms()(photo)[None]
    return {entry: run(model, x, {"preprocessed": True}, folder) for entry, run in ENTRY_POINTS.items()}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_each_entry_point_gives_the_same_answer_for_every_form(model, forms, reference, tmp_path, entry, form):
    """Tolerance 0: every form is the same input (above), so predictions, maps, relevance, figure panels and the
    explorer's numbers are bit-identical to those of the preprocessed tensor."""
    images, kwargs = forms[form]
    assert same(ENTRY_POINTS[entry](model, images, kwargs, tmp_path), reference[entry])


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_float_tensor_of_unsaid_reading_is_refused_by_every_entry_point(photo, model, tmp_path, entry):
    """A ToTensor() photo without the keyword: an error naming both readings, never a silent guess."""
    to_tensor = pixels(photo).float() / 255
    name = "image" if entry == "show_attention" else "images"
    lo, hi = f"{to_tensor.min().item():.4g}", f"{to_tensor.max().item():.4g}"
    with pytest.raises(ValueError, match=ambiguous(name, (3, 60, 80), lo, hi)):
        ENTRY_POINTS[entry](model, to_tensor, {}, tmp_path)
    x = model.transforms()(photo)
    lo, hi = f"{x.min().item():.4g}", f"{x.max().item():.4g}"
    with pytest.raises(ValueError, match=ambiguous(name, (1, 3, 32, 32), lo, hi)):
        ENTRY_POINTS[entry](model, x[None], {}, tmp_path)  # the model's own input, too, must be said
    assert not (tmp_path / "e.html").exists()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_nan_input_is_refused_by_every_entry_point_even_when_said_preprocessed(model, tmp_path, entry):
    """record_attention, attention_relevance and show_attention took it and gave nan maps (a blank figure) as if
    real; predict and write_explorer refused it only after running the model."""
    name = "image" if entry == "show_attention" else "images"
    x = torch.zeros(1, 3, 32, 32)
    x[0, 1, 4, 5] = float("nan")
    with pytest.raises(ValueError, match=re.escape(f"{name} holds non-finite values (nan or inf)")):
        ENTRY_POINTS[entry](model, x, {"preprocessed": True}, tmp_path)
    assert not (tmp_path / "e.html").exists()


def test_a_list_names_the_float_tensor_it_cannot_read(photo, model):
    with pytest.raises(ValueError, match=ambiguous("images[1]", (3, 2, 2), "0.5", "0.5")):
        model_inputs(model, [photo, torch.full((3, 2, 2), 0.5)])


def test_a_list_mixes_forms_with_one_keyword_for_its_float_tensors(photo, model, tmp_path):
    photo.save(tmp_path / "photo.png")
    u8 = pixels(photo)
    images = [tmp_path / "photo.png", u8, u8.float() / 255, u8[None].repeat(2, 1, 1, 1)]
    batch = model_inputs(model, images, preprocessed=False)
    assert batch.shape == (5, 3, 32, 32) and all(torch.equal(row, model.transforms()(photo)) for row in batch)


def test_raw_pixels_the_preprocessing_keeps_the_size_of_are_normalised_without_rounding():
    """Off the 8-bit grid (the digits are k / 16): at the model's size only mean and std apply, in float32."""
    model = tiny_vit(TINY_RGB, image_size=16)
    model.preprocessing = Preprocessing(resize=(16, 16), mean=(0.5, 0.25, 0.0), std=(0.25, 0.5, 2.0))
    x = torch.randint(0, 17, (2, 3, 16, 16)) / 16
    mean, std = torch.tensor([0.5, 0.25, 0.0]).view(3, 1, 1), torch.tensor([0.25, 0.5, 2.0]).view(3, 1, 1)
    torch.testing.assert_close(model_inputs(model, x, preprocessed=False), (x - mean) / std, rtol=0, atol=0)
    batch, shown = model_inputs_and_pictures(model, x, preprocessed=False)
    assert torch.equal(shown, x)  # the picture is the pixels themselves


def test_raw_pixels_to_resize_are_the_8_bit_image_they_encode(model):
    """A resize works on 8-bit images (PIL, as torchvision and timm): float pixels go in as round(255 x)."""
    x = torch.rand(3, 40, 50)
    encoded = Image.fromarray(np.rint(x.permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    assert torch.equal(model_inputs(model, x, preprocessed=False), model.transforms()(encoded)[None])


# One 16 px RGB model for the property below; each example sets its preprocessing.
SMALL = tiny_vit(TINY_RGB, image_size=16)


@given(
    height=st.integers(1, 40),
    width=st.integers(1, 40),
    channels=st.sampled_from([1, 3]),
    convention=st.sampled_from(CONVENTIONS),
    seed=st.integers(0, 2**32 - 1),
)
@example(height=16, width=16, channels=3, convention="plain", seed=0)  # floats at the model's size: only normalised
@example(height=16, width=16, channels=3, convention="hf", seed=1)  # the same, with mean = std = 0.5
def test_8_bit_pixels_are_one_input_in_every_form(height, width, channels, convention, seed):
    """Any size (smaller than the crop too), grey or RGB, every named preprocessing: the uint8 tensor, its
    ToTensor() floats (preprocessed=False) and its PIL image give bit-identical inputs (tolerance 0)."""
    SMALL.preprocessing = Preprocessing.convention(convention, 16)
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    picture = Image.fromarray(array[..., 0] if channels == 1 else array)
    u8 = torch.from_numpy(array).permute(2, 0, 1).contiguous()
    expected = SMALL.transforms()(picture)[None]
    assert torch.equal(model_inputs(SMALL, u8), expected)
    assert torch.equal(model_inputs(SMALL, u8.float() / 255, preprocessed=False), expected)


def test_pictures_are_what_the_model_saw_before_normalising(photo, model):
    batch, shown = model_inputs_and_pictures(model, [photo, pixels(photo)])
    assert shown.shape == (2, 3, 32, 32) and torch.equal(shown[0], shown[1])
    std, mean = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1), torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    torch.testing.assert_close(shown[0], batch[0] * std + mean)  # the normalisation undone
    expected = np.asarray(photo.resize((48, 36), Image.Resampling.BILINEAR))[2:34, 8:40]  # shorter side 36, centre 32
    assert np.array_equal(to_uint8(shown[0]), expected)
    x = model.transforms()(photo)
    lo, hi = x.min(), x.max()
    torch.testing.assert_close(model_inputs_and_pictures(model, x, preprocessed=True)[1][0], (x - lo) / (hi - lo))


def test_where_both_readings_agree_no_keyword_is_needed():
    """The digits' preprocessing (plain, 8x8) leaves a tensor in [0, 1] as it is; a model with no preprocessing
    can only take a tensor as its input. Outside [0, 1] the digits model cannot tell again."""
    digits = tiny_vit(TINY_DIGITS)
    digits.preprocessing = Preprocessing.plain(8, channels=1)
    x = torch.rand(2, 1, 8, 8)
    for preprocessed in (None, False, True):
        assert torch.equal(model_inputs(digits, x, preprocessed=preprocessed), x)
    with pytest.raises(ValueError, match=ambiguous("images", (2, 1, 8, 8), "0", "2")):
        model_inputs(digits, torch.tensor([0.0, 2.0]).repeat(64).view(2, 1, 8, 8))
    fresh = tiny_vit(TINY_DIGITS)
    assert torch.equal(model_inputs(fresh, x * 5), x * 5)
    with pytest.raises(ValueError, match="records no preprocessing; set one"):
        model_inputs(fresh, x, preprocessed=False)
    with pytest.raises(ValueError, match="records no preprocessing; set one"):
        model_inputs(fresh, (x[0] * 255).to(torch.uint8))


ACCEPTED = "a path, a PIL image, a uint8 or float tensor (C, H, W) or (B, C, H, W), or a non-empty list of them"
FLOAT = "float (raw pixels in [0, 1] with preprocessed=False, or the model's input with preprocessed=True)"
RAW = {"preprocessed": False}
RAW_RANGE = (
    "but raw pixels (preprocessed=False) are in [0, 1]: divide 0..255 floats by 255 (or pass a uint8 tensor), or "
    "pass preprocessed=True for the model's input"
)


@pytest.mark.parametrize(
    ("images", "kwargs", "error", "message"),
    [
        ([], {}, ValueError, f"images is an empty list; expected {ACCEPTED}"),  # was "must be ...; got list"
        ((), {}, ValueError, f"images is an empty tuple; expected {ACCEPTED}"),
        (b"photo.jpg", {}, TypeError, f"images must be {ACCEPTED}; got bytes"),  # was "images[0] ...; got int"
        (torch.full((1, 3, 32, 32), float("nan")), {"preprocessed": True}, ValueError, "images holds non-finite"),
        (torch.full((3, 8, 8), float("inf")), {}, ValueError, "images holds non-finite values (nan or inf)"),
        (42, {}, TypeError, f"images must be {ACCEPTED}; got int"),
        ([np.zeros((32, 32, 3))], {}, TypeError, f"images must be {ACCEPTED}; got ndarray of shape (32, 32, 3)"),
        (
            torch.zeros(32, 32),
            {},
            ValueError,
            "images must be an image (C, H, W) or a batch (B, C, H, W), got shape (32, 32)",
        ),
        (torch.zeros(0, 3, 32, 32, dtype=torch.uint8), {}, ValueError, "images holds no image: shape (0, 3, 32, 32)"),
        (
            torch.zeros(3, 32, 32, dtype=torch.int64),
            {},
            TypeError,
            f"images is a torch.int64 tensor; images are uint8 (raw pixels 0..255) or {FLOAT}",
        ),
        (
            torch.zeros(32, 40, 3, dtype=torch.uint8),
            {},
            ValueError,
            "images has 32 channels in (C, H, W) (32, 40, 3); expected 1 or 3 (channels last? use x.permute(2, 0, 1))",
        ),
        (torch.full((3, 8, 8), 255.0), RAW, ValueError, f"images holds values in [255, 255], {RAW_RANGE}"),
        (torch.full((3, 8, 8), float("nan")), RAW, ValueError, "images holds non-finite values (nan or inf)"),
        (torch.zeros(3, 8, 8), {"preprocessed": 1}, TypeError, "preprocessed must be True, False or None, got 1"),
        (torch.zeros(3, 16, 16), {"preprocessed": True}, ValueError, "expected height, width (32, 32)"),
    ],
)
def test_bad_images_are_named(model, images, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        model_inputs(model, images, **kwargs)


def test_files_open_through_open_image(model, tmp_path):
    (tmp_path / "photo.jpg").mkdir()  # a directory named like an image: refused by open_image, with its name
    refusal = f"cannot read image {str(tmp_path / 'photo.jpg')!r}: not a regular file"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        predict(model, tmp_path / "photo.jpg")


def test_a_module_without_preprocessing_takes_its_input_and_says_so_for_anything_else(photo):
    """record_attention takes any module with Attend layers: a float tensor is its input, a picture needs more."""
    encoder = tiny_vit(TINY_RGB).blocks
    x = torch.rand(1, 17, 48)
    _, maps, _ = record_attention(encoder, x)
    assert maps.shape == (2, 1, 4, 17, 17)
    message = (
        "a TransformerEncoder has no preprocessing (model.transforms()) to read images with; pass the model's input "
        "as a float tensor with preprocessed=True"
    )
    for images, kwargs in ((photo, {}), (x, {"preprocessed": False})):
        with pytest.raises(TypeError, match=re.escape(message)):
            record_attention(encoder, images, **kwargs)


def test_images_made_here_come_on_the_models_dtype(photo):
    model = photo_model().double()
    assert model_inputs(model, [photo, pixels(photo)]).dtype == torch.float64
    x = model.transforms()(photo)[None].double()
    assert model_inputs(model, x, preprocessed=True) is x  # one preprocessed tensor comes back as it is
