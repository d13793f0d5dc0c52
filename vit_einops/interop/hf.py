"""Hugging Face transformers ViTs into vit-einops and back: ViTForImageClassification, ViTModel, DeiT (with the
distillation token: DeiTForImageClassificationWithTeacher), Dinov2Model, Dinov2WithRegistersModel, CLIPVisionModel,
CLIPVisionModelWithProjection and SiglipVisionModel.

A ``save_pretrained`` directory holds ``config.json`` (``architectures``, sizes, ``hidden_act``, ``layer_norm_eps``,
``id2label``), the weights (``model.safetensors`` or ``pytorch_model.bin``, under the hub's key names, which
transformers 5 still writes) and, beside them on the hub, ``preprocessor_config.json`` (:func:`preprocessing_from_hf`,
:func:`preprocessing_to_hf`). Each architecture's fields and keys are tables in
:mod:`vit_einops.interop.hf_families`; this module reads and writes the files.

A model loaded here has ``dynamic_size`` "hf": another input size resamples E_pos as transformers'
``interpolate_pos_encoding`` does (Dinov2WithRegistersModel's resampling antialiases, as timm's: "timm").
ViTModel's pooler is the paper's pre-training head (Linear + tanh on z_L^0 after the final LayerNorm): it becomes
``representation_size`` with ``num_classes=0``, so the model returns the ``pooler_output``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..base.checks import check_choice
from ..base.io import atomic_write_bytes, staged_directory
from ..base.json import read_json
from ..network.config import ViTConfig
from ..network.model import ViT
from ..statedict import build_vit, check_free_fields, safetensors_bytes
from ..preprocess import INCEPTION_MEAN, INCEPTION_STD, Preprocessing
from ..presets import HF_PROCESSORS
from .hf_families import (
    HF_ARCHITECTURES,
    architecture_config,
    architecture_of,
    from_architecture,
    hf_fields,
    hf_names,
    target_architecture,
    to_architecture,
)
from .io import weights_reader

SOURCE = "hf"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CONFIG_NAME, PROCESSOR_NAME = "config.json", "preprocessor_config.json"
# What save_hf writes: the only names a directory it replaces may hold.
HF_FILES = frozenset((WEIGHT_FILES[0], CONFIG_NAME, PROCESSOR_NAME))
# transformers names its untitled labels LABEL_0, LABEL_1...: those are no class names.
_PLACEHOLDER = re.compile(r"LABEL_\d+")
# The architectures whose outputs are classes (id2label names them); CLIP's projection outputs are no classes.
CLASSIFIERS = ("ViTForImageClassification", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher")
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's resample codes; the others have no torch twin


def id2label(hf: Mapping[str, Any]) -> list[str] | None:
    """config.json's ``id2label`` as a list of names (None when absent, null or empty).

    transformers writes a JSON object of "0".."n-1" to names. Anything else (a list, a key missing or out of order,
    a name that is a number, null or an object) raises ValueError naming the key and what it holds: a label that is
    not a string is no class name, and ``str(None)`` is not one either.
    """
    labels = hf.get("id2label")
    if labels is None or labels == {}:
        return None
    if not isinstance(labels, Mapping):
        raise ValueError(f"config.json id2label must be a JSON object of index to name, got a {type(labels).__name__}")
    # JSON keys are strings; a transformers config in memory (``config.to_dict()``) has int keys.
    labels = {str(k) if type(k) is int else k: v for k, v in labels.items()}
    expected = [str(i) for i in range(len(labels))]
    if set(labels) != set(expected):
        keys = ", ".join(repr(k) for k in list(labels)[:5]) + (", ..." if len(labels) > 5 else "")
        raise ValueError(f"config.json id2label keys must be the indices 0..{len(labels) - 1}, got {keys}")
    for key in expected:
        if not isinstance(labels[key], str):
            value = labels[key]
            got = "null" if value is None else f"{json.dumps(value)[:40]} ({_json_type(value)})"
            raise ValueError(f"config.json id2label[{key!r}] must be a string (a class name), got {got}")
    return [labels[key] for key in expected]


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type: what the user sees in their config.json."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "an array"}.get(type(value), type(value).__name__)


def hf_config(hf: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """The ViTConfig of a transformers config.json dict, for any architecture of
    :data:`~vit_einops.interop.hf_families.HF_ARCHITECTURES`; a field we cannot express is a ValueError naming it."""
    check_free_fields(overrides)
    if not isinstance(hf, Mapping):
        raise TypeError(f"a Hugging Face config is a JSON object, got {type(hf).__name__}")
    hf_arch = architecture_of(hf)
    labels = id2label(hf)
    num_labels = len(labels) if labels else hf.get("num_labels", 2)
    fields = hf_fields(hf, hf_arch, num_labels)
    try:
        return ViTConfig(**{**fields, **overrides})
    except (TypeError, ValueError) as err:
        raise ValueError(f"config.json describes no valid {hf_arch.architecture}: {err}{hf_names(str(err))}") from err


def from_hf(
    state_dict: Mapping[str, torch.Tensor], config: ViTConfig, architecture: str | None = None
) -> dict[str, torch.Tensor]:
    """An HF state dict renamed (q, k, v fused; CLIP's and SigLIP's shapes ours) to ours for ``config``; every key
    and shape is checked. ``architecture`` (config.json's) by default the one :func:`to_hf` would write."""
    if architecture is None:
        hf_arch = target_architecture(config)
    else:
        hf_arch = HF_ARCHITECTURES[check_choice("architecture", architecture, HF_ARCHITECTURES)]
    return from_architecture(state_dict, config, hf_arch)


def to_hf(model: ViT) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Our model as (HF state dict, config.json dict) of the transformers architecture that holds it: ViTModel for
    a pre-training head, ViTForImageClassification, DeiTForImageClassificationWithTeacher for a distillation token,
    SiglipVisionModel without a class token, CLIPVisionModel(WithProjection) with pre_norm, Dinov2Model (with
    registers: Dinov2WithRegistersModel) with LayerScale. A ValueError names what that architecture cannot hold."""
    if not isinstance(model, ViT):
        raise TypeError(f"to_hf expects a vit_einops.ViT, got {type(model).__name__}")
    config = model.config
    hf_arch = target_architecture(config)
    problems = hf_arch.problems(config)
    if hf_arch.architecture.startswith("Dinov2") and config.mlp_dim % config.dim:  # transformers' mlp_ratio is an int
        problems.append(f"mlp_dim {config.mlp_dim}, not a whole multiple of dim {config.dim} (DINOv2's mlp_ratio)")
    if problems:
        raise ValueError(f"Hugging Face's {hf_arch.label} cannot express this model: it has " + "; ".join(problems))
    names = model.class_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    return to_architecture(model.state_dict(), config, hf_arch), architecture_config(config, hf_arch, names)


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path)  # size- and depth-capped; names a missing file, a directory or a FIFO as such
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _locate(path: Path) -> tuple[Path, Path]:
    """(weights file, directory holding config.json) for a save_pretrained directory or a weights file in one."""
    if path.is_dir():
        for name in WEIGHT_FILES:
            if (path / name).is_file():
                return path / name, path
        if (path / "model.safetensors.index.json").exists():
            raise ValueError(f"{path}: sharded weights are not supported; save with a larger max_shard_size")
        raise ValueError(f"{path}: a Hugging Face directory needs {' or '.join(WEIGHT_FILES)}")
    return path, path.parent


def preprocessing_from_hf(processor_config: dict[str, Any], channels: int = 3) -> Preprocessing:
    """The :class:`~vit_einops.preprocess.Preprocessing` of a Hugging Face ``preprocessor_config.json``
    (ViTImageProcessor and the ones shaped like it): resized with torch, as transformers 5 does.

    Each field is checked for its JSON type (a ``do_*`` flag is true, false or null for the default; ``resample`` one
    of PIL's codes 0, 2, 3): a ValueError or TypeError starting "preprocessor_config.json" names the field."""
    if not isinstance(processor_config, dict):
        raise TypeError(f"{PROCESSOR_NAME} must be a JSON object, got {type(processor_config).__name__}")
    cfg = processor_config
    size = cfg.get("size", {"height": 224, "width": 224})
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"height": size, "width": size}
    if not isinstance(size, dict):
        raise ValueError(f"{PROCESSOR_NAME} 'size' must be an object or an int, got {size!r}")
    if "shortest_edge" in size:
        resize: int | tuple[int, int] = size["shortest_edge"]
    elif {"height", "width"} <= set(size):
        resize = (size["height"], size["width"])
    else:
        raise ValueError(f"{PROCESSOR_NAME} 'size' {size!r}: expected height and width, or shortest_edge")
    if not _flag(cfg, "do_resize", True):
        raise ValueError(f"{PROCESSOR_NAME} has do_resize false: images of any size would reach the model")
    crop = None
    if _flag(cfg, "do_center_crop", False):
        c = cfg.get("crop_size", {})
        c = {"height": c, "width": c} if isinstance(c, int) and not isinstance(c, bool) else c
        if not isinstance(c, dict) or not {"height", "width"} <= set(c):
            raise ValueError(f"{PROCESSOR_NAME} 'crop_size' {c!r}: expected height and width")
        crop = (c["height"], c["width"])
    resample = cfg.get("resample", 2)
    if isinstance(resample, bool) or not isinstance(resample, int) or resample not in _RESAMPLE:
        raise ValueError(f"{PROCESSOR_NAME} resample {resample!r} is not supported; expected 0, 2 or 3")
    scale = cfg.get("rescale_factor", 1 / 255) if _flag(cfg, "do_rescale", True) else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isclose(scale, 1 / 255, rel_tol=1e-6):
        raise ValueError(f"{PROCESSOR_NAME} rescale_factor {scale!r}: only 1/255 (uint8 to [0, 1]) is supported")
    if _flag(cfg, "do_normalize", True):
        mean, std = cfg.get("image_mean", INCEPTION_MEAN), cfg.get("image_std", INCEPTION_STD)
    else:
        mean, std = (0.0,) * channels, (1.0,) * channels
    mean = tuple(mean) if isinstance(mean, (list, tuple)) else (mean,) * channels
    std = tuple(std) if isinstance(std, (list, tuple)) else (std,) * channels
    try:
        return Preprocessing(
            resize=resize, crop=crop, interpolation=_RESAMPLE[resample], mean=mean, std=std, backend="torch"
        )
    except (TypeError, ValueError) as err:  # the sizes, crop and normalisation, as Preprocessing checks them
        raise type(err)(f"{PROCESSOR_NAME}: {err}") from err


def _flag(cfg: dict[str, Any], name: str, default: bool) -> bool:
    """A ``do_*`` field: true or false, or null (transformers' "the processor's default")."""
    value = cfg.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{PROCESSOR_NAME} {name!r} must be true, false or null, got {value!r}")
    return value


def preprocessing_to_hf(preprocessing: Preprocessing, processor: str = "ViTImageProcessor") -> dict[str, Any]:
    """A ``preprocessor_config.json`` for transformers' image processor ``processor`` (one of
    :data:`vit_einops.presets.HF_PROCESSORS`' values) that does what ``preprocessing`` does. Every field is
    written, so no class default applies (BitImageProcessor's crop, CLIP's mean). transformers resizes with torch by
    default, and with PIL given ``backend="pil"``: the file is the same for both.

    ValueError naming the field a processor cannot express: nearest resampling (transformers' is nearest-exact),
    and a crop after a PIL resize (transformers puts an odd margin's extra pixel below and right, torchvision and timm
    above and left half the time; the ``torch`` backend crops as transformers does)."""
    if not isinstance(preprocessing, Preprocessing):
        raise TypeError(f"preprocessing must be a vit_einops Preprocessing, got {type(preprocessing).__name__}")
    if processor not in HF_PROCESSORS.values():
        raise ValueError(f"processor {processor!r} is not one of {sorted(set(HF_PROCESSORS.values()))}")
    p = preprocessing
    if p.interpolation == "nearest":
        raise ValueError(
            f"{processor} cannot express {p}: its resample 0 resizes with nearest-exact, not nearest; "
            f"use bilinear or bicubic"
        )
    if p.backend == "pil" and p.crop is not None:
        raise ValueError(
            f"{processor} cannot express {p}: its crop_size centres an odd margin as transformers does, not as "
            f"torchvision and timm do after a PIL resize"
        )
    size = {"shortest_edge": p.resize} if isinstance(p.resize, int) else {"height": p.resize[0], "width": p.resize[1]}
    crop = {} if p.crop is None else {"crop_size": {"height": p.crop[0], "width": p.crop[1]}}
    return {
        "image_processor_type": processor,
        "do_resize": True,
        "size": size,
        "resample": {name: code for code, name in _RESAMPLE.items()}[p.interpolation],
        "do_center_crop": p.crop is not None,
        **crop,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(p.mean),
        "image_std": list(p.std),
    }


def load_hf(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | None = torch.float32,
    attn_impl: str | Sequence[str] = "einsum",
    **overrides: Any,
) -> ViT:
    """A ViT from a Hugging Face ``save_pretrained`` directory, or a weights file with config.json beside it.

    Reads heads, sizes, ``layer_norm_eps`` (HF's 1e-12), ``id2label`` (real names become ``model.class_names``) and,
    when present, ``preprocessor_config.json`` (``model.preprocessing``; else ViTImageProcessor's defaults).
    ``overrides`` set fields no tensor holds (dropout...); ``dtype`` as in :func:`~vit_einops.load_vit`;
    ``attn_impl`` as in :class:`~vit_einops.ViT`.
    """
    weights, directory = _locate(Path(path))
    if not (directory / CONFIG_NAME).exists():
        raise ValueError(f"{directory}: no {CONFIG_NAME} beside {weights.name}; HF weights need their config")
    hf = _read_json(directory / CONFIG_NAME)
    try:
        config = hf_config(hf, **overrides)
        hf_arch = architecture_of(hf)
    except (TypeError, ValueError) as err:
        message = str(err)
        if not message.startswith(CONFIG_NAME):
            raise
        # hf_config reads a dict and says "config.json ..."; here the file is known: name it in full
        raise type(err)(f"{directory / CONFIG_NAME}{message.removeprefix(CONFIG_NAME)}") from err
    _, read = weights_reader(weights, SOURCE)
    try:
        state_dict = read(config, dtype)
    except ValueError as err:  # a refusal naming our fields names config.json's too
        raise ValueError(f"{err}{hf_names(str(err))}") from err
    model = build_vit(config, from_architecture(state_dict, config, hf_arch), attn_impl)
    names = id2label(hf)
    classifier = hf_arch.architecture in CLASSIFIERS
    if classifier and config.num_classes and names and not all(_PLACEHOLDER.fullmatch(n) for n in names):
        model.class_names = names
    processor = directory / PROCESSOR_NAME
    if processor.exists() or processor.is_symlink():  # a FIFO or broken link is an error, not "absent"
        try:
            model.preprocessing = preprocessing_from_hf(_read_json(processor), channels=config.in_channels)
        except (TypeError, ValueError) as err:
            message = str(err)
            if not message.startswith(PROCESSOR_NAME):
                raise
            raise type(err)(f"{processor}{message.removeprefix(PROCESSOR_NAME)}") from err
    else:  # ViTImageProcessor's defaults, at the model's own size
        model.preprocessing = Preprocessing.hf(config.image_size, config.in_channels)
    model.source = {"library": "hf", "file": str(weights), "architecture": hf_arch.architecture}
    return model


def _json_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def hf_processor(model: ViT) -> tuple[dict[str, Any] | None, str]:
    """(preprocessor_config.json, "") for ``model``'s preprocessing, written for its family's image processor
    (its family's, :data:`vit_einops.presets.HF_PROCESSORS`: BitImageProcessor for DINOv2, CLIPImageProcessor,
    SiglipImageProcessor, DeiTImageProcessor, ViTImageProcessor); (None, why not) when it has none, or when that
    processor cannot express it (:func:`preprocessing_to_hf`'s message, naming the field)."""
    if model.preprocessing is None:
        return None, "the model has no preprocessing"
    processor = HF_PROCESSORS[target_architecture(model.config).architecture]
    try:
        return preprocessing_to_hf(model.preprocessing, processor), ""
    except ValueError as err:
        return None, str(err)


def save_hf(model: ViT, directory: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write ``model`` as a directory that transformers loads as the architecture :func:`to_hf` names
    (``from_pretrained``): config.json, model.safetensors and, when the model has a preprocessing, the
    preprocessor_config.json of that family's image processor that :func:`hf_processor` makes, unless it says why
    that processor cannot express the preprocessing.

    The directory is written as one unit (:func:`vit_einops.base.io.staged_directory`): a kill leaves the whole old
    directory or the whole new one, and a file of the old one that the new one lacks is gone. An existing non-empty
    directory is refused unless ``overwrite``; one that holds any other file is refused even then."""
    directory = Path(directory)
    state, hf_cfg = to_hf(model)
    files = {WEIGHT_FILES[0]: safetensors_bytes(state, {"format": "pt"}), CONFIG_NAME: _json_bytes(hf_cfg)}
    processor, _ = hf_processor(model)
    if processor is not None:
        files[PROCESSOR_NAME] = _json_bytes(processor)
    with staged_directory(directory, owned=HF_FILES, replace=overwrite) as staging:
        for name, data in files.items():
            atomic_write_bytes(staging / name, data, replace=False)
    return directory
