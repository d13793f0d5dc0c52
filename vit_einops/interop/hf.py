"""Hugging Face transformers ViTs (ViTForImageClassification, ViTModel) into vit-einops and back.

A ``save_pretrained`` directory holds ``config.json`` (sizes, ``layer_norm_eps`` 1e-12, ``id2label``), the weights
(``model.safetensors`` or ``pytorch_model.bin``) and, beside them on the hub, ``preprocessor_config.json``
(:func:`preprocessing_from_hf`, :func:`preprocessing_to_hf`). The
weights use the hub's key names, which transformers 5 still writes::

    vit.embeddings.cls_token                                (1, 1, D)
    vit.embeddings.position_embeddings                      (1, N, D)
    vit.embeddings.patch_embeddings.projection.{weight,bias}   Conv2d(C, D, P, P)
    vit.encoder.layer.{i}.layernorm_before.{weight,bias}
    vit.encoder.layer.{i}.attention.attention.{query,key,value}.{weight,bias}   three (D, D) Linears
    vit.encoder.layer.{i}.attention.output.dense.{weight,bias}
    vit.encoder.layer.{i}.layernorm_after.{weight,bias}
    vit.encoder.layer.{i}.intermediate.dense.{weight,bias}, vit.encoder.layer.{i}.output.dense.{weight,bias}
    vit.layernorm.{weight,bias}
    classifier.{weight,bias}            ViTForImageClassification: Linear on the class token after vit.layernorm
    pooler.dense.{weight,bias}          ViTModel (no "vit." prefix): Linear + tanh on the class token

HF keeps q, k and v as three Linears whose output rows are (h d) each; stacked in that order they are exactly our
fused ``qkv`` laid out (qkv h d), so conversion is a concatenation, with no permutation. ViTModel's pooler is the
paper's pre-training head (Linear + tanh on z_L^0 after the final LayerNorm): it becomes ``representation_size``
with ``num_classes=0``, so the model returns the ``pooler_output``.
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

from .._io import atomic_write_bytes, staged_directory
from .._json import read_json
from ..config import ViTConfig
from ..model import ViT
from ..statedict import (
    build_vit,
    cast_weights,
    check_free_fields,
    check_keys,
    check_state_dict,
    convert_patchify,
    expected_shapes,
    safetensors_bytes,
)
from ..preprocess import INCEPTION_MEAN, INCEPTION_STD, Preprocessing
from ..sizes import check_file_holds, check_model_memory
from .io import load_state_dict_file

SOURCE = "hf"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CONFIG_NAME, PROCESSOR_NAME = "config.json", "preprocessor_config.json"
# What save_hf writes: the only names a directory it replaces may hold.
HF_FILES = frozenset((WEIGHT_FILES[0], CONFIG_NAME, PROCESSOR_NAME))
# transformers names its untitled labels LABEL_0, LABEL_1...: those are no class names.
_PLACEHOLDER = re.compile(r"LABEL_\d+")
_LAYER = "vit.encoder.layer.{i}."
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's resample codes; the others have no torch twin


def _layer_keys(i: int) -> dict[str, str]:
    """Our key -> HF key for block i, q/k/v excluded (they are fused into our qkv)."""
    hf = _LAYER.format(i=i)
    ours = f"blocks.{i}."
    pairs = {
        "attn.fn.norm": "layernorm_before",
        "attn.fn.mha.proj": "attention.output.dense",
        "mlp.fn.norm": "layernorm_after",
        "mlp.fn.ff.fc1": "intermediate.dense",
        "mlp.fn.ff.fc2": "output.dense",
    }
    return {f"{ours}{a}.{p}": f"{hf}{b}.{p}" for a, b in pairs.items() for p in ("weight", "bias")}


def _key_map(config: ViTConfig) -> dict[str, str]:
    """Every one of our keys except qkv -> its HF key."""
    keys = {
        "patch_embed.proj.weight": "vit.embeddings.patch_embeddings.projection.weight",
        "patch_embed.proj.bias": "vit.embeddings.patch_embeddings.projection.bias",
        "patch_embed.cls_token.weight": "vit.embeddings.cls_token",
        "patch_embed.pos_embed.weight": "vit.embeddings.position_embeddings",
        "head.norm.weight": "vit.layernorm.weight",
        "head.norm.bias": "vit.layernorm.bias",
    }
    for i in range(config.depth):
        keys |= _layer_keys(i)
    if config.representation_size is not None:
        keys |= {"head.pre_logits.fc.weight": "pooler.dense.weight", "head.pre_logits.fc.bias": "pooler.dense.bias"}
    if config.num_classes:
        keys |= {"head.fc.weight": "classifier.weight", "head.fc.bias": "classifier.bias"}
    return keys


def _qkv_keys(i: int, part: str) -> tuple[str, str, str]:
    hf = _LAYER.format(i=i) + "attention.attention."
    return tuple(f"{hf}{name}.{part}" for name in ("query", "key", "value"))  # type: ignore[return-value]


def _normalise_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ViTModel's keys carry no "vit." prefix (its pooler never does): give the backbone keys one prefix."""
    out = {}
    for key, value in state_dict.items():
        bare = key.startswith(("embeddings.", "encoder.", "layernorm."))
        out[f"vit.{key}" if bare else key] = value
    return out


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
    """The ViTConfig of a transformers ``ViTConfig`` dict (config.json)."""
    check_free_fields(overrides)
    if not isinstance(hf, Mapping):
        raise TypeError(f"a Hugging Face config is a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type", "vit")
    if model_type not in ("vit", "deit"):
        raise ValueError(f"config.json model_type {model_type!r} is not a ViT; expected 'vit' (or a ViT-shaped 'deit')")
    architectures = hf.get("architectures") or ["ViTForImageClassification"]
    if not isinstance(architectures, list) or not isinstance(architectures[0], str):
        raise TypeError(f"config.json architectures must be a list of names, got {architectures!r:.200}")
    arch = architectures[0]
    if "Distillation" in arch or "WithTeacher" in arch:
        raise ValueError(f"{arch} has a distillation token, which vit-einops does not model; use a plain ViT")
    if arch not in ("ViTForImageClassification", "ViTModel", "DeiTForImageClassification", "DeiTModel"):
        raise ValueError(f"architecture {arch!r} is not supported; expected ViTForImageClassification or ViTModel")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act {hf.get('hidden_act')!r}: only 'gelu' (exact, the paper's) is supported")
    if hf.get("qkv_bias", True) is not True:
        raise ValueError("qkv_bias false is not supported: our fused qkv Linear has a bias")
    if hf.get("pooler_act", "tanh") != "tanh":
        raise ValueError(
            f"pooler_act {hf.get('pooler_act')!r}: only 'tanh' (the paper's pre-training head) is supported"
        )
    dim = hf.get("hidden_size", 768)
    classify = arch.endswith("ForImageClassification")
    labels = id2label(hf)
    num_labels = len(labels) if labels else hf.get("num_labels", 2)
    fields = {
        "image_size": hf.get("image_size", 224),
        "patch_size": hf.get("patch_size", 16),
        "in_channels": hf.get("num_channels", 3),
        "num_classes": num_labels if classify else 0,
        "dim": dim,
        "depth": hf.get("num_hidden_layers", 12),
        "heads": hf.get("num_attention_heads", 12),
        "mlp_dim": hf.get("intermediate_size", 3072),
        "dropout": hf.get("hidden_dropout_prob", 0.0),
        "attn_dropout": hf.get("attention_probs_dropout_prob", 0.0),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-12),
        "representation_size": None if classify else hf.get("pooler_output_size") or dim,
    }
    try:
        return ViTConfig(**{**fields, **overrides})
    except (TypeError, ValueError) as err:
        raise ValueError(f"config.json describes no valid ViT: {err}") from err


