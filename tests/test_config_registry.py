"""The field registry (vit_einops.network.config.FIELDS): every view of the config's fields is derived from it, and the
exporters allow-list it, so a field added to ViTConfig is either expressed by a format or refused by it, by name."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from vit_einops import ViT, ViTConfig
from vit_einops.network.config import DEFAULTS, FIELDS, FREE_FIELDS
from vit_einops.interop.hf_families import EXPRESSED, HF_ARCHITECTURES, hf_names
from vit_einops.interop.timm import timm_kwargs

from _tiny import TINY_RGB as TINY

# A valid value other than the default for each field, to set one at a time (every field must have one: a new
# field without an entry here fails test_every_field_has_an_other_value, so the contract tests below cover it).
OTHER = {
    "image_size": 64, "patch_size": 16, "in_channels": 1, "num_classes": 3, "dim": 64, "depth": 1, "heads": 2,
    "mlp_dim": 40, "dropout": 0.1, "attn_dropout": 0.1, "pool": "mean", "patchify": "linear",
    "representation_size": 8, "fc_norm": True, "layer_norm_eps": 1e-5, "layer_scale": 0.1, "register_tokens": 2,
    "pos_embed_prefix": False, "class_token": False, "distill_token": True, "pre_norm": True, "patch_bias": False,
    "act": "quick_gelu", "qk_norm": True, "head_bias": False, "qkv_bias": "qv", "ffn": "swiglu", "rope_grid": 4,
    "dynamic_size": "timm", "embedding": True,
}  # fmt: skip
# What each other value needs beside it to be a valid config.
NEEDS = {"class_token": {"pool": "mean"}, "pool": {}, "fc_norm": {"pool": "mean"}}


def other_config(name: str) -> ViTConfig:
    return ViTConfig(**{**TINY, **NEEDS.get(name, {}), name: OTHER[name]})


def test_every_field_is_declared_once_with_its_registry_entry():
    assert list(FIELDS) == [f.name for f in dataclasses.fields(ViTConfig)] == list(DEFAULTS)
    assert set(OTHER) == set(FIELDS), "a new field needs an other value here"
    # ViT's keywords are the fields, then attn_impl
    assert list(inspect.signature(ViT).parameters) == [*FIELDS, "attn_impl"]
    assert FREE_FIELDS == ("dropout", "attn_dropout", "patchify", "layer_norm_eps", "embedding", "dynamic_size")


@pytest.mark.parametrize("name", list(FIELDS))
def test_each_field_is_checked_by_its_registry_entry(name):
    """The field's check runs at construction: a value of the wrong type is refused naming the field."""
    with pytest.raises((TypeError, ValueError), match=rf"\b{name}\b"):
        ViTConfig(**{**TINY, name: object()})


@pytest.mark.parametrize("name", [n for n in FIELDS if n not in FREE_FIELDS])
def test_hf_export_expresses_or_refuses_every_field_by_name(name):
    """Each architecture field set away from its default is either written by some family (it appears in that
    family's options or the fields every config.json writes) or refused by every family, naming the field."""
    config = other_config(name)
    held = name in EXPRESSED or any(name in arch.options for arch in HF_ARCHITECTURES.values())
    problems = [arch.problems(config) for arch in HF_ARCHITECTURES.values()]
    if held:
        assert any(not any(p.startswith(f"{name} ") for p in found) for found in problems), name
    else:
        assert all(any(p.startswith(f"{name} ") for p in found) for found in problems), name


@pytest.mark.parametrize("name", [n for n in FIELDS if n not in FREE_FIELDS and FIELDS[n].timm is None])
def test_timm_export_refuses_a_field_it_has_no_argument_for(name):
    with pytest.raises(ValueError, match=rf"timm's VisionTransformer has no counterpart of {name} "):
        timm_kwargs(other_config(name))


def test_hf_names_come_from_the_registry():
    assert hf_names("dim 0 and register_tokens 3") == " (config.json's hidden_size, num_register_tokens)"
    assert hf_names("pool 'map'") == ""  # a field with no config.json name


def test_every_hugging_face_architecture_belongs_to_one_family_with_its_processor():
    """The family registry names the transformers classes that hold each family, and their image processor: every
    architecture the HF converter reads is held by exactly one family, and no family names one it cannot read."""
    from vit_einops.presets import FAMILIES, HF_PROCESSORS

    named = [arch for family in FAMILIES.values() for arch in family.hf]
    assert sorted(named) == sorted(HF_ARCHITECTURES) and len(named) == len(set(named))
    assert HF_PROCESSORS["Dinov2WithRegistersModel"] == "BitImageProcessor"
