"""Weights files: safetensors and .pth round trips, our self-describing format, and every way a file can be bad."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest
import torch
from _interop import TINY, assert_same_state
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vit_einops import ViT
from vit_einops import StateDictMismatchError, load_vit, read_vit_config, save_vit
from vit_einops.interop import (
    load_state_dict_file,
    load_timm,
    load_torchvision,
    save_state_dict_file,
    to_timm,
    to_torchvision,
)

SUFFIXES = [".safetensors", ".pth", ".bin"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_state_dict_file_round_trip(tmp_path, suffix):
    state = to_timm(ViT(**TINY))
    path = save_state_dict_file(state, tmp_path / f"w{suffix}")
    assert_same_state(load_state_dict_file(path), state)
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left behind


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_checkpoint_file_loads_to_the_same_model(tmp_path, suffix):
    """The README's three lines: a torchvision or timm file in, the same weights out."""
    model = ViT(**TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    save_state_dict_file(to_torchvision(model), tmp_path / f"tv{suffix}")
    save_state_dict_file(to_timm(model), tmp_path / f"timm{suffix}")
    for loaded in (load_torchvision(tmp_path / f"tv{suffix}", heads=4), load_timm(tmp_path / f"timm{suffix}", heads=4)):
        with torch.no_grad():
            assert torch.equal(loaded.eval()(x), model(x))


@pytest.mark.parametrize("wrapper", ["state_dict", "model"])
def test_training_checkpoints_are_unwrapped(tmp_path, wrapper):
    state = to_timm(ViT(**TINY))
    torch.save({wrapper: state, "epoch": 3}, tmp_path / "ckpt.pth")
    assert_same_state(load_state_dict_file(tmp_path / "ckpt.pth"), state)


@pytest.mark.parametrize("patchify", ["conv", "linear"])
def test_vit_file_round_trip(tmp_path, patchify):
    model = ViT(**TINY, patchify=patchify, pool="mean", representation_size=7)
    path = save_vit(model, tmp_path / "m.safetensors")
    assert read_vit_config(path) == model.config
    loaded = load_vit(path)
    assert loaded.config == model.config
    assert_same_state(loaded.state_dict(), model.state_dict())


def test_vit_file_overrides_free_fields(tmp_path):
    model = ViT(**TINY).eval()
    path = save_vit(model, tmp_path / "m.safetensors")
    loaded = load_vit(path, patchify="linear", attn_impl="sdpa").eval()
    assert (loaded.config.patchify, loaded.attn_impl) == ("linear", "sdpa")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)  # float32, other kernels
    with pytest.raises(ValueError, match=r"\['depth'\] are read from the state dict"):
        load_vit(path, depth=3)


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = save_state_dict_file({"a": torch.ones(2)}, tmp_path / "w.safetensors")
    with pytest.raises(FileExistsError, match="w.safetensors already exists; pass overwrite=True"):
        save_state_dict_file({"a": torch.zeros(2)}, path)  # never replaced unasked
    with pytest.raises(TypeError):
        save_state_dict_file({"a": "not a tensor"}, path, overwrite=True)

    def crash(*args):
        raise KeyboardInterrupt  # a crash between writing the new file and moving it into place

    monkeypatch.setattr(os, "replace", crash)
    for suffix in (".safetensors", ".pth"):
        with pytest.raises(KeyboardInterrupt):
            save_state_dict_file({"a": torch.zeros(3)}, path.with_suffix(suffix), overwrite=True)
    monkeypatch.undo()
    assert torch.equal(load_state_dict_file(path)["a"], torch.ones(2))
    assert os.listdir(tmp_path) == ["w.safetensors"]


# ---- bad files ----


