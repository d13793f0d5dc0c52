"""`vit-einops convert`: files between torchvision, timm and vit-einops layouts, through the real CLI entry point."""

from __future__ import annotations

import pytest
import torch
from _interop import TINY, assert_same_state

from vit_einops import ViT
from vit_einops.cli import main
from vit_einops.interop import (
    load_state_dict_file,
    load_vit,
    resample_pos_embed,
    save_state_dict_file,
    save_vit,
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
    common = ["--from", "timm", "--heads", 4, "--image-size", 32, 48, "--global-pool", "avg"]
    assert convert(src, tmp_path / "tv.pth", *common, "--to", "torchvision") == 2
    assert "torchvision's VisionTransformer cannot express this config" in capsys.readouterr().err
    assert convert(src, tmp_path / "timm64.safetensors", *common, "--to", "timm", "--resample-to", 64) == 0
    expected = resample_pos_embed(model.patch_embed.pos_embed.weight.detach(), (8, 8), (4, 6), mode="timm")
    assert torch.equal(load_state_dict_file(tmp_path / "timm64.safetensors")["pos_embed"], expected)


def test_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert convert(tmp_path / "absent.pth", tmp_path / "m.safetensors", "--from", "timm") == 2
    assert "no such weights file" in capsys.readouterr().err
    src = save_vit(ViT(**TINY), tmp_path / "m.safetensors")
    assert convert(src, tmp_path / "n.safetensors", "--from", "vit-einops", "--heads", 4) == 2
    assert "a vit-einops file stores its config" in capsys.readouterr().err
    assert convert(src, tmp_path / "n.safetensors", "--from", "vit-einops", "--resample-to", 1, 2, 3) == 2
    assert "a size is H or H W, got 3 numbers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert("a", "b", "--from", "keras")
