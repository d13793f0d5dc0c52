"""Random JSON where the package reads JSON from files: a model file's metadata, a Hugging Face directory's
config.json and preprocessor_config.json, a training run's checkpoint.json.

Each document is a valid one with one field replaced by a random JSON value (nested, of the wrong type, huge or
non-finite numbers, unicode), a random document, or raw text (deep nesting, NaN/Infinity literals, numbers past
float range, huge integers). Every input either loads or raises ValueError/TypeError/FileNotFoundError (the
user-error types the command line prints as one line) with a message; within a time bound, and under a small
memory limit, so that no document can make the loader build a large model.
"""

from __future__ import annotations

import json

import pytest
import torch
from _hostile import bounded
from _tiny import TINY_DIGITS, TINY_RGB, tiny_vit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from vit_einops import ViT, max_memory, save_vit
from vit_einops.base.budget import ENV_VAR
from vit_einops.interop import load_hf, save_hf
from vit_einops.modelfile import load_vit
from vit_einops.sources import load_model

USER_ERRORS = (ValueError, TypeError, FileNotFoundError)
BOUND_S = 5  # a load of these tiny files takes milliseconds; a model built from a hostile config would take minutes
LIMIT = "64MiB"  # the tiny models need well under 1 MiB; no document may make a loader allocate more
# Module-scoped files are reused across examples: each example writes its own copy of the JSON under test.
FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, -1, 2**31, 2**63, 10**18, 10**6])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
RAW = st.sampled_from(
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 5000 + "1" + "}" * 5000,
        "NaN",
        "Infinity",
        '{"depth": NaN}',
        '{"depth": Infinity, "dim": -Infinity}',
        '{"depth": 1e999}',
        '{"depth": ' + "9" * 5000 + "}",
        '{"depth": 1' + "0" * 300 + "}",
        "",
        "{",
        '"\\ud800"',
        "\ufeff{}",
        '{"a": "\u202e\u0000\u00e9"}',
    ]
)


@pytest.fixture(autouse=True)
def _no_env_limit(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def replaced(document: dict, key: str, value):
    """``document`` with the field ``key`` (one of its keys, or a new one) set to ``value``."""
    return {**document, key: value}


def documents(valid: dict) -> st.SearchStrategy[str]:
    """JSON text: ``valid`` with one field replaced, or with one added, a random value, or raw text."""
    keys = st.sampled_from(sorted(valid)) | st.text(max_size=8)
    mutated = st.builds(replaced, st.just(valid), keys, VALUES).map(json.dumps)
    return mutated | VALUES.map(json.dumps) | RAW


def load_within_bound(load, *args):
    """``load(*args)`` under the small limit: its value, or the user error it raised; either within BOUND_S."""
    try:
        with bounded(BOUND_S), max_memory(LIMIT):
            result = load(*args)
    except USER_ERRORS as err:
        assert str(err).strip(), f"{type(err).__name__} without a message"
        result = err
    return result


# --- a model file's metadata -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    model = tiny_vit(TINY_DIGITS)
    model.class_names = [f"digit {i}" for i in range(10)]
    model.source = {"library": "vit-einops", "file": "digits"}
    from vit_einops import Preprocessing

    model.preprocessing = Preprocessing.plain(8, channels=1)
    path = save_vit(model, tmp_path_factory.mktemp("fuzz") / "m.safetensors")
    with safe_open(path, framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


METADATA_KEYS = ["vit_einops_config", "preprocessing", "class_names", "source"]


@FUZZ
@given(data=st.data())
def test_model_file_metadata(tmp_path, model_file, data):
    metadata, tensors = model_file
    key = data.draw(st.sampled_from(METADATA_KEYS))
    text = data.draw(documents(json.loads(metadata[key])) if metadata[key].startswith("{") else
                     st.lists(VALUES).map(json.dumps) | VALUES.map(json.dumps) | RAW)  # fmt: skip
    path = tmp_path / "fuzzed.safetensors"
    save_file(tensors, path, metadata={**metadata, key: text})
    result = load_within_bound(load_vit, path)
    if isinstance(result, ViT):
        assert result.config.depth == TINY_DIGITS["depth"]  # only a document that describes these weights loads


# --- a Hugging Face directory: config.json and preprocessor_config.json ------------------------------------------


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    from vit_einops import Preprocessing

    model = tiny_vit(TINY_RGB)
    model.preprocessing = Preprocessing.hf(TINY_RGB["image_size"])
    return save_hf(model, tmp_path_factory.mktemp("fuzz") / "hf")


# id2label and label2id are left valid here: their values' types are checked by interop/hf.py's label reading
# (tests/test_hostile_strings.py); every other field is fuzzed.
LABEL_FIELDS = {"id2label", "label2id"}


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("name", ["config.json", "preprocessor_config.json"])
def test_hf_json(tmp_path, hf_directory, name, data):
    valid = json.loads((hf_directory / name).read_text())
    keys = st.sampled_from(sorted(set(valid) - LABEL_FIELDS)) | st.text(max_size=8).filter(
        lambda k: k not in LABEL_FIELDS
    )
    mutated = st.builds(replaced, st.just(valid), keys, VALUES).map(json.dumps)
    text = data.draw(mutated | RAW | (VALUES.filter(lambda v: not isinstance(v, dict)).map(json.dumps)))
    directory = tmp_path / "hf"
    directory.mkdir(exist_ok=True)
    for file in hf_directory.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    (directory / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    result = load_within_bound(load_hf, directory)
    if isinstance(result, ViT):
        assert sum(p.numel() for p in result.parameters()) < 10**6


# --- a training run's checkpoint.json ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vit_einops.train.checkpoint import save_checkpoint

    model = tiny_vit(TINY_DIGITS)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 1, 8, 8)).sum().backward()
    optimizer.step()
    directory = tmp_path_factory.mktemp("fuzz") / "checkpoint"
    save_checkpoint(directory, model, optimizer=optimizer, train_state={"epoch": 1})
    return directory


@FUZZ
@given(data=st.data())
def test_checkpoint_json(tmp_path, checkpoint, data):
    valid = json.loads((checkpoint / "checkpoint.json").read_text())
    field = data.draw(st.sampled_from(["", "config", "files", "optimizer", "train_state"]))
    if field in ("config", "train_state"):  # one level down: a config field, a train_state entry
        inner = st.builds(replaced, st.just(valid[field]), st.sampled_from(sorted(valid[field]) or ["x"]), VALUES)
        text = data.draw(st.builds(replaced, st.just(valid), st.just(field), inner).map(json.dumps))
    else:
        text = data.draw(documents(valid) if not field else st.builds(
            replaced, st.just(valid), st.just(field), VALUES).map(json.dumps))  # fmt: skip
    directory = tmp_path / "checkpoint"
    directory.mkdir(exist_ok=True)
    for file in checkpoint.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    (directory / "checkpoint.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    result = load_within_bound(load_model, directory)
    if isinstance(result, ViT):
        assert result.config.depth == TINY_DIGITS["depth"]
