"""Inputs at the edge, and the messages users see: degenerate and mistyped inputs refused where they enter, with the
value and what was expected, and every string from the command line, a path or a file echoed with control characters
escaped (the command line's errors are one line, exit status 2)."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch
from _tiny import TINY_DIGITS, TINY_RGB, model_flags, tiny_vit
from PIL import Image
from safetensors.torch import save_file

from vit_einops import Preprocessing, predict
from vit_einops.commands.cli import COMMANDS, main
from vit_einops.inspect import attention_relevance, attention_rollout, record_attention
from vit_einops.interop import load_hf, save_hf
from vit_einops.interop.hf import preprocessing_from_hf
from vit_einops.interop.timm import timm_config, to_timm
from vit_einops.modelfile import save_vit


@pytest.fixture(autouse=True)
def _no_traceback(monkeypatch):
    """Errors as a user sees them, whatever the environment the suite runs in."""
    monkeypatch.delenv("VIT_EINOPS_TRACEBACK", raising=False)


def cli(capsys, *argv):
    """`vit-einops ARGV` through main() in this process: (exit status, stdout, stderr); argparse's errors exit."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(result, line: str) -> None:
    """Exit status 2, nothing on stdout, and stderr exactly ``line``: one line, no usage, no traceback."""
    code, out, err = result
    assert (code, out, err) == (2, "", line + "\n")


@pytest.fixture
def rgb_model():
    """TINY_RGB (32 px in 8 px patches) with the HF convention's preprocessing at its size."""
    model = tiny_vit(TINY_RGB)
    model.preprocessing = Preprocessing.hf(TINY_RGB["image_size"])
    return model


def hf_directory(tmp_path, model, **processor):
    """``model`` saved as a Hugging Face directory, its preprocessor_config.json's fields replaced by ``processor``."""
    directory = save_hf(model, tmp_path / "hf")
    path = directory / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **processor}))
    return directory


def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.new("RGB", (40, 30), (200, 100, 50)).save(path)
    return path


# --- 6. silently wrong results ---------------------------------------------------------------------------------------


def test_a_preprocessor_config_of_another_size_is_refused_by_the_api_as_by_the_cli(tmp_path, capsys, rgb_model):
    """A 16 px preprocessor_config.json on a 32 px model: HF's models resample E_pos (dynamic_size "hf"), so the
    16 px input ran, at the wrong scale. The API refuses it with the CLI's own check and words."""
    directory = hf_directory(tmp_path, rgb_model, size={"height": 16, "width": 16})
    model = load_hf(directory)
    message = "preprocessing produces (16, 16) images; the model takes (32, 32)"
    with pytest.raises(ValueError, match=re.escape(message)):
        predict(model, Image.new("RGB", (40, 30)))
    with pytest.raises(ValueError, match=re.escape(message)):
        model.transforms()
    assert_one_line_error(
        cli(capsys, "predict", "--from", "hf", directory, photo(tmp_path)), f"vit-einops predict: error: {message}"
    )


def test_a_preprocessing_of_other_channels_is_refused_before_images_are_read(rgb_model):
    rgb_model.preprocessing = Preprocessing.plain(32, channels=1)
    with pytest.raises(ValueError, match=r"^preprocessing produces 1-channel images \(its mean and std\); the model"):
        predict(rgb_model, Image.new("RGB", (40, 30)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(resize=16, crop=32), "crop 32x32 is larger than the resize to 16 (the shorter side)"),
        (dict(resize=16, crop=(8, 17)), "crop 8x17 is larger than the resize to 16 (the shorter side)"),
        (dict(resize=(2, 2), crop=(4, 4)), "crop 4x4 is larger than the resize to 2x2"),
        (dict(resize=(32, 48), crop=(32, 49)), "crop 32x49 is larger than the resize to 32x48"),
    ],
)
def test_a_crop_larger_than_its_resize_is_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + ": images would be padded with black"):
        Preprocessing(**kwargs)


