"""Model files (vit_einops.modelfile): one safetensors file with weights, config, preprocessing, class names and
source; load_model's front door; and every way a file can be wrong, each with its exact error."""

from __future__ import annotations

import json
import os
import re
import threading

import pytest
import torch
from _interop import TINY, perturbed
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vit_einops import ViT
from vit_einops.interop import save_state_dict_file, to_timm, to_torchvision
from vit_einops import load_model
from vit_einops.modelfile import load_vit, save_vit
from vit_einops.preprocess import Preprocessing


def _model() -> ViT:
    model = perturbed(ViT(**TINY))
    model.preprocessing = Preprocessing.timm(crop=32, crop_pct=0.875)
    model.class_names = ["a", "b", "c", "d", "e"]
    model.source = {"library": "test", "file": "x"}
    return model


def test_round_trip_keeps_everything_bit_identical(tmp_path):
    model = _model()
    path = save_vit(model, tmp_path / "m.safetensors")
    loaded = load_vit(path)
    assert loaded.config == model.config
    assert loaded.preprocessing == model.preprocessing
    assert loaded.class_names == model.class_names and loaded.source == model.source
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded.eval()(x), model.eval()(x))
    # Saving the loaded model again gives the same metadata and tensors (safetensors orders metadata keys at random,
    # so the bytes themselves may differ).
    again = save_vit(loaded, tmp_path / "again.safetensors")
    with safe_open(again, framework="pt") as f, safe_open(path, framework="pt") as g:
        assert f.metadata() == g.metadata()
    assert all(torch.equal(a, load_file(path)[k]) for k, a in load_file(again).items())


def test_metadata_is_plain_json(tmp_path):
    path = save_vit(_model(), tmp_path / "m.safetensors")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "vit-einops" and meta["format_version"] == "2"
    assert json.loads(meta["class_names"]) == ["a", "b", "c", "d", "e"]
    assert json.loads(meta["preprocessing"])["resize"] == 36  # floor(32 / 0.875)


def test_version_1_files_still_load(tmp_path):
    model = perturbed(ViT(**TINY))
    path = tmp_path / "v1.safetensors"
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        path,
        metadata={"format": "vit-einops", "vit_einops_config": json.dumps(model.config.to_dict())},
    )
    loaded = load_vit(path)
    assert loaded.preprocessing is None and loaded.class_names is None
    with pytest.raises(ValueError, match="records no preprocessing; set one"):
        loaded.transforms()


def _old_file(path, model, config: dict) -> None:
    """A model file as vit-einops wrote it while attn_impl was a config field: its metadata built by hand."""
    meta = {"format": "vit-einops", "format_version": "2", "vit_einops_config": json.dumps(config)}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path, metadata=meta)


def test_new_files_record_no_attn_impl(tmp_path):
    path = save_vit(perturbed(ViT(**TINY)).set_attn_impl("sdpa"), tmp_path / "m.safetensors")
    with safe_open(path, framework="pt") as f:
        assert "attn_impl" not in json.loads(f.metadata()["vit_einops_config"])
    assert load_vit(path).attn_impl == "einsum"


def test_existing_output_is_refused_unless_asked(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"user data")
    with pytest.raises(FileExistsError, match="m.safetensors already exists; pass overwrite=True"):
        save_vit(_model(), path)
    assert path.read_bytes() == b"user data"
    save_vit(_model(), path, overwrite=True)
    assert load_vit(path).class_names == ["a", "b", "c", "d", "e"]


def test_class_names_must_fit_the_classifier(tmp_path):
    model = _model()
    model.class_names = ["a", "b"]
    with pytest.raises(ValueError, match="class_names has 2 names for num_classes 5"):
        save_vit(model, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


def _rewrite(path, tensors=None, **meta_changes):
    with safe_open(path, framework="pt") as f:
        meta = dict(f.metadata())
    meta.update(meta_changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    save_file(tensors if tensors is not None else load_file(path), path, metadata=meta)


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"vit_einops_config": "{not json"}, ValueError, "'vit_einops_config' is not valid JSON"),
        ({"vit_einops_config": "[1, 2]"}, ValueError, "the stored config is not a JSON object"),
        ({"vit_einops_config": json.dumps({"dim": "big"})}, ValueError, "the stored vit-einops config is invalid"),
        ({"preprocessing": json.dumps({"resize": -3})}, ValueError, "the stored preprocessing is invalid"),
        (
            {"preprocessing": json.dumps({"resize": 32, "mean": [float("nan")] * 3})},
            ValueError,
            "preprocessing is invalid",
        ),
        ({"class_names": json.dumps([1, 2, 3, 4, 5])}, ValueError, "class_names must all be str"),
        ({"class_names": json.dumps(["a"])}, ValueError, "class_names has 1 names for num_classes 5"),
        ({"source": json.dumps("x")}, ValueError, "the stored source is not a JSON object"),
        ({"format_version": "99"}, ValueError, "format version '99'"),
        ({"format": None}, ValueError, "without a vit-einops config"),
    ],
)
def test_bad_metadata_is_one_clear_error_naming_the_file(tmp_path, change, error, words):
    path = save_vit(_model(), tmp_path / "m.safetensors")
    _rewrite(path, **change)
    with pytest.raises(error, match=words) as info:
        load_vit(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda sd: {**sd, "head.fc.bias": sd["head.fc.bias"].to(torch.int64)}, "must be floating point"),
        (lambda sd: {**sd, "head.fc.bias": sd["head.fc.bias"] > 0}, "must be floating point"),
        (lambda sd: {**sd, "head.fc.bias": torch.full_like(sd["head.fc.bias"], float("nan"))}, "non-finite values"),
    ],
)
def test_bad_tensors_are_refused(tmp_path, mutate, words):
    path = save_vit(_model(), tmp_path / "m.safetensors")
    _rewrite(path, tensors=mutate(load_file(path)))
    with pytest.raises(ValueError, match=words):
        load_vit(path)