def from_hf(state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """An HF ViT state dict renamed (q, k, v fused) to ours for ``config``; every key and shape is checked."""
    state_dict = _normalise_keys(check_state_dict(state_dict, SOURCE))
    if config.representation_size is None:
        state_dict.pop("pooler.dense.weight", None)  # ViTForImageClassification never uses a pooler
        state_dict.pop("pooler.dense.bias", None)
    conv = ViTConfig.from_dict({**config.to_dict(), "patchify": "conv"})
    shapes = expected_shapes(conv)
    keys = _key_map(conv)
    expected = {theirs: shapes[ours] for ours, theirs in keys.items()}
    d = conv.dim
    for i in range(conv.depth):
        for part, shape in (("weight", (d, d)), ("bias", (d,))):
            expected |= dict.fromkeys(_qkv_keys(i, part), torch.Size(shape))
    check_keys(state_dict, expected, SOURCE)
    ours = {k: state_dict[theirs] for k, theirs in keys.items()}
    for i in range(conv.depth):
        for part in ("weight", "bias"):
            ours[f"blocks.{i}.attn.fn.mha.qkv.{part}"] = torch.cat([state_dict[k] for k in _qkv_keys(i, part)])
    return convert_patchify(ours, config, "conv", config.patchify)


def to_hf(model: ViT) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Our model as (HF state dict, config.json dict) for ViTForImageClassification, or ViTModel when it has a
    pre-training head and no classifier. Raises ValueError for what HF's ViT cannot express."""
    if not isinstance(model, ViT):
        raise TypeError(f"to_hf expects a vit_einops.ViT, got {type(model).__name__}")
    config = model.config
    problems = []
    if config.pool != "cls":
        problems.append(f"pool {config.pool!r} (HF's ViT reads the class token)")
    if config.fc_norm:
        problems.append("fc_norm (HF normalises every token before pooling)")
    if config.image_size[0] != config.image_size[1] or config.patch_size[0] != config.patch_size[1]:
        problems.append(f"non-square image_size {config.image_size} or patch_size {config.patch_size}")
    if config.num_classes and config.representation_size is not None:
        problems.append("both a pre-logits layer and a classifier (ViTForImageClassification has no pooler)")
    if not config.num_classes and config.representation_size is None:
        problems.append("neither a classifier nor a pooler")
    if config.beyond_paper():
        problems.append(f"{', '.join(config.beyond_paper())} (HF's ViT has the paper's blocks and tokens only)")
    if problems:
        raise ValueError("Hugging Face's ViT cannot express this model: it has " + "; ".join(problems))
    state = convert_patchify({k: v.detach() for k, v in model.state_dict().items()}, config, config.patchify, "conv")
    hf = {theirs: state[ours] for ours, theirs in _key_map(config).items()}
    for i in range(config.depth):
        for part in ("weight", "bias"):
            for key, tensor in zip(_qkv_keys(i, part), state[f"blocks.{i}.attn.fn.mha.qkv.{part}"].chunk(3)):
                hf[key] = tensor
    classify = bool(config.num_classes)
    if not classify:  # ViTModel's keys: no "vit." prefix
        hf = {k.removeprefix("vit."): v for k, v in hf.items()}
    names = model.class_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    hf_cfg = {
        "architectures": ["ViTForImageClassification" if classify else "ViTModel"],
        "model_type": "vit",
        "hidden_size": config.dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attn_dropout,
        "layer_norm_eps": config.layer_norm_eps,
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_channels,
        "qkv_bias": True,
        "pooler_output_size": config.representation_size or config.dim,
        "pooler_act": "tanh",
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
    }
    return hf, hf_cfg


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
    (ViTImageProcessor and the ones shaped like it): resized with torch, as transformers 5 does."""
    if not isinstance(processor_config, dict):
        raise TypeError(f"preprocessor_config must be a JSON object, got {type(processor_config).__name__}")
    cfg = processor_config
    size = cfg.get("size", {"height": 224, "width": 224})
    if isinstance(size, int):
        size = {"height": size, "width": size}
    if not isinstance(size, dict):
        raise ValueError(f"preprocessor_config 'size' must be an object or an int, got {size!r}")
    if "shortest_edge" in size:
        resize: int | tuple[int, int] = size["shortest_edge"]
    elif {"height", "width"} <= set(size):
        resize = (size["height"], size["width"])
    else:
        raise ValueError(f"preprocessor_config 'size' {size!r}: expected height and width, or shortest_edge")
    if cfg.get("do_resize", True) is False:
        raise ValueError("preprocessor_config has do_resize false: images of any size would reach the model")
    crop = None
    if cfg.get("do_center_crop"):
        c = cfg.get("crop_size", {})
        c = {"height": c, "width": c} if isinstance(c, int) else c
        if not isinstance(c, dict) or not {"height", "width"} <= set(c):
            raise ValueError(f"preprocessor_config 'crop_size' {c!r}: expected height and width")
        crop = (c["height"], c["width"])
    resample = cfg.get("resample", 2)
    if resample not in _RESAMPLE:
        raise ValueError(f"preprocessor_config resample {resample!r} is not supported; expected 0, 2 or 3")
    scale = cfg.get("rescale_factor", 1 / 255) if cfg.get("do_rescale", True) else 1.0
    if not math.isclose(scale, 1 / 255, rel_tol=1e-6):
        raise ValueError(f"preprocessor_config rescale_factor {scale!r}: only 1/255 (uint8 to [0, 1]) is supported")
    if cfg.get("do_normalize", True):
        mean, std = cfg.get("image_mean", INCEPTION_MEAN), cfg.get("image_std", INCEPTION_STD)
    else:
        mean, std = (0.0,) * channels, (1.0,) * channels
    mean = tuple(mean) if isinstance(mean, (list, tuple)) else (mean,) * channels
    std = tuple(std) if isinstance(std, (list, tuple)) else (std,) * channels
    return Preprocessing(
        resize=resize, crop=crop, interpolation=_RESAMPLE[resample], mean=mean, std=std, backend="torch"
    )


def preprocessing_to_hf(preprocessing: Preprocessing) -> dict[str, Any]:
    """A ``preprocessor_config.json`` for transformers' ViTImageProcessor (exact resize, no crop, torch backend);
    ValueError for a preprocessing it cannot express."""
    if not isinstance(preprocessing, Preprocessing):
        raise TypeError(f"preprocessing must be a vit_einops Preprocessing, got {type(preprocessing).__name__}")
    p = preprocessing
    if not isinstance(p.resize, tuple) or p.crop is not None or p.backend != "torch":
        raise ValueError(
            f"{p} resizes the shorter side and/or crops with PIL, which ViTImageProcessor cannot express "
            f"(it resizes to an exact size with torch, and has no crop)"
        )
    codes = {name: code for code, name in _RESAMPLE.items()}
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": p.resize[0], "width": p.resize[1]},
        "resample": codes[p.interpolation],
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
    except (TypeError, ValueError) as err:
        message = str(err)
        if not message.startswith(CONFIG_NAME):
            raise
        # hf_config reads a dict and says "config.json ..."; here the file is known: name it in full
        raise type(err)(f"{directory / CONFIG_NAME}{message.removeprefix(CONFIG_NAME)}") from err
    check_file_holds(config, weights.stat().st_size, str(weights))  # a tiny file claiming a huge depth, at once
    itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 4
    check_model_memory(config, itemsize, copies=2, action="loading")
    state_dict = cast_weights(load_state_dict_file(weights), str(weights), dtype)
    model = build_vit(config, from_hf(state_dict, config), attn_impl)
    names = id2label(hf)
    if config.num_classes and names and not all(_PLACEHOLDER.fullmatch(n) for n in names):
        model.class_names = names
    processor = directory / PROCESSOR_NAME
    if processor.exists() or processor.is_symlink():  # a FIFO or broken link is an error, not "absent"
        model.preprocessing = preprocessing_from_hf(_read_json(processor), channels=config.in_channels)
    else:  # ViTImageProcessor's defaults, at the model's own size
        model.preprocessing = Preprocessing.hf(config.image_size, config.in_channels)
    model.source = {"library": "hf", "file": str(weights), "architecture": (hf.get("architectures") or [None])[0]}
    return model


def _json_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def save_hf(model: ViT, directory: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write ``model`` as a directory that ``transformers.ViTForImageClassification.from_pretrained`` (or
    ``ViTModel``, for a model with a pooler and no classifier) loads: config.json, model.safetensors and, when the
    model's preprocessing is ViTImageProcessor-shaped, preprocessor_config.json.

    The directory is written as one unit (:func:`vit_einops._io.staged_directory`): a kill leaves the whole old
    directory or the whole new one, and a file of the old one that the new one lacks is gone. An existing non-empty
    directory is refused unless ``overwrite``; one that holds any other file is refused even then."""
    directory = Path(directory)
    state, hf_cfg = to_hf(model)
    processor = None
    if model.preprocessing is not None:
        try:
            processor = preprocessing_to_hf(model.preprocessing)
        except ValueError:
            processor = None  # torchvision/timm-style resize + crop: no ViTImageProcessor equivalent
    files = {WEIGHT_FILES[0]: safetensors_bytes(state, {"format": "pt"}), CONFIG_NAME: _json_bytes(hf_cfg)}
    if processor is not None:
        files[PROCESSOR_NAME] = _json_bytes(processor)
    with staged_directory(directory, owned=HF_FILES, replace=overwrite) as staging:
        for name, data in files.items():
            atomic_write_bytes(staging / name, data, replace=False)
    return directory