def test_a_crop_larger_than_its_resize_is_refused_from_a_file_and_the_command_line(tmp_path, capsys, rgb_model):
    with pytest.raises(ValueError, match=r"^preprocessor_config\.json: crop 64x64 is larger than the resize to 32x32"):
        preprocessing_from_hf({"size": {"height": 32, "width": 32}, "do_center_crop": True, "crop_size": 64})
    save_vit(rgb_model, tmp_path / "m.safetensors")
    result = cli(capsys, "predict", tmp_path / "m.safetensors", photo(tmp_path), "--resize", "16", "--crop", "32")
    message = "crop 32x32 is larger than the resize to 16 (the shorter side): images would be padded with black"
    assert_one_line_error(result, f"vit-einops predict: error: {message} to fill it; resize to at least the crop")


def test_torchvisions_non_square_crop_fits_a_portrait_image():
    """The shorter side resized to 256/224 of the crop's longer side: a portrait image is as wide as the crop, and
    nothing of the crop is padding (a white photo stays white)."""
    prep = Preprocessing.torchvision(crop=(32, 48))
    assert prep.resize == 54  # floor(48 * 256 / 224)
    out = prep(Image.new("RGB", (50, 70), (255, 255, 255)))
    assert out.shape == (3, 32, 48)
    torch.testing.assert_close(out, prep.normalise(torch.ones(3, 32, 48)), rtol=0, atol=0)


@pytest.mark.parametrize("size, mode", [((0, 0), "RGB"), ((0, 5), "RGB"), ((5, 0), "L"), ((0, 3), "I;16")])
def test_an_image_with_a_side_of_0_is_refused(rgb_model, size, mode):
    with pytest.raises(ValueError, match=rf"^the image is {size[0]}x{size[1]} pixels: an image with a side of 0"):
        predict(rgb_model, Image.new(mode, size))


# Two layers of two heads over three tokens; both heads' row 2 in layer 1 is all zeros.
ONE_ZERO_ROW = torch.cat([torch.rand(1, 1, 2, 3, 3), torch.ones(1, 1, 2, 3, 3) * torch.tensor([[1.0], [1.0], [0.0]])])


