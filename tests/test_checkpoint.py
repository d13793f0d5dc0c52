"""Checkpoints: exact round trips, no pickle, crash safety, and clear errors for corrupt or mismatched files."""

import hashlib
import json
import pickle

import pytest
import torch
from hypothesis import given
from _tiny import TINY_DIGITS
from hypothesis import strategies as st

from vit_einops import ViT, load_model
from vit_einops.train import checkpoint as ckpt_module
from vit_einops.train.checkpoint import (
    CheckpointError,
    decode_tree,
    encode_tree,
    load_checkpoint,
    load_checkpoint_model,
    save_checkpoint,
)
from vit_einops.train.loop import WarmupCosine, parameter_groups

TINY = TINY_DIGITS


def trained_state():
    """A tiny model, AdamW and scheduler after two steps, so every optimizer tensor is non-trivial."""
    model = ViT(**TINY)
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.05), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(2, 10))
    for _ in range(2):
        loss = model(torch.rand(4, 1, 8, 8)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


@pytest.fixture
def saved(tmp_path):
    model, optimizer, scheduler = trained_state()
    meta = save_checkpoint(tmp_path / "ckpt", model, optimizer=optimizer, scheduler=scheduler, train_state={"epoch": 3})
    return meta, model, optimizer, scheduler


def test_round_trip_is_exact(saved):
    meta, model, optimizer, scheduler = saved
    ckpt = load_checkpoint(meta.parent)
    assert ckpt.config == model.config and ckpt.train_state == {"epoch": 3}
    for k, v in model.state_dict().items():
        assert torch.equal(ckpt.state_dict[k], v), k
    restored = ckpt.build_model()
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(restored(x), model.eval()(x))
    # Optimizer and scheduler states come back as the same trees, tensors bit-equal, tuples as tuples.
    expected, got = optimizer.state_dict(), ckpt.optimizer_state
    assert got["param_groups"] == expected["param_groups"]
    assert isinstance(got["param_groups"][0]["betas"], tuple)
    for i, state in expected["state"].items():
        for name, value in state.items():
            assert torch.equal(got["state"][i][name], value), (i, name)
    assert ckpt.scheduler_state == scheduler.state_dict()


def test_loading_never_unpickles(saved, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading a checkpoint")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    load_checkpoint_model(saved[0])


def test_load_model_of_a_checkpoint_takes_the_free_fields_and_the_impl(saved):
    """load_model(checkpoint, ...) as load_vit(file, ...): the patch projection moves to its Linear form, dropout and
    the attention path change, and the model computes what the saved one does."""
    meta, model, _, _ = saved
    loaded = load_model(meta.parent, patchify="linear", dropout=0.2, attn_impl="sdpa")
    assert loaded.config.patchify == "linear" and loaded.config.dropout == 0.2 and loaded.attn_impl == "sdpa"
    assert not loaded.training
    x = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(loaded(x), model.eval()(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\['dim'\] are read from the state dict"):
        load_model(meta.parent, dim=8)


tensors_or_scalars = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=3)
    | st.integers(0, 3).map(lambda n: torch.arange(n, dtype=torch.float32)),
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=3), children, max_size=3)
        | st.dictionaries(st.integers(0, 9), children, min_size=1, max_size=3)
    ),
    max_leaves=8,
)


