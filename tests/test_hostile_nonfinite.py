"""Non-finite results are refused, never ranked: predict and inspect stop with one line naming the likely cause (the
weights, or the preprocessing's mean and std), and a std that would send pixels to inf is refused where it enters."""

from __future__ import annotations

import re

import pytest
import torch
from _hostile import assert_user_error, grey_png, run_cli, tiny_model

import vit_einops.inspect.report as report
from vit_einops.inspect import METHODS, explain, write_report
from vit_einops.prediction import predict
from vit_einops.modelfile import save_vit
from vit_einops.preprocess import Preprocessing

OUTPUTS = r"the model's outputs hold \d+ non-finite values \(nan or inf\) of \d+: in image 0, whose preprocessed "
OUTPUTS += r"pixels are "
WEIGHTS = OUTPUTS + r"finite, so the model's weights are the likely cause: huge values that overflow \(float32 ends "
WEIGHTS += r"near 3.4e38\)"
PIXELS = OUTPUTS + r"already nan or inf: the preprocessing's mean or std scales them out of range"


def huge(parameter: str, scale: float):
    """The tiny model with one parameter multiplied by ``scale``: finite weights whose activations overflow."""
    model = tiny_model()
    with torch.no_grad():
        model.get_parameter(parameter).mul_(scale)
    return model


HUGE = [("patch_embed.proj.weight", 1e38), ("patch_embed.proj.weight", 1e20), ("blocks.0.mlp.ff.fc1.weight", 1e30)]


@pytest.mark.parametrize("parameter, scale", HUGE)
def test_predict_refuses_non_finite_logits_from_huge_weights(tmp_path, parameter, scale):
    model = huge(parameter, scale)
    image = grey_png(tmp_path / "x.png")
    with pytest.raises(ValueError, match=WEIGHTS):
        predict(model, image)
    save_vit(model, tmp_path / "m.safetensors")
    assert_user_error(run_cli("predict", tmp_path / "m.safetensors", image), WEIGHTS)


@pytest.mark.parametrize("mean, std", [((1e38,), (1.2e-38,)), ((-3e38,), (0.5,)), ((3e38,), (1e-30,))])
def test_predict_names_the_preprocessing_when_pixels_overflow(tmp_path, mean, std):
    model = tiny_model(preprocessing=Preprocessing(resize=(8, 8), mean=mean, std=std))
    with pytest.raises(ValueError, match=PIXELS):
        predict(model, grey_png(tmp_path / "x.png"))


@pytest.mark.parametrize("std", ["1e-320", "1e-39", "5e-324", "1e-38,1e-38,1e-38"])
def test_a_std_below_the_smallest_normal_float32_is_refused_where_it_enters(tmp_path, std):
    save_vit(tiny_model(), tmp_path / "m.safetensors")
    args = ("--mean", "0,0,0") if "," in std else ()
    result = run_cli("predict", tmp_path / "m.safetensors", grey_png(tmp_path / "x.png"), "--std", std, *args)
    assert_user_error(result, r"std must be at least 1.18e-38 \(the smallest normal float32\), got \(")
    with pytest.raises(ValueError, match="std must be at least 1.18e-38"):
        Preprocessing(resize=8, std=(float(std.split(",")[0]),), mean=(0.0,))


@pytest.mark.parametrize("flags", [["--std", "nan"], ["--mean", "inf"], ["--std", "0"], ["--std", "-1"]])
def test_non_finite_or_non_positive_flags_are_refused(tmp_path, flags):
    save_vit(tiny_model(), tmp_path / "m.safetensors")
    result = run_cli("predict", tmp_path / "m.safetensors", grey_png(tmp_path / "x.png"), *flags)
    assert_user_error(result, r"(std|mean) must (hold finite numbers|be positive), got ")


@pytest.mark.parametrize("parameter, scale", HUGE)
def test_inspect_refuses_non_finite_outputs_and_writes_nothing(tmp_path, parameter, scale):
    save_vit(huge(parameter, scale), tmp_path / "m.safetensors")
    result = run_cli(
        "inspect", tmp_path / "m.safetensors", "--image", grey_png(tmp_path / "x.png"), "--out", tmp_path / "out"
    )
    assert_user_error(result, WEIGHTS)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("array", ["mean_attention_distance", "position_similarity", "filter_explained_variance"])
def test_inspect_writes_nothing_when_any_array_is_not_finite(tmp_path, monkeypatch, array):
    """A statistic that comes out non-finite stops the report, naming the array, before any file is written. (The
    mean attention distance may be nan, meaning undefined: a head whose patches attend only to the class token.
    Only inf is an overflow there.)"""
    name = {
        "mean_attention_distance": "mean_attention_distance",
        "position_similarity": "model_position_similarity",
        "filter_explained_variance": "embedding_filter_components",
    }[array]
    original = getattr(report, name)

    def with_nan(*args, **kwargs):
        out = original(*args, **kwargs)
        bad = float("inf") if array == "mean_attention_distance" else float("nan")
        if isinstance(out, tuple):
            return out[0], torch.full_like(out[1], bad)
        return torch.full_like(out, bad)

    monkeypatch.setattr(report, name, with_nan)
    with pytest.raises(ValueError, match=rf"the {array} hold \d+ non-finite values \(nan or inf\) of \d+: nothing was"):
        write_report(tiny_model(), torch.rand(2, 1, 8, 8), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def nan_weights():
    """The tiny model with every weight nan: each of its activations, attention maps and gradients is nan."""
    model = tiny_model()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    return model


# Rollout's check of its input meets the nan attention before any map exists, and names the attention.
ATTENTION_FIRST = {"rollout", "gradient-rollout"}
# The random map reads no model: on a model of nan weights it is the map it is on any other.
MODEL_FREE = {"random"}
NAN_MAPS = (
    "the maps of method {!r} hold 48 non-finite values (nan or inf) of 48: in image 0 (and 2 more), whose "
    "preprocessed pixels are finite, so the model's weights are the likely cause: huge values that overflow (float32 "
    "ends near 3.4e38), or a model that is not a trained ViT"
)


@pytest.mark.parametrize("name", list(METHODS))
def test_no_method_returns_maps_of_nan_from_a_model_of_nan_weights(name):
    """Every method of the registry, a new one included: relevance, Grad-CAM and attention returned maps all nan
    without a word."""
    images = torch.rand(3, 1, 8, 8)
    if name in MODEL_FREE:
        expected = explain(tiny_model(), images, name, preprocessed=True)
        assert torch.equal(explain(nan_weights(), images, name, preprocessed=True), expected)
        return
    with pytest.raises(ValueError) as refused:
        explain(nan_weights(), images, name, preprocessed=True)
    message = "the attention maps hold non-finite values (nan or inf)" if name in ATTENTION_FIRST else NAN_MAPS
    assert str(refused.value) == message.format(name)


def test_faithfulness_on_a_model_whose_weights_overflow_names_the_method_and_writes_nothing(tmp_path):
    """(A model file of nan weights is refused where it loads.)"""
    save_vit(huge(*HUGE[0]), tmp_path / "m.safetensors")
    (tmp_path / "images").mkdir()
    grey_png(tmp_path / "images" / "x.png")
    result = run_cli("faithfulness", tmp_path / "m.safetensors", "--images", tmp_path / "images", "--methods",
                     "relevance", "--out", tmp_path / "out", "--no-progress")
    maps = NAN_MAPS.format("relevance").replace("48", "16").replace(" (and 2 more)", "")
    assert_user_error(result, re.escape(maps))
    assert not (tmp_path / "out").exists()
