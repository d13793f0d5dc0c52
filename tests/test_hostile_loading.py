"""Weights files whose keys and shapes describe more than they hold: each refused by the loaders before anything of
the described size is materialised, built or listed, in one line naming the key, the count or the estimate.

The files are a few KB: a classifier saved as a stride-0 view (its storage one row, its shape 2**24 rows), one stray
block index in the billions, a position table with no rows. Each is built from a tiny model's own state dict in the
torchvision or timm form (the converters write both without either library installed).
"""

from __future__ import annotations

import re
import resource
from contextlib import contextmanager

import pytest
import torch
from _hostile import assert_user_error, bounded, run_cli
from _tiny import TINY_RGB16, tiny_vit

from vit_einops import create_vit
from vit_einops.base.budget import ENV_VAR
from vit_einops.interop import load_timm, load_torchvision, to_timm, to_torchvision
from vit_einops.sources import load_model
from vit_einops.statedict import StateDictMismatchError, check_keys

# Width 192 (DeiT-Ti's, a Table 1 width) so that the loaders infer the heads as they do for a downloaded file.
TINY = dict(TINY_RGB16, dim=192, heads=3, mlp_dim=16)
ROWS = 2**22  # the classifier rows a stride-0 view declares: 3 GiB of float32 as declared, 768 bytes as stored
LIMIT = "64MiB"


@pytest.fixture(autouse=True)
def _low_limit(monkeypatch):
    """Every case runs under a known, low memory limit, so a refusal is exact on any machine."""
    monkeypatch.setenv(ENV_VAR, LIMIT)