def test_half_and_mixed_dtype_files_load_as_float32_and_run(tmp_path):
    model = _model()
    path = save_vit(model, tmp_path / "m.safetensors")
    sd = load_file(path)
    mixed = {k: (v.half() if i % 2 else v) for i, (k, v) in enumerate(sd.items())}
    _rewrite(path, tensors=mixed)
    loaded = load_vit(path)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert loaded(torch.randn(1, 3, 32, 32)).shape == (1, 5)  # no dtype crash at the first forward
    with pytest.raises(ValueError, match="tensors of several dtypes"):
        load_vit(path, dtype=None)
    all_half = {k: v.half() for k, v in sd.items()}
    _rewrite(path, tensors=all_half)
    assert {p.dtype for p in load_vit(path, dtype=None).parameters()} == {torch.float16}


def test_truncated_and_garbage_files(tmp_path):
    path = save_vit(_model(), tmp_path / "m.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="m.safetensors: not a readable safetensors file"):
        load_vit(path)
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_vit(path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "m.safetensors"
    os.mkfifo(fifo)
    result = {}

    def attempt():
        try:
            load_model(fifo)
        except Exception as err:  # noqa: BLE001 - the exact type is asserted below
            result["err"] = err

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert isinstance(result["err"], ValueError) and "a FIFO; expected a model file" in str(result["err"])


def test_load_model_front_door(tmp_path):
    model = _model()
    save_vit(model, tmp_path / "m.safetensors")
    assert load_model(tmp_path / "m.safetensors").class_names == model.class_names
    run = tmp_path / "run"
    run.mkdir()
    save_vit(model, run / "model.safetensors")
    assert load_model(run).config == model.config  # a training run directory
    tv = save_state_dict_file(to_torchvision(model), tmp_path / "tv.pth")
    loaded = load_model(tv, source="torchvision", heads=4)
    assert loaded.preprocessing == Preprocessing(
        resize=36, crop=(32, 32), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
    )
    assert loaded.source == {"library": "torchvision", "file": str(tv)}
    timm_file = save_state_dict_file(to_timm(model), tmp_path / "timm.safetensors")
    assert load_model(timm_file, source="timm", heads=4).preprocessing == Preprocessing.timm(crop=32)
    assert load_model(timm_file, heads=4).source == {"library": "timm", "file": str(timm_file)}  # form recognised
    with pytest.raises(ValueError, match="source .keras.; expected one of .vit-einops., .torchvision., .timm., .hf."):
        load_model(timm_file, source="keras")
    with pytest.raises(FileNotFoundError, match="no such model file or directory"):
        load_model(tmp_path / "absent.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without model.safetensors or a training checkpoint"):
        load_model(tmp_path / "empty")


def test_summary_of_a_model_file_shows_what_it_records(tmp_path, capsys):
    from vit_einops.commands.cli import main

    save_vit(_model(), tmp_path / "m.safetensors")
    assert main(["summary", "--model", str(tmp_path / "m.safetensors")]) == 0
    out = capsys.readouterr().out
    total = sum(p.numel() for p in _model().parameters())
    assert f"m.safetensors: {total:,} parameters" in out
    assert '"crop": [32, 32]' in out and "class names   a, b, c, d, e" in out and '"library": "test"' in out
    assert main(["summary", "vit_ti_16", "--model", str(tmp_path / "m.safetensors")]) == 2
    assert "give a PRESET or --model MODEL" in capsys.readouterr().err


def test_hf_directory_files_are_checked(tmp_path):
    from vit_einops.interop import load_hf, save_hf

    save_hf(perturbed(ViT(**TINY)), tmp_path / "hf")
    cfg = tmp_path / "hf" / "config.json"
    cfg.write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json: expected a JSON object"):
        load_hf(tmp_path / "hf")
    cfg.write_text("{oops")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        load_hf(tmp_path / "hf")
    cfg.unlink()
    os.mkfifo(cfg)
    with pytest.raises(ValueError, match="config.json: a FIFO"):
        load_hf(tmp_path / "hf")
    cfg.unlink()
    cfg.write_text(json.dumps({"model_type": "bert"}))
    # the path in full (it said "config.json model_type ...", with no directory)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(cfg))} model_type 'bert' is not a ViT"):
        load_hf(tmp_path / "hf")
    cfg.write_text(json.dumps({"architectures": ["Dinov2ForImageClassification"]}))
    with pytest.raises(ValueError, match="architecture 'Dinov2ForImageClassification' is not supported; expected one"):
        load_hf(tmp_path / "hf")
