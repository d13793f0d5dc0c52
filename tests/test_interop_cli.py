"""`vit-einops convert`: files between torchvision, timm and vit-einops layouts, through the real CLI entry point."""

from __future__ import annotations

import pytest
import torch
from _interop import TINY, assert_same_state

from vit_einops import ViT
from vit_einops.commands.cli import main
from vit_einops import load_vit, save_vit
from vit_einops.interop import (
    load_state_dict_file,
    resample_pos_embed,
    save_state_dict_file,
    to_timm,
    to_torchvision,
)


def convert(*args) -> int:
    return main(["convert", *map(str, args)])


def test_torchvision_to_vit_einops_and_back(tmp_path, capsys):
    model = ViT(**TINY)
    save_state_dict_file(to_torchvision(model), tmp_path / "tv.pth")
    assert convert(tmp_path / "tv.pth", tmp_path / "m.safetensors", "--from", "torchvision", "--heads", 4) == 0
    assert "wrote" in capsys.readouterr().out
    loaded = load_vit(tmp_path / "m.safetensors")
    assert loaded.config == model.config
    assert_same_state(loaded.state_dict(), model.state_dict())
    assert (
        convert(tmp_path / "m.safetensors", tmp_path / "b.safetensors", "--from", "vit-einops", "--to", "torchvision")
        == 0
    )
    assert "num_heads': 4" in capsys.readouterr().out
    assert_same_state(load_state_dict_file(tmp_path / "b.safetensors"), to_torchvision(model))


def test_timm_non_square_refused_by_torchvision_then_resampled_for_timm(tmp_path, capsys):
    model = ViT(**{**TINY, "image_size": (32, 48), "pool": "mean"})
    src = save_state_dict_file(to_timm(model), tmp_path / "timm.safetensors")
    common = ["--from", "timm", "--heads", 4, "--image-size", "32x48", "--global-pool", "avg"]
    assert convert(src, tmp_path / "tv.pth", *common, "--to", "torchvision") == 2
    assert "torchvision's VisionTransformer cannot express this config" in capsys.readouterr().err
    assert convert(src, tmp_path / "timm64.safetensors", *common, "--to", "timm", "--resample-to", 64) == 0
    expected = resample_pos_embed(model.patch_embed.pos_embed.weight.detach(), (8, 8), (4, 6), mode="timm")
    assert torch.equal(load_state_dict_file(tmp_path / "timm64.safetensors")["pos_embed"], expected)


def test_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert convert(tmp_path / "absent.pth", tmp_path / "m.safetensors", "--from", "timm") == 2
    assert "no such model file or directory" in capsys.readouterr().err
    src = save_vit(ViT(**TINY), tmp_path / "m.safetensors")
    assert convert(src, tmp_path / "n.safetensors", "--from", "vit-einops", "--heads", 4) == 2
    assert "a vit-einops or Hugging Face model states its own" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert(src, tmp_path / "n.safetensors", "--resample-to", "1x2x3")
    assert "expected a size N or HxW" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert("a", "b", "--from", "keras")


def test_size_flags_never_swallow_the_file_names(tmp_path, capsys):
    model = ViT(**TINY)
    save_state_dict_file(to_torchvision(model), tmp_path / "tv.pth")
    # The flag first, the files after it: the habit that used to fail.
    args = ("--image-size", 32, tmp_path / "tv.pth", tmp_path / "m.safetensors", "--from", "torchvision", "--heads", 4)
    assert convert(*args) == 0
    assert load_vit(tmp_path / "m.safetensors").config.image_size == (32, 32)


def test_existing_output_and_self_conversion_are_refused(tmp_path, capsys):
    src = save_vit(ViT(**TINY), tmp_path / "m.safetensors")
    before = src.read_bytes()
    assert convert(src, src) == 2
    assert f"the output {src} is the input {src}; refused even with --force" in capsys.readouterr().err
    (tmp_path / "dst.safetensors").write_bytes(b"mine")
    assert convert(src, tmp_path / "dst.safetensors") == 2
    assert "dst.safetensors already exists; pass --force" in capsys.readouterr().err
    assert (tmp_path / "dst.safetensors").read_bytes() == b"mine" and src.read_bytes() == before
    assert convert(src, tmp_path / "dst.safetensors", "--force") == 0
    assert load_vit(tmp_path / "dst.safetensors").config == load_vit(src).config


def test_hf_round_trip_through_the_cli(tmp_path, capsys):
    model = ViT(**TINY)
    model.class_names = list("abcde")
    src = save_vit(model, tmp_path / "m.safetensors")
    assert convert(src, tmp_path / "hf", "--to", "hf") == 0
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "hf").iterdir()}
    assert convert(tmp_path / "hf", tmp_path / "back.safetensors", "--from", "hf") == 0
    back = load_vit(tmp_path / "back.safetensors")
    assert back.class_names == list("abcde") and back.config.layer_norm_eps == model.config.layer_norm_eps
    assert_same_state(back.state_dict(), model.state_dict())