def assert_same_tree(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tree(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tree(x, y)
    else:
        assert a == b


@given(tensors_or_scalars)
def test_tree_codec_round_trips_through_json(tree):
    tensors = {}
    encoded = json.loads(json.dumps(encode_tree(tree, tensors, "t")))
    assert_same_tree(decode_tree(encoded, tensors), tree)


def test_codec_rejects_what_json_cannot_hold():
    with pytest.raises(TypeError, match="set"):
        encode_tree({"a": {1, 2}}, {})
    with pytest.raises(TypeError, match="all str or all int"):
        encode_tree({1: 0, "a": 0}, {})
    with pytest.raises(TypeError, match="reserved"):
        encode_tree({"__tuple__": [1]}, {})


def test_saving_again_replaces_files_and_leaves_no_temporaries(saved):
    meta, model, optimizer, scheduler = saved
    with torch.no_grad():
        model.head.fc.bias.add_(1.0)
    save_checkpoint(meta.parent, model, optimizer=optimizer, scheduler=scheduler)
    names = sorted(p.name for p in meta.parent.iterdir())
    assert len(names) == 3 and names[0] == "checkpoint.json", names  # the old model file is gone, no .tmp left
    assert torch.equal(load_checkpoint(meta).state_dict["head.fc.bias"], model.head.fc.bias)


def test_a_crash_before_the_commit_point_keeps_the_old_checkpoint(saved, monkeypatch):
    meta, model, optimizer, scheduler = saved
    before = load_checkpoint(meta).state_dict
    with torch.no_grad():
        model.head.fc.bias.add_(1.0)
    real_write = ckpt_module.atomic_write_bytes

    def crash_on_json(path, data):
        if path.name == "checkpoint.json":
            raise KeyboardInterrupt("power cut")
        real_write(path, data)

    monkeypatch.setattr(ckpt_module, "atomic_write_bytes", crash_on_json)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(meta.parent, model, optimizer=optimizer, scheduler=scheduler)
    monkeypatch.undo()
    after = load_checkpoint(meta).state_dict  # the old json still names the old, intact files
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_atomic_write_cleans_up_when_the_write_fails(tmp_path):
    with pytest.raises(TypeError):
        ckpt_module.atomic_write_bytes(tmp_path / "f.bin", object())
    assert list(tmp_path.iterdir()) == []


def model_file(meta):
    return meta.parent / json.loads(meta.read_text())["files"]["model"]["name"]


def test_corrupt_weights_are_named(saved):
    meta = saved[0]
    path = model_file(meta)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{path.name} is corrupt or truncated"):
        load_checkpoint(meta)


def test_truncated_weights_are_named(saved):
    path = model_file(saved[0])
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"{path.name} is corrupt or truncated"):
        load_checkpoint(saved[0].parent)


def test_a_file_with_a_matching_hash_but_invalid_content_is_reported(saved):
    meta = saved[0]
    path = model_file(meta)
    junk = b"not safetensors" * 1000  # larger than the weights the config describes
    path.write_bytes(junk)
    record = json.loads(meta.read_text())
    record["files"]["model"]["sha256"] = hashlib.sha256(junk).hexdigest()
    meta.write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(meta)


def test_truncated_json_is_named(saved):
    meta = saved[0]
    meta.write_text(meta.read_text()[:200])
    with pytest.raises(CheckpointError, match="checkpoint.json is corrupt or truncated"):
        load_checkpoint(meta)


def test_config_that_does_not_match_the_weights_is_reported(saved):
    meta = saved[0]
    record = json.loads(meta.read_text())
    record["config"]["dim"] = 32
    record["config"]["depth"] = 3
    meta.write_text(json.dumps(record))
    layout = r"(?s)does not match the expected layout:\n  missing keys.*blocks\.2\..*mis-shaped"
    with pytest.raises(CheckpointError, match=layout):
        load_checkpoint(meta)


def test_missing_files_and_foreign_json(saved, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nowhere")
    meta = saved[0]
    model_file(meta).unlink()
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(meta)
    other = tmp_path / "other.json"
    other.write_text('{"format": "something else"}')
    with pytest.raises(CheckpointError, match="not a vit-einops checkpoint"):
        load_checkpoint(other)
    other.write_text(json.dumps({"format": ckpt_module.FORMAT, "version": 99}))
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(other)


def test_weights_only_checkpoint_cannot_resume(tmp_path):
    from vit_einops.train.checkpoint import restore_training

    model, optimizer, scheduler = trained_state()
    save_checkpoint(tmp_path, model)
    with pytest.raises(CheckpointError, match="weights only"):
        restore_training(load_checkpoint(tmp_path), model, optimizer, scheduler, step=2)


def test_save_rejects_a_model_without_config(tmp_path):
    with pytest.raises(TypeError, match="ViT"):
        save_checkpoint(tmp_path, torch.nn.Linear(2, 2))