@pytest.mark.parametrize(
    "maps, residual, head_fusion, message",
    [
        (torch.full((2, 1, 1, 3, 3), float("nan")), 0.0, "mean", "non-finite values"),
        (torch.full((2, 1, 1, 3, 3), float("nan")), 0.5, "mean", "non-finite values"),
        (torch.full((2, 1, 1, 3, 3), float("inf")), 0.5, "max", "non-finite values"),
        (torch.zeros(2, 1, 1, 3, 3), 0.0, "mean", "with residual 0, the mean of the heads' attention is all zeros in "
         "layer 0, image 0, row 0 (6 such rows in all): nothing to renormalise; use a residual above 0"),
        (ONE_ZERO_ROW, 0.0, "mean", "all zeros in layer 1, image 0, row 2 (1 such row in all)"),
        (torch.stack([torch.eye(2), torch.eye(2).flip(0)])[None, None], 0.0, "min",
         "all zeros in layer 0, image 0, row 0 (2 such rows in all): nothing to renormalise; use a residual above 0 "
         "or another head_fusion"),
        (-torch.rand(2, 1, 1, 3, 3), 0.5, "mean", "negative values"),
        (torch.zeros(0, 1, 1, 3, 3), 0.5, "mean", "are empty: shape (0, 1, 1, 3, 3)"),
    ],
)  # fmt: skip
def test_rollout_refuses_maps_it_cannot_roll_out(maps, residual, head_fusion, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        attention_rollout(maps, residual=residual, head_fusion=head_fusion)


def test_rollout_of_recorded_maps_still_runs_at_residual_0():
    """Softmax rows sum to 1, so no row is all zeros: residual 0 is Abnar and Zuidema's plain product."""
    _, maps, _ = record_attention(tiny_vit(), torch.rand(2, 1, 8, 8), preprocessed=True)
    rollout = attention_rollout(maps, residual=0.0)
    torch.testing.assert_close(rollout, maps[1].mean(1) @ maps[0].mean(1))


# --- 7. raw control characters -----------------------------------------------------------------------------------


def test_an_unknown_flag_is_echoed_escaped_on_one_line(tmp_path, capsys):
    result = cli(capsys, "predict", tmp_path / "m.safetensors", "x.png", "--bogus\x1b[2J\r")
    assert_one_line_error(result, "vit-einops predict: error: unrecognized arguments: --bogus\\x1b[2J\\r")
    result = cli(capsys, "--bogus\x1b[2J")
    assert_one_line_error(
        result,
        f"vit-einops: error: a command is required (one of {', '.join(COMMANDS)}); unrecognized arguments: "
        "--bogus\\x1b[2J",
    )


def test_a_bad_value_and_a_bad_command_are_one_line(capsys):
    result = cli(capsys, "predict", "--top-k", "x\u202e")
    assert_one_line_error(result, "vit-einops predict: error: argument --top-k: invalid int value: 'x\\u202e'")
    code, out, err = cli(capsys, "pred\x1bict")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("vit-einops: error: argument COMMAND: invalid choice: 'pred\\x1bict'")


def test_train_prints_its_output_path_and_draws_class_folder_names_escaped(tmp_path, capsys, one_thread):
    """A run on folders named with ESC and CR, into an --out named with ESC: the "wrote" line escapes it, and the
    confusion matrix draws the class names escaped, so matplotlib warns of no missing glyph (its warning would
    print the raw character). One epoch of a one-block model: about a second."""
    for c, name in enumerate(["\x1b[31mcat", "dog\r"]):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (6, 6), (200 * c, 30 * i, 0)).save(tmp_path / "data" / name / f"{i}.png")
    out = tmp_path / "run\x1b[2J"
    flags = [*model_flags({**TINY_DIGITS, "depth": 1}), "--image-size", "8", "--patch-size", "4", "--epochs", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, stdout, _ = cli(capsys, "train", "--data", tmp_path / "data", *flags, "--no-progress", "--out", out)
    assert code == 0
    assert stdout.startswith("test accuracy ") and f"; wrote {tmp_path}/run\\x1b[2J/ (model.safetensors" in stdout
    assert "\x1b" not in stdout
    glyphs = [str(w.message) for w in caught if "Glyph" in str(w.message)]
    assert glyphs == [] and (out / "confusion.png").stat().st_size > 0


# --- 8. tracebacks and unclear errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "images, preprocessed, error, message",
    [
        (torch.empty(1, 3, 32, 32, device="meta"), True, ValueError, "images is a meta tensor (a shape without value"),
        (torch.empty(3, 32, 32, device="meta"), None, ValueError, "images is a meta tensor (a shape without values)"),
        (torch.rand(1, 3, 32, 32).to_sparse(), True, TypeError,
         "images is a sparse_coo tensor; expected a dense (strided) tensor: pass images.to_dense()"),
        (torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8).to_sparse(), None, TypeError,
         "images is a sparse_coo tensor"),
        ([torch.rand(3, 32, 32), torch.rand(3, 32, 32).to_mkldnn()], False, TypeError,
         "images[1] is a mkldnn tensor; expected a dense (strided) tensor"),
        (torch.rand(1, 3, 32, 32, dtype=torch.complex64), True, TypeError, "images is a torch.complex64 tensor"),
    ],
)  # fmt: skip
def test_tensors_without_values_or_strides_are_refused_by_predict(rgb_model, images, preprocessed, error, message):
    with pytest.raises(error, match="^" + re.escape(message)):
        predict(rgb_model, images, preprocessed=preprocessed)


