"""Helpers shared by the interop tests (test_interop*.py, test_features.py)."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from types import ModuleType

import pytest
import torch
from _tiny import TINY_RGB

TINY = TINY_RGB  # the interop tests' model: RGB, as the libraries' ViTs are


def perturbed(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """``model`` in eval mode with noise on every parameter: the zero-initialised heads and biases of the
    libraries' (and our) init would hide a tensor routed to the wrong place."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=std)
    return model.eval()


def assert_same_state(actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    """The same keys, and bit-identical tensors (dtype and shape included) under each."""
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key].dtype == value.dtype and torch.equal(actual[key], value), key


def report_diffs(diffs: Mapping[str, float]) -> None:
    """Merge measured max differences into $VIT_EINOPS_INTEROP_REPORT (a JSON object; .ci/run-interop prints it),
    keeping the largest value per name, so every interop module adds to one report."""
    path = os.environ.get("VIT_EINOPS_INTEROP_REPORT")
    if not path or not diffs:
        return
    data = json.loads(open(path).read()) if os.path.exists(path) else {}
    for name, value in diffs.items():
        data[name] = max(float(value), data.get(name, 0.0))
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def interop_library(name: str) -> ModuleType:
    """Import a library of the interop environment (torchvision, timm, huggingface_hub): elsewhere the module skips
    with the reason; under VIT_EINOPS_REQUIRE_INTEROP=1 (.ci/run-interop) a missing library is a failure."""
    if os.environ.get("VIT_EINOPS_REQUIRE_INTEROP") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(
        name, reason=f"{name} is not installed: it needs torch 2.14.1; .ci/run-interop runs these tests in its own venv"
    )
