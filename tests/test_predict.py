"""predict(): any model, any image file, through the model's own preprocessing; and `vit-einops predict`."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from _interop import perturbed
from _tiny import TINY_RGB, tiny_vit
from PIL import Image

from vit_einops import load_model
from vit_einops.commands.cli import main
from vit_einops.images import open_image
from vit_einops.interop import save_state_dict_file, to_torchvision
from vit_einops.modelfile import save_vit
from vit_einops.prediction import Prediction, class_name, predict
from vit_einops.preprocess import Preprocessing


@pytest.fixture
def images(tmp_path):
    """One file per mode a user might hold: RGB JPEG of odd size, RGBA PNG, grey, palette, 16-bit PNG."""
    rng = np.random.default_rng(0)
    paths = []
    rgb = Image.fromarray(rng.integers(0, 256, (45, 61, 3), dtype=np.uint8))
    rgb.save(tmp_path / "photo.jpg")
    rgb.convert("RGBA").save(tmp_path / "rgba.png")
    rgb.convert("L").save(tmp_path / "grey.png")
    rgb.convert("P").save(tmp_path / "palette.png")
    Image.fromarray(rng.integers(0, 65536, (40, 40), dtype=np.uint16)).save(tmp_path / "deep.png")
    for name in ("photo.jpg", "rgba.png", "grey.png", "palette.png", "deep.png"):
        paths.append(tmp_path / name)
    return paths


@pytest.fixture
def model():
    m = perturbed(tiny_vit(TINY_RGB), std=0.5)
    m.preprocessing = Preprocessing.torchvision(crop=32, resize=36)
    m.class_names = ["ant", "bee", "cat", "dog", "eel"]
    return m


def test_predict_equals_softmax_of_the_model_on_its_own_preprocessing(model, images):
    results = predict(model, images, top_k=3)
    x = torch.stack([model.transforms()(open_image(p)) for p in images])
    with torch.no_grad():
        probs = model.eval()(x).softmax(-1)
    for top, row in zip(results, probs):
        values, indices = row.topk(3)
        assert [p.index for p in top] == indices.tolist()
        assert [p.label for p in top] == [model.class_names[i] for i in indices.tolist()]
        assert np.allclose([p.probability for p in top], values.tolist(), atol=1e-6)
        assert all(isinstance(p, Prediction) for p in top)


def test_predict_accepts_pil_images_tensors_and_single_paths(model, images):
    one = predict(model, images[0], top_k=1)
    assert predict(model, open_image(images[0]), top_k=1) == one
    tensor = model.transforms()(open_image(images[0]))
    assert predict(model, tensor, top_k=1, preprocessed=True) == one
    assert len(predict(model, images, top_k=99)[0]) == 5  # capped at the number of classes


def test_class_name_is_the_recorded_name_or_class_and_index():
    assert class_name(2, ["cat", "dog", "bird"]) == "bird"
    assert class_name(7, ["cat", "dog", "bird"]) == "class 7"  # more outputs than names: a preset on the digits
    assert class_name(-1, ["cat", "dog", "bird"]) == "class -1"
    assert class_name(7, None) == "class 7"


def test_unnamed_classes_in_predictions_and_the_table(model, images, tmp_path, capsys):
    model.class_names = None
    assert all(p.label == f"class {p.index}" for p in predict(model, images[:1])[0])
    save_vit(model, tmp_path / "m.safetensors")
    assert main(["predict", str(tmp_path / "m.safetensors"), str(images[0]), "--top-k", "1"]) == 0
    top = predict(model, images[0], top_k=1)[0][0]
    assert capsys.readouterr().out.splitlines()[1].split() == [f"{top.probability:.2%}", "class", str(top.index)]


def test_named_classes_in_the_table_carry_their_index(model, images, tmp_path, capsys):
    save_vit(model, tmp_path / "m.safetensors")
    assert main(["predict", str(tmp_path / "m.safetensors"), str(images[0]), "--top-k", "1"]) == 0
    top = predict(model, images[0], top_k=1)[0][0]
    assert capsys.readouterr().out.splitlines()[1].split() == [f"{top.probability:.2%}", top.label, f"({top.index})"]


@pytest.mark.parametrize(
    ("images_arg", "error", "words"),
    [
        ([], ValueError, "images is an empty list"),
        (42, TypeError, "images must be a path"),
        (torch.zeros(1, 3, 16, 16), ValueError, "say how to take it"),
    ],
)
def test_bad_images(model, images_arg, error, words):
    with pytest.raises(error, match=words):
        predict(model, images_arg)
    with pytest.raises(ValueError, match="expected height, width"):
        predict(model, torch.zeros(1, 3, 16, 16), preprocessed=True)


def test_a_to_tensor_photo_is_refused_without_the_keyword_and_equals_the_file_with_it(model, images):
    """The silent skip of issue 18: a ToTensor()-style [0, 1] tensor was run unpreprocessed. Now it is an error
    without preprocessed=, and with preprocessed=False the same prediction as the file (bit-identical)."""
    pixels = torch.from_numpy(np.array(open_image(images[0]))).permute(2, 0, 1).float() / 255
    with pytest.raises(ValueError, match=r"pass preprocessed=False.*pass preprocessed=True"):
        predict(model, pixels)
    assert predict(model, pixels, preprocessed=False) == predict(model, images[0])


def test_features_only_models_and_missing_preprocessing_say_what_to_do(images):
    with pytest.raises(ValueError, match="num_classes 0"):
        predict(tiny_vit(TINY_RGB, num_classes=0), images)
    with pytest.raises(ValueError, match="records no preprocessing; set one"):  # the advice is the point here
        predict(tiny_vit(TINY_RGB), images)


def test_cli_converted_torchvision_file_any_mode(model, images, tmp_path, capsys):
    save_state_dict_file(to_torchvision(model), tmp_path / "tv.pth")
    assert (
        main(
            [
                "convert",
                str(tmp_path / "tv.pth"),
                str(tmp_path / "m.safetensors"),
                "--from",
                "torchvision",
                "--heads",
                "4",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "m.safetensors"), *map(str, images), "--top-k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    loaded = load_model(tmp_path / "m.safetensors")
    expected = predict(loaded, images, top_k=2)
    assert [r["image"] for r in out] == [str(p) for p in images]
    assert [[p["index"] for p in r["top"]] for r in out] == [[p.index for p in top] for top in expected]
    assert main(["predict", str(tmp_path / "m.safetensors"), str(images[0])]) == 0
    assert str(images[0]) in capsys.readouterr().out


def test_cli_preprocessing_flags_override_the_record(model, images, tmp_path, capsys):
    save_vit(model, tmp_path / "m.safetensors")
    args = ["predict", str(tmp_path / "m.safetensors"), str(images[0]), "--json", "--top-k", "5"]
    assert main([*args, "--preprocessing", "plain"]) == 0
    plain = json.loads(capsys.readouterr().out)[0]["top"]
    model.preprocessing = Preprocessing.plain(32)
    assert [p["index"] for p in plain] == [p.index for p in predict(model, images[0])[0]]
    assert main([*args, "--crop", "16"]) == 2
    assert "preprocessing produces (16, 16) images; the model takes (32, 32)" in capsys.readouterr().err


@pytest.mark.parametrize("convention", ["torchvision", "timm", "hf", "plain"])
def test_cli_preprocessing_convention_and_crop_pct(model, images, tmp_path, capsys, convention):
    """--preprocessing NAME is Preprocessing.convention(NAME) at the model's size; --crop-pct applies timm's resize
    and crop to it (so --preprocessing timm --crop-pct P is Preprocessing.timm(crop_pct=P))."""
    save_vit(model, tmp_path / "m.safetensors")
    args = ["predict", str(tmp_path / "m.safetensors"), str(images[0]), "--json", "--preprocessing", convention]

    def same_as(argv, preprocessing):
        assert main(argv) == 0
        printed = json.loads(capsys.readouterr().out)[0]["top"]
        model.preprocessing = preprocessing
        expected = predict(model, images[0])[0]
        assert [p["index"] for p in printed] == [p.index for p in expected]
        assert [p["probability"] for p in printed] == pytest.approx([p.probability for p in expected], abs=1e-6)

    base = Preprocessing.convention(convention, (32, 32))
    same_as(args, base)
    timm = Preprocessing.timm(crop=32, crop_pct=0.5)
    same_as([*args, "--crop-pct", "0.5"], dataclasses.replace(base, resize=timm.resize, crop=timm.crop))


@pytest.mark.parametrize("crop_pct", ["0", "1.5", "nan"])
def test_cli_bad_crop_pct_is_named(model, images, tmp_path, capsys, crop_pct):
    save_vit(model, tmp_path / "m.safetensors")
    for convention in ("timm", "plain"):
        argv = ["predict", str(tmp_path / "m.safetensors"), str(images[0]), "--preprocessing", convention]
        assert main([*argv, "--crop-pct", crop_pct]) == 2
        assert f"crop_pct must be in (0, 1], got {float(crop_pct)}" in capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path, model, capsys):
    save_vit(model, tmp_path / "m.safetensors")
    assert main(["predict", str(tmp_path / "m.safetensors"), str(tmp_path / "absent.jpg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-einops predict: error: cannot read image") and err.count("\n") == 1
    assert main(["predict", str(tmp_path / "m.safetensors"), str(tmp_path), "--top-k", "0"]) == 2
    assert re.search(r"--top-k.*got 0", capsys.readouterr().err)


def test_stale_class_names_after_a_head_swap_are_an_error_not_a_wrong_label(model, images):
    model.head.fc = torch.nn.Linear(48, 7)
    with pytest.raises(ValueError, match="class_names has 5 names.* 7 outputs"):
        predict(model, images[:1])


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_predicts_the_readable_images_and_names_each_unreadable_one(model, images, tmp_path, capsys, as_json):
    """One bad file among good ones: the good ones are predicted as alone, each bad one gets its own stderr line
    naming the file and why, and the exit status says that not all went well."""
    save_vit(model, tmp_path / "m.safetensors")
    (tmp_path / "notes.png").write_text("not an image")
    good = [str(images[0]), str(images[2])]
    files = [good[0], str(tmp_path / "notes.png"), good[1], str(tmp_path / "absent.jpg")]
    flags = ["--top-k", "2", *(["--json"] if as_json else [])]
    assert main(["predict", str(tmp_path / "m.safetensors"), *good, *flags]) == 0
    alone = capsys.readouterr().out
    assert main(["predict", str(tmp_path / "m.safetensors"), *files, *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == alone  # the readable images' results, exactly as without the bad files
    assert captured.err.splitlines() == [
        f"vit-einops predict: error: cannot read image {str(tmp_path / 'notes.png')!r}: not an image of a format "
        "vit-einops reads (PNG, JPEG, GIF, BMP, TIFF, WEBP, PPM)",
        f"vit-einops predict: error: cannot read image {str(tmp_path / 'absent.jpg')!r}: No such file or directory",
        "threads: 1 (VIT_EINOPS_THREADS)",  # the summary of the predictions made (tests/conftest.py fixes the count)
    ]