def test_the_model_refuses_a_sparse_input_and_a_meta_model_takes_a_meta_one():
    model = tiny_vit(TINY_RGB)
    with pytest.raises(TypeError, match=r"^x is a sparse_coo tensor; expected a dense \(strided\) tensor"):
        model(torch.rand(1, 3, 32, 32).to_sparse())
    with torch.device("meta"):
        meta = tiny_vit(TINY_RGB)
    assert meta(torch.empty(2, 3, 32, 32, device="meta")).shape == (2, TINY_RGB["num_classes"])


@pytest.mark.parametrize(
    "target, shape",
    [(torch.zeros(1, 0), (1, 0)), (torch.zeros(1, 0, dtype=torch.long), (1, 0)), ([], (0,)), (np.zeros(0), (0,))],
)
def test_a_target_naming_no_class_is_refused(target, shape):
    with pytest.raises(ValueError, match=re.escape(f"target names no class: shape {shape}; expected at least one")):
        attention_relevance(tiny_vit(TINY_RGB), torch.rand(1, 3, 32, 32), target, preprocessed=True)


@pytest.mark.parametrize("target", [np.int64(2), np.int32(2), np.uint8(2), torch.tensor(2), np.array(2)])
def test_numpy_and_torch_integer_scalars_are_a_class_index(target):
    model, x = tiny_vit(TINY_RGB), torch.rand(2, 3, 32, 32)
    expected = attention_relevance(model, x, 2, preprocessed=True)
    torch.testing.assert_close(attention_relevance(model, x, target, preprocessed=True), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "target, got",
    [(True, "True"), (np.bool_(True), repr(np.bool_(True))), (2.0, "2.0"), (np.float64(2.0), repr(np.float64(2.0))),
     (torch.tensor(2.0), "tensor(2.)"), (torch.tensor([True, False]), "dtype torch.bool"), ("2", "str '2'")],
)  # fmt: skip
def test_bools_floats_and_strings_are_no_class_index(target, got):
    message = f"target must be None, an integer class index, or integer class indices (b,) or (b, k), got {got}"
    with pytest.raises(TypeError, match="^" + re.escape(message)):
        attention_relevance(tiny_vit(TINY_RGB), torch.rand(2, 3, 32, 32), target, preprocessed=True)


@pytest.mark.parametrize(
    "layers, error, message",
    [
        ([], ValueError, "layers is empty: name at least one of the model's 2 attention layers, or pass None for all"),
        (1, TypeError, "layers must be a sequence of layer indices, or None for all, got 1"),
    ],
)
def test_record_attention_refuses_no_layers(layers, error, message):
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        record_attention(tiny_vit(), torch.rand(1, 1, 8, 8), layers, preprocessed=True)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("resample", [2], "resample [2] is not supported; expected 0, 2 or 3"),
        ("resample", False, "resample False is not supported; expected 0, 2 or 3"),
        ("resample", 2.0, "resample 2.0 is not supported; expected 0, 2 or 3"),
        ("rescale_factor", "x", "rescale_factor 'x': only 1/255 (uint8 to [0, 1]) is supported"),
        ("do_rescale", "no", "'do_rescale' must be true, false or null, got 'no'"),
        ("do_resize", 0, "'do_resize' must be true, false or null, got 0"),
        ("size", {"height": "16", "width": 16}, ": resize[0] must be an int, got '16' of type str"),
    ],
)
def test_preprocessor_config_fields_of_the_wrong_type_are_named(tmp_path, capsys, rgb_model, field, value, message):
    directory = hf_directory(tmp_path, rgb_model, **{field: value})
    path = directory / "preprocessor_config.json"
    error = TypeError if field == "size" else ValueError
    with pytest.raises(error, match="^" + re.escape(f"{path}{' ' * (message[0] != ':')}{message}") + "$"):
        load_hf(directory)
    result = cli(capsys, "predict", "--from", "hf", directory, photo(tmp_path))
    assert_one_line_error(result, f"vit-einops predict: error: {path}{' ' * (message[0] != ':')}{message}")


