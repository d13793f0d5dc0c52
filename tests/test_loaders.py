"""One ending for every loader: a model file, a training checkpoint, torchvision, timm and Hugging Face weights are
refused alike, with the same message, for a file smaller than its config, a load past the memory budget and a
weight that is not finite as the model would hold it.

Each source's files are written from one tiny model by our own writers (the libraries are not needed); the refusal
is asked of :func:`vit_einops.load_model`, the door every command goes through.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from safetensors import safe_open
from safetensors.torch import save_file

from vit_einops import save_vit
from vit_einops.base.budget import ENV_VAR, format_bytes
from vit_einops.interop import save_hf, save_state_dict_file, to_timm, to_torchvision
from vit_einops.interop.hf_families import hf_names
from vit_einops.network.sizes import BLOCK_OVERHEAD_BYTES
from vit_einops.sources import load_model
from vit_einops.train.checkpoint import save_checkpoint

# Width 192 (a Table 1 width): torchvision and timm files give their heads by it, as a downloaded file does.
TINY = dict(TINY_RGB16, dim=192, heads=3, mlp_dim=16)
ROWS = 2**22  # the classes a file claims: 3 GiB of float32 classifier
# Each form's name of the classifier's bias, where the non-finite value is put.
BIAS = {
    "vit-einops": "head.fc.bias",
    "checkpoint": "head.fc.bias",
    "torchvision": "heads.head.bias",
    "timm": "head.bias",
    "hf": "classifier.bias",
}
SOURCES = list(BIAS)


def write(source: str, model: torch.nn.Module, directory: Path) -> tuple[Path, Path]:
    """``model`` written in ``source``'s form: (what load_model is given, the weights file inside it)."""
    if source == "vit-einops":
        path = save_vit(model, directory / "m.safetensors")
        return path, path
    if source == "checkpoint":
        meta = save_checkpoint(directory / "checkpoint", model)
        return meta.parent, meta.parent / json.loads(meta.read_text())["files"]["model"]["name"]
    if source == "hf":
        save_hf(model, directory / "hf")
        return directory / "hf", directory / "hf" / "model.safetensors"
    path = directory / f"{source}.pth"
    save_state_dict_file(to_torchvision(model) if source == "torchvision" else to_timm(model), path)
    return path, path


def claim_rows(source: str, given: Path, weights: Path) -> None:
    """The files at ``given`` claim ROWS classes while holding the tiny model's weights: in the config (model file,
    checkpoint.json, config.json), or, where the tensors are the config (torchvision, timm), as a stride-0 view of
    one row, which torch.save keeps as it is."""
    if source == "vit-einops":
        with safe_open(weights, framework="pt") as f:
            metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        config = {**json.loads(metadata["vit_einops_config"]), "num_classes": ROWS}
        save_file(tensors, weights, metadata={**metadata, "vit_einops_config": json.dumps(config)})
    elif source in ("checkpoint", "hf"):
        path = given / ("checkpoint.json" if source == "checkpoint" else "config.json")
        data = json.loads(path.read_text())
        if source == "checkpoint":
            data["config"]["num_classes"] = ROWS
        else:
            data = {k: v for k, v in data.items() if k not in ("id2label", "label2id")} | {"num_labels": ROWS}
        path.write_text(json.dumps(data))
    else:
        state = torch.load(weights, weights_only=True)
        weight = "heads.head.weight" if source == "torchvision" else "head.weight"
        state[weight] = state[weight][:1].expand(ROWS, -1)
        state[BIAS[source]] = state[BIAS[source]][:1].expand(ROWS)
        torch.save(state, weights)


def refusal(source: str, message: str):
    """pytest.raises for ``message`` exactly; Hugging Face's loader adds the config.json names of the fields our
    message names."""
    return pytest.raises(ValueError, match=f"^{re.escape(message + hf_names(message) * (source == 'hf'))}$")


@pytest.mark.parametrize("source", SOURCES)
def test_a_file_smaller_than_its_config_is_refused(tmp_path, source):
    given, weights = write(source, tiny_vit(TINY), tmp_path)
    claim_rows(source, given, weights)
    message = (
        f"{weights}: its config describes 809,824,608 parameters (depth 2, dim 192, num_classes {ROWS}), at least "
        f"386.2 MiB of weights, but the file holds {format_bytes(weights.stat().st_size)}: the config does not match "
        "the weights"
    )
    with refusal(source, message):
        load_model(given)


@pytest.mark.parametrize("source", SOURCES)
def test_a_load_past_the_memory_budget_is_refused(tmp_path, monkeypatch, source):
    model = tiny_vit(TINY)
    given, _ = write(source, model, tmp_path)
    monkeypatch.setenv(ENV_VAR, "1MiB")
    count = sum(p.numel() for p in model.parameters())
    needs = 2 * 4 * count + TINY["depth"] * BLOCK_OVERHEAD_BYTES  # two float32 copies, and the blocks' modules
    allow = f"{math.ceil(needs * 1.1 / 2**20)}MiB"
    message = (
        f"loading this ViT (depth 2, dim 192, {count:,} parameters, 2 copies while loading) needs about "
        f"{needs / 2**20:.1f} MiB, over the {ENV_VAR} limit of 1.0 MiB; pass --max-memory {allow} to allow it (in "
        f"Python: {ENV_VAR}={allow}, or with vit_einops.max_memory('{allow}'))"
    )
    with refusal(source, message):
        load_model(given)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    "value, dtype",
    [(float("nan"), torch.float32), (float("-inf"), torch.float32), (1e5, torch.float16)],
    ids=["nan", "inf", "finite in float32, inf in float16"],
)
def test_a_weight_not_finite_as_the_model_holds_it_is_refused(tmp_path, source, value, dtype):
    model = tiny_vit(TINY)
    with torch.no_grad():
        model.head.fc.bias[1] = value
    given, weights = write(source, model, tmp_path)
    with refusal(source, f"{weights}: non-finite values (nan or inf) in 1 tensor, e.g. {BIAS[source]!r}"):
        load_model(given, dtype=dtype)


@pytest.mark.parametrize("source", SOURCES)
def test_each_source_loads_the_model_it_was_written_from(tmp_path, source):
    """The refusals above are of these very files, which load whole when nothing is wrong with them."""
    model = tiny_vit(TINY)
    given, _ = write(source, model, tmp_path)
    loaded = load_model(given)
    x = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-6)