@contextmanager
def cheap(seconds: float = 1.0, mib: int = 256):
    """The block finishes within ``seconds`` and grows the process's peak RSS by less than ``mib`` MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with bounded(seconds):
        yield
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < mib * 1024


def _torchvision_state() -> dict[str, torch.Tensor]:
    return to_torchvision(tiny_vit(TINY))


def _timm_state() -> dict[str, torch.Tensor]:
    return to_timm(tiny_vit(TINY))


def _stride0_classifier(state: dict[str, torch.Tensor], weight: str, bias: str) -> dict[str, torch.Tensor]:
    """``state`` with a classifier of ROWS classes stored as one row repeated (torch.save keeps the view)."""
    dim = state[weight].shape[1]
    return {**state, weight: torch.zeros(dim).expand(ROWS, dim), bias: torch.zeros(1).expand(ROWS)}


@pytest.fixture
def stride0_pth(tmp_path):
    path = tmp_path / "huge_head.pth"
    torch.save(_stride0_classifier(_torchvision_state(), "heads.head.weight", "heads.head.bias"), path)
    assert path.stat().st_size < 2_000_000
    return path


def too_small(path):
    """The refusal of a file smaller than the parameters its shapes declare, before any tensor is read."""
    return re.escape(
        f"{path}: its config describes 809,824,608 parameters (depth 2, dim 192, num_classes {ROWS}), at least 386.2 "
        "MiB of weights, but the file holds "
    ) + r"[\d.]+ MiB: the config does not match the weights"


BUDGET = re.escape(
    f"loading this ViT (depth 2, dim 192, num_classes {ROWS}, 809,824,608 parameters, 2 copies while loading) needs "
    "about 6.0 GiB, over the VIT_EINOPS_MAX_MEMORY limit of 64.0 MiB"
)


# --- a stride-0 classifier: the config its shapes give is judged before any tensor is read -----------------------


def test_stride0_classifier_pth_refused_by_its_size(stride0_pth):
    with cheap(), pytest.raises(ValueError, match=too_small(stride0_pth)):
        load_torchvision(stride0_pth)


def test_stride0_classifier_through_load_model_and_create_vit(stride0_pth):
    with cheap(), pytest.raises(ValueError, match=too_small(stride0_pth)):
        load_model(stride0_pth)
    with cheap(), pytest.raises(ValueError, match=too_small(stride0_pth)):
        create_vit("vit_b_16", weights=stride0_pth)


def test_stride0_classifier_timm_refused_by_budget():
    state = _stride0_classifier(_timm_state(), "head.weight", "head.bias")
    with cheap(), pytest.raises(ValueError, match=BUDGET):
        load_timm(state)


@pytest.mark.parametrize("command", ["summary", "convert"])
def test_stride0_classifier_cli_one_line(stride0_pth, tmp_path, command):
    argv = [stride0_pth, tmp_path / "out.safetensors"] if command == "convert" else ["--model", stride0_pth]
    with cheap(5):  # the command imports its tools first
        result = run_cli(command, *argv)
    assert_user_error(result, too_small(stride0_pth))
    assert not (tmp_path / "out.safetensors").exists()


def test_stride0_extra_tensor_counts_its_declared_size():
    """A tensor no config field describes counts at its declared size: casting or checking it would make it."""
    state = {**_torchvision_state(), "extra": torch.zeros(1).expand(2**30)}
    with cheap(), pytest.raises(ValueError, match=re.escape(
        "holding the 33 tensors from torchvision at their declared sizes (numel x element size) needs about 4.0 GiB, "
        "over the VIT_EINOPS_MAX_MEMORY limit of 64.0 MiB"
    )):  # fmt: skip
        load_torchvision(state)


# --- a stray block index: the depth is checked against the indices present, the message stays short ------------


def test_timm_sparse_block_index_refused_briefly():
    state = {**_timm_state(), "blocks.2147483647.norm1.weight": torch.zeros(192)}
    with cheap(), pytest.raises(ValueError) as err:
        load_timm(state)
    message = str(err.value)
    assert message == (
        "timm encoder block indices are not 0..L-1: the keys name 3 blocks, the largest index 2147483647; "
        "2,147,483,645 blocks are missing (2, 3, 4 and 2,147,483,642 more)"
    )


def test_torchvision_sparse_layer_index_refused_briefly(tmp_path):
    path = tmp_path / "sparse.pth"
    torch.save({**_torchvision_state(), "encoder.layers.encoder_layer_9999999.ln_1.weight": torch.zeros(192)}, path)
    with cheap(5):
        result = run_cli("summary", "--model", path)
    assert_user_error(result, r"the keys name 3 blocks, the largest index 9999999; 9,999,997 blocks are missing "
                              r"\(2, 3, 4 and 9,999,994 more\)$")  # fmt: skip
    assert len(result.stderr) < 300


def test_block_index_of_thousands_of_digits_refused_briefly():
    state = {**_timm_state(), f"blocks.{'9' * 5000}.norm1.weight": torch.zeros(192)}
    message = (
        r"the keys name 3 blocks, the largest index has 5000 digits; over 10\*\*4,999 blocks are missing "
        r"\(2, 3, 4 and more\)$"
    )
    with cheap(), pytest.raises(ValueError, match=message) as err:
        load_timm(state)
    assert len(str(err.value)) < 300


def test_mismatch_message_names_a_few_keys_then_counts():
    expected = {f"k{i}": torch.Size([1]) for i in range(1000)}
    with pytest.raises(StateDictMismatchError) as err:
        check_keys({f"x{i}": torch.zeros(1) for i in range(500)}, expected, "planted")
    lines = str(err.value).splitlines()
    assert lines[1] == "  missing keys (1000): k0, k1, k2, k3, k4 and 995 more"
    assert lines[2] == "  unexpected keys (500): x0, x1, x2, x3, x4 and 495 more"
    assert len(err.value.missing) == 1000  # the lists themselves stay whole for callers


# --- a position table without rows for its tokens ----------------------------------------------------------------


def test_timm_pos_embed_without_rows_refused():
    state = {**_timm_state(), "pos_embed": torch.zeros(1, 0, 192)}
    with pytest.raises(ValueError, match=re.escape(
        "timm pos_embed of shape (1, 0, 192) has 0 rows: expected at least 2 (1 prefix token and 1 patch)"
    )):  # fmt: skip
        load_timm(state)


def test_torchvision_pos_embedding_without_rows_refused(tmp_path):
    path = tmp_path / "no_rows.pth"
    torch.save({**_torchvision_state(), "encoder.pos_embedding": torch.zeros(1, 1, 192)}, path)
    result = run_cli("summary", "--model", path)
    assert_user_error(result, re.escape(
        "torchvision encoder.pos_embedding of shape (1, 1, 192) has 1 rows: expected at least 2 "
        "(1 prefix token and 1 patch)"
    ))  # fmt: skip