@pytest.mark.parametrize("value", ["0", "false", "no", "", "False", " NO "])
def test_a_false_traceback_variable_keeps_the_one_line_error(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("VIT_EINOPS_TRACEBACK", value)
    result = cli(capsys, "predict", tmp_path / "absent.safetensors", "x.png")
    message = f"{tmp_path}/absent.safetensors: no such model file or directory"
    assert_one_line_error(result, f"vit-einops predict: error: {message}")


@pytest.mark.parametrize("value", ["1", "true", "yes", "TRUE"])
def test_a_true_traceback_variable_raises(tmp_path, monkeypatch, value):
    monkeypatch.setenv("VIT_EINOPS_TRACEBACK", value)
    with pytest.raises(FileNotFoundError, match="no such model file or directory"):
        main(["predict", str(tmp_path / "absent.safetensors"), "x.png"])


def test_any_other_traceback_variable_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VIT_EINOPS_TRACEBACK", "maybe\x1b")
    result = cli(capsys, "predict", tmp_path / "absent.safetensors", "x.png")
    assert_one_line_error(
        result,
        "vit-einops predict: error: VIT_EINOPS_TRACEBACK must be 1, true or yes (show tracebacks) or 0, false, no or "
        "empty (do not), got 'maybe\\x1b'",
    )


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_reports_an_unknown_flag_before_missing_arguments(capsys, command):
    result = cli(capsys, command, "--bogus-flag")
    assert_one_line_error(result, f"vit-einops {command}: error: unrecognized arguments: --bogus-flag")


def test_missing_arguments_are_still_reported_one_line(capsys):
    assert_one_line_error(
        cli(capsys, "explore"), "vit-einops explore: error: the following arguments are required: MODEL, --out"
    )


@pytest.fixture
def distilled_timm():
    """A distilled DeiT's timm state dict at TINY_RGB's size: cls_token, dist_token, head_dist, 2 + 16 E_pos rows."""
    return to_timm(tiny_vit(TINY_RGB, distill_token=True))


DISTILLED_ARCHS = "deit_tiny_distilled_patch16_224, deit_small_distilled_patch16_224, deit_base_distilled_patch16_224"


def test_a_timm_file_missing_its_dist_token_says_so(tmp_path, capsys, distilled_timm):
    del distilled_timm["dist_token"]
    message = (
        "the timm state dict holds DeiT's second classifier (head_dist) but no dist_token, which a distilled DeiT "
        f"holds beside it (timm's {DISTILLED_ARCHS}): the file is incomplete"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        timm_config(distilled_timm, heads=4)
    save_file(distilled_timm, tmp_path / "deit.safetensors")
    result = cli(capsys, "predict", "--from", "timm", "--heads", "4", tmp_path / "deit.safetensors", photo(tmp_path))
    assert_one_line_error(result, f"vit-einops predict: error: {message}")


@pytest.mark.parametrize(
    "removed, image_size, message",
    [
        (("dist_token", "head_dist.weight", "head_dist.bias"), None,
         "the timm state dict's pos_embed has 18 rows, one more than 16 patches (a 4x4 grid) and the 1 prefix token it "
         f"holds (cls_token): is its dist_token missing? A distilled DeiT holds cls_token and dist_token (timm's "
         f"{DISTILLED_ARCHS}); if the grid is not square, pass image_size=(H, W)"),
        (("dist_token", "head_dist.weight", "head_dist.bias"), 32,
         "the timm state dict's pos_embed has 18 rows, one more than 16 patches and the 1 prefix token it holds "
         "(cls_token): is its dist_token missing?"),
        (("cls_token",), None,
         "one more than 16 patches (a 4x4 grid) and the 1 prefix token it holds (dist_token): is its cls_token "
         "missing? A timm ViT holds its class token first"),
    ],
)  # fmt: skip
def test_a_pos_embed_with_a_row_for_a_missing_token_names_the_token(distilled_timm, removed, image_size, message):
    state = {k: v for k, v in distilled_timm.items() if k not in removed}
    with pytest.raises(ValueError, match=re.escape(message)):
        timm_config(state, heads=4, image_size=image_size)