class RunsCode:
    """Unpickling this calls os.mkdir: what a malicious checkpoint does with something worse."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"cls_token": torch.zeros(1, 1, 4), "payload": RunsCode(str(marker))}, tmp_path / "evil.pth")
    with pytest.raises(pickle.UnpicklingError):  # the trap is real: a plain load would run it
        torch.load(tmp_path / "evil.pth", weights_only=True)
    with pytest.raises(ValueError, match=r"holds a pickled object \(posix\.mkdir\), not weights.*could run code"):
        load_state_dict_file(tmp_path / "evil.pth")
    with pytest.raises(ValueError, match="holds a pickled object"):
        load_timm(tmp_path / "evil.pth")
    assert not marker.exists()


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_truncated_file_is_a_clear_error(tmp_path, suffix):
    path = save_state_dict_file(to_timm(ViT(**TINY)), tmp_path / f"w{suffix}")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{path.name}: not a readable .* file \(truncated or corrupt\?\)"):
        load_state_dict_file(path)


def test_garbage_safetensors_header_is_a_clear_error(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_state_dict_file(path)


def test_pth_without_a_state_dict_is_a_clear_error(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="list.pth: does not hold a state dict"):
        load_state_dict_file(tmp_path / "list.pth")
    torch.save({"w": torch.zeros(2), "step": 3}, tmp_path / "mixed.pth")
    with pytest.raises(ValueError, match="key 'step' holds int"):
        load_state_dict_file(tmp_path / "mixed.pth")


def test_unknown_suffix_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"unknown weights file type '\.npz'; expected one of \.safetensors, \.pth"):
        load_state_dict_file(tmp_path / "w.npz")
    with pytest.raises(FileNotFoundError, match="no such weights file"):
        load_state_dict_file(tmp_path / "absent.pth")
    with pytest.raises(ValueError, match="use the suffix .safetensors"):
        save_vit(ViT(**TINY), tmp_path / "m.pth")


def test_foreign_safetensors_is_not_a_vit_file(tmp_path):
    path = save_state_dict_file(to_timm(ViT(**TINY)), tmp_path / "timm.safetensors")
    with pytest.raises(ValueError, match="without a vit-einops config.*source='torchvision'"):
        load_vit(path)


def test_vit_file_whose_weights_disagree_with_its_config(tmp_path):
    path = save_vit(ViT(**TINY), tmp_path / "m.safetensors")
    bad = save_vit(ViT(**{**TINY, "num_classes": 7}), tmp_path / "bad.safetensors")
    # Graft the 5-class config onto the 7-class weights: the mismatch is caught, not silently loaded.
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    save_file(load_file(bad), bad, metadata=metadata)
    with pytest.raises(StateDictMismatchError, match=r"mis-shaped head.fc.weight: got \(7, 48\), expected \(5, 48\)"):
        load_vit(bad)


def test_zip_without_torch_payload_is_a_clear_error(tmp_path):
    with zipfile.ZipFile(tmp_path / "w.pth", "w") as z:
        z.writestr("hello.txt", "not a checkpoint")
    with pytest.raises(ValueError, match="w.pth: not a readable torch file"):
        load_state_dict_file(tmp_path / "w.pth")


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (b"<!DOCTYPE html><html>404 Not Found</html>", r"it starts with b'<!DOCTYPE html><'"),  # a saved error page
        (b"hello", r"it starts with b'hello'"),  # torch.load raised a bare KeyError: 101
        (b"", r"it is empty \(0 bytes\)"),  # torch.load raised an EOFError with no message
    ],
)
def test_a_file_that_is_no_torch_file_says_so_not_that_its_pickle_could_run_code(tmp_path, data, shown):
    from vit_einops.sources import load_model

    path = tmp_path / "vit_b_16.pth"
    path.write_bytes(data)
    expected = rf"vit_b_16.pth: not a torch file: {shown}; torch.save writes a zip archive .*A failed download"
    with pytest.raises(ValueError, match=expected):
        load_state_dict_file(path)
    with pytest.raises(ValueError, match=expected):
        load_model(path)  # detecting the form reads the keys, through the same check
