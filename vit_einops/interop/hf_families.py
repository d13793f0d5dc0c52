"""Hugging Face transformers' vision transformers as tables: each architecture's config.json fields and weight names,
and how they become a :class:`~vit_einops.ViTConfig` and our state-dict keys. :mod:`vit_einops.interop.hf` reads and
writes the files.

Two key layouts cover the families (shown without the backbone prefix, ``vit.``, ``deit.`` or ``vision_model.``,
that some architectures put before them)::

    ViT layout: ViT, DeiT (+ distillation token), DINOv2 (+ registers)
        embeddings.{cls_token, distillation_token, register_tokens, position_embeddings, mask_token}
        embeddings.patch_embeddings.projection                Conv2d(C, D, P, P)
        encoder.layer.{i}.attention.attention.{query,key,value}, encoder.layer.{i}.attention.output.dense
        ViT, DeiT:  layernorm_before, layernorm_after, intermediate.dense, output.dense
        DINOv2:     norm1, norm2, mlp.fc1, mlp.fc2, layer_scale1.lambda1, layer_scale2.lambda1
        layernorm;  classifier | pooler.dense | cls_classifier + distillation_classifier
    CLIP layout: CLIP and SigLIP vision towers
        embeddings.{class_embedding (D,), position_embedding.weight (N, D), patch_embedding}
        pre_layrnorm (CLIP), encoder.layers.{i}.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}
        post_layernorm; SigLIP's attention-pooling head.{probe, attention (nn.MultiheadAttention), layernorm, mlp};
        CLIP's visual_projection (bias-free)

HF keeps q, k and v as three Linears whose rows are (h d) each: stacked, they are our fused ``qkv`` laid out
(qkv h d). SigLIP's head stacks them as one ``in_proj_weight``: its first D rows are our ``head.pool.q``, the other
2D our ``head.pool.kv`` (laid out (kv h d)). So every tensor moves by renaming, concatenating or splitting along its
first axis, and reshaping (CLIP keeps its class token as (D,) and E_pos as (N, D)).

Dinov2WithRegistersModel adds E_pos to the class token and the patches, then inserts the registers, which get none:
our ``pos_embed_prefix=False`` layout (E_pos for the patches only, as timm stores these weights) holds the class
token with its position row folded in, so the one addition happens in either library and outputs are bit-equal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..base.checks import MAX_SIZE, show_int
from ..network.config import DEFAULTS, FIELDS, ViTConfig
from ..statedict import check_keys, check_state_dict, convert_patchify, expected_shapes
from .keys import ATTN_LS, ATTN_NORM, FF, MHA, MLP_LS, MLP_NORM, KeyLayout, Rule, conv_form

SOURCE = "hf"

# HF's hidden_act names for ours (ViTConfig.act): transformers' ACT2FN entries computing exactly the same function.
HF_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
ACT_NAMES = {ours: theirs for theirs, ours in HF_ACTS.items()}



def _qkv(template: str, names: tuple[str, str, str]) -> tuple[str, ...]:
    return tuple(template.format(n) for n in names)


VIT_LAYOUT: tuple[Rule, ...] = (
    (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embeddings.projection.\1", None),
    (r"patch_embed\.cls_token\.weight", "embeddings.cls_token", None),
    (r"patch_embed\.dist_token\.weight", "embeddings.distillation_token", None),
    (r"patch_embed\.reg_token\.weight", "embeddings.register_tokens", None),
    (r"patch_embed\.pos_embed\.weight", "embeddings.position_embeddings", None),
    (MHA + r"qkv\.(weight|bias)",
     _qkv(r"encoder.layer.\1.attention.attention.{}.\2", ("query", "key", "value")), None),
    (MHA + r"proj\.(weight|bias)", r"encoder.layer.\1.attention.output.dense.\2", None),
    (r"head\.norm\.(weight|bias)", r"layernorm.\1", None),
)  # fmt: skip
VIT_BLOCKS: tuple[Rule, ...] = (
    (ATTN_NORM + r"(weight|bias)", r"encoder.layer.\1.layernorm_before.\2", None),
    (MLP_NORM + r"(weight|bias)", r"encoder.layer.\1.layernorm_after.\2", None),
    (FF + r"fc1\.(weight|bias)", r"encoder.layer.\1.intermediate.dense.\2", None),
    (FF + r"fc2\.(weight|bias)", r"encoder.layer.\1.output.dense.\2", None),
)
DINOV2_BLOCKS: tuple[Rule, ...] = (
    (ATTN_NORM + r"(weight|bias)", r"encoder.layer.\1.norm1.\2", None),
    (ATTN_LS + r"gamma", r"encoder.layer.\1.layer_scale1.lambda1", None),
    (MLP_NORM + r"(weight|bias)", r"encoder.layer.\1.norm2.\2", None),
    (FF + r"(fc1|fc2)\.(weight|bias)", r"encoder.layer.\1.mlp.\2.\3", None),
    (MLP_LS + r"gamma", r"encoder.layer.\1.layer_scale2.lambda1", None),
)
CLIP_LAYOUT: tuple[Rule, ...] = (
    (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embedding.\1", None),
    (r"patch_embed\.cls_token\.weight", "embeddings.class_embedding", 1),
    (r"patch_embed\.pos_embed\.weight", "embeddings.position_embedding.weight", 2),
    (r"patch_embed\.norm_pre\.(weight|bias)", r"pre_layrnorm.\1", None),
    (ATTN_NORM + r"(weight|bias)", r"encoder.layers.\1.layer_norm1.\2", None),
    (MHA + r"qkv\.(weight|bias)",
     _qkv(r"encoder.layers.\1.self_attn.{}_proj.\2", ("q", "k", "v")), None),
    (MHA + r"proj\.(weight|bias)", r"encoder.layers.\1.self_attn.out_proj.\2", None),
    (MLP_NORM + r"(weight|bias)", r"encoder.layers.\1.layer_norm2.\2", None),
    (FF + r"(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3", None),
    (r"head\.norm\.(weight|bias)", r"post_layernorm.\1", None),
    # SigLIP's pooling head: nn.MultiheadAttention stores q, k, v as one in_proj (q rows first, then k, then v).
    (r"head\.pool\.latent", "head.probe", None),
    (r"head\.pool\.(?:q|kv)\.weight", "head.attention.in_proj_weight", None),
    (r"head\.pool\.(?:q|kv)\.bias", "head.attention.in_proj_bias", None),
    (r"head\.pool\.proj\.(weight|bias)", r"head.attention.out_proj.\1", None),
    (r"head\.pool\.norm\.(weight|bias)", r"head.layernorm.\1", None),
    (r"head\.pool\.mlp\.(fc1|fc2)\.(weight|bias)", r"head.mlp.\1.\2", None),
    (r"head\.fc\.weight", "visual_projection.weight", None),
)  # fmt: skip

# The ViTConfig fields every family's config.json writes (hidden_size, hidden_act, ...). What a family holds besides
# these is its ``options``; any other field must be at its default, or the model is refused (never exported plain).
EXPRESSED = (
    "image_size", "patch_size", "in_channels", "num_classes", "dim", "depth", "heads", "mlp_dim", "layer_norm_eps",
    "act",
)  # fmt: skip


@dataclass(frozen=True)
class Holds:
    """An option value test with the words for what passes ("some LayerScale")."""

    test: Callable[[Any], bool]
    words: str


ANY_LAYER_SCALE = Holds(lambda v: v is not None, "some LayerScale")
SOME_CLASSES = Holds(lambda k: k > 0, "a classifier")
A_POOLER = Holds(lambda r: r is not None, "a pooler (representation_size)")


@dataclass(frozen=True)
class HFArchitecture:
    """One transformers architecture: its config.json ``model_type`` values, the prefix its files put before the
    backbone keys, its key rules, the starts of the keys its files may hold that no vit-einops tensor matches
    (dropped when read; DINOv2's mask token is written as zeros), the ViTConfig options it holds beyond
    :data:`EXPRESSED` (a value, or a test of the value), and its config.json reader."""

    architecture: str
    model_types: tuple[str, ...]
    prefix: str
    rules: tuple[Rule, ...]
    unused: tuple[str, ...]
    options: Mapping[str, Any]
    read: Callable[[Mapping[str, Any], str], dict[str, Any]]

    @property
    def layout(self) -> KeyLayout:
        return KeyLayout(f"Hugging Face's {self.architecture}", self.rules)

    @property
    def label(self) -> str:
        return "ViT" if self.architecture.startswith("ViT") else self.architecture

    def problems(self, config: ViTConfig) -> list[str]:
        """What ``config`` has that this architecture cannot hold, each as "field value (what it holds)": a field it
        neither writes (:data:`EXPRESSED`) nor holds (``options``) must be at its default; free fields (dropout, the
        patch projection's form) are not architecture."""
        found = []
        for name, about in FIELDS.items():
            if name not in self.options and (name in EXPRESSED or about.free):
                continue
            plain = self.options.get(name, DEFAULTS[name])
            value = getattr(config, name)
            fits = plain.test(value) if isinstance(plain, Holds) else value == plain
            if not fits:
                want = plain.words if isinstance(plain, Holds) else repr(plain)
                found.append(f"{name} {value!r} ({self.label} has {want})")
        if config.image_size[0] != config.image_size[1] or config.patch_size[0] != config.patch_size[1]:
            found.append(f"non-square image_size {config.image_size} or patch_size {config.patch_size}")
        return found


def _field(hf: Mapping[str, Any], name: str, default: Any, kinds: tuple[type, ...] = (int,)) -> Any:
    """config.json's ``name`` (``default`` when absent), which must be one of ``kinds`` (a bool is no number)."""
    value = hf.get(name, default)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join(k.__name__ for k in kinds)
        raise TypeError(f"config.json {name} must be {expected}, got {value!r:.80} ({type(value).__name__})")
    return value


def _require(hf: Mapping[str, Any], name: str, default: Any, wanted: Any, why: str) -> None:
    value = hf.get(name, default)
    if value != wanted or type(value) is not type(wanted):
        raise ValueError(f"config.json {name} {value!r:.80} is not supported: {why} (expected {wanted!r})")


def _act(hf: Mapping[str, Any], default: str) -> str:
    value = hf.get("hidden_act", default)
    if not isinstance(value, str) or value not in HF_ACTS:
        raise ValueError(
            f"config.json hidden_act {value!r:.80} is not supported; expected one of {', '.join(HF_ACTS)}"
        )
    return HF_ACTS[value]


def _sizes(hf: Mapping[str, Any], eps: float, act: str, patch: int) -> dict[str, Any]:
    """The fields every family names alike, with its transformers defaults."""
    return {
        "image_size": _field(hf, "image_size", 224, (int, list)),
        "patch_size": _field(hf, "patch_size", patch, (int, list)),
        "in_channels": _field(hf, "num_channels", 3),
        "dim": _field(hf, "hidden_size", 768),
        "depth": _field(hf, "num_hidden_layers", 12),
        "heads": _field(hf, "num_attention_heads", 12),
        "layer_norm_eps": _field(hf, "layer_norm_eps", eps, (int, float)),
        "act": _act(hf, act),
    }


def _check_head_dim(hf: Mapping[str, Any]) -> None:
    dim, heads = _field(hf, "hidden_size", 768), _field(hf, "num_attention_heads", 12)
    head_dim = hf.get("head_dim")
    if head_dim is not None and _field(hf, "head_dim", None) * heads != dim:
        raise ValueError(f"config.json head_dim {head_dim!r:.40} is not hidden_size / num_attention_heads")


def _mlp_dim(dim: int, ratio: Any) -> int:
    """DINOv2's MLP width from config.json's ``mlp_ratio``: ``int(hidden_size * mlp_ratio)``, transformers' own
    rounding (Dinov2MLP), for a ratio that is a positive finite number and a product within torch's sizes."""
    if not ratio > 0 or not math.isfinite(ratio):
        raise ValueError(f"config.json mlp_ratio must be a positive finite number, got {ratio!r}")
    try:
        mlp_dim = int(dim * ratio)
    except OverflowError:  # a product past float's range, or a hidden_size past it (then refused by its own check)
        mlp_dim = MAX_SIZE + 1
    if mlp_dim > MAX_SIZE:
        raise ValueError(
            f"config.json mlp_ratio {ratio!r} times hidden_size {show_int(dim)} is too large an MLP: torch's sizes "
            f"are int64, at most 2**63 - 1"
        )
    return mlp_dim


def _read_vit(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    _require(hf, "qkv_bias", True, True, "our fused qkv Linear has a bias")
    _require(hf, "pooler_act", "tanh", "tanh", "the paper's pre-training head is Linear + tanh")
    fields = _sizes(hf, 1e-12, "gelu", 16) | {
        "mlp_dim": _field(hf, "intermediate_size", 3072),
        "dropout": _field(hf, "hidden_dropout_prob", 0.0, (int, float)),
        "attn_dropout": _field(hf, "attention_probs_dropout_prob", 0.0, (int, float)),
    }
    if arch.endswith("Model"):  # the pooler: Linear + tanh on the class token, no classifier
        return fields | {"num_classes": 0, "representation_size": hf.get("pooler_output_size") or fields["dim"]}
    return fields | {"distill_token": arch.endswith("WithTeacher")}


def _read_dinov2(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    _require(hf, "use_swiglu_ffn", False, False, "vit-einops' MLP is Linear, GELU, Linear")
    _require(hf, "qkv_bias", True, True, "our fused qkv Linear has a bias")
    _check_head_dim(hf)
    fields = _sizes(hf, 1e-6, "gelu", 14 if arch == "Dinov2Model" else 16)
    mlp_dim = _mlp_dim(fields["dim"], _field(hf, "mlp_ratio", 4, (int, float)))
    registers = _field(hf, "num_register_tokens", 4) if arch == "Dinov2WithRegistersModel" else 0
    if arch == "Dinov2WithRegistersModel" and registers < 1:
        raise ValueError(f"config.json num_register_tokens must be a positive int, got {registers!r}")
    return fields | {
        "mlp_dim": mlp_dim,
        "dropout": _field(hf, "hidden_dropout_prob", 0.0, (int, float)),
        "attn_dropout": _field(hf, "attention_probs_dropout_prob", 0.0, (int, float)),
        "num_classes": 0,
        "layer_scale": _field(hf, "layerscale_value", 1.0, (int, float)),
        "register_tokens": registers,
        "pos_embed_prefix": not registers,
    }


def _read_clip(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    fields = _sizes(hf, 1e-5, "quick_gelu", 32) | {
        "mlp_dim": _field(hf, "intermediate_size", 3072),
        "attn_dropout": _field(hf, "attention_dropout", 0.0, (int, float)),
        "pre_norm": True,
        "patch_bias": False,
    }
    if arch == "CLIPVisionModelWithProjection":  # image_embeds = visual_projection(post_layernorm(z_L^0))
        projection = _field(hf, "projection_dim", 512)
        if projection < 1:
            raise ValueError(f"config.json projection_dim must be a positive int, got {projection!r}")
        return fields | {"num_classes": projection, "head_bias": False, "embedding": True}
    return fields | {"num_classes": 0}


def _read_siglip(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    head = _field(hf, "vision_use_head", True, (bool,))
    fields = _sizes(hf, 1e-6, "gelu_pytorch_tanh", 16) | {
        "mlp_dim": _field(hf, "intermediate_size", 3072),
        "attn_dropout": _field(hf, "attention_dropout", 0.0, (int, float)),
        "class_token": False,
        "num_classes": 0,
    }
    # Without its head the tower returns the tokens alone (pooler_output None); our model's output is then their
    # mean, which transformers never computes, but its tokens and attention are the tower's.
    return fields | {"pool": "map" if head else "mean"}


VIT_TYPES = ("vit", "deit")
CLASSIFIER: tuple[Rule, ...] = ((r"head\.fc\.(weight|bias)", r"classifier.\1", None),)
POOLER: tuple[Rule, ...] = ((r"head\.pre_logits\.fc\.(weight|bias)", r"pooler.dense.\1", None),)
TEACHER: tuple[Rule, ...] = (
    (r"head\.fc\.(weight|bias)", r"cls_classifier.\1", None),
    (r"head\.fc_dist\.(weight|bias)", r"distillation_classifier.\1", None),
)
UNUSED_POOLER = ("pooler.dense.weight", "pooler.dense.bias")  # ViTForImageClassification files may hold one
MASK_TOKEN = ("embeddings.mask_token",)  # DINOv2's token for masked image modelling, unused at inference
# A buffer older transformers saved with CLIP and SigLIP, and a whole CLIP or SigLIP model's text tower.
CLIP_UNUSED = ("embeddings.position_ids", "text_model.", "text_projection.", "logit_scale", "logit_bias")
NO_HEAD = {"num_classes": 0, "representation_size": None}
VIT_CLASSIFIER = {"num_classes": SOME_CLASSES, "representation_size": None, "embedding": False}
VIT_POOLER = {"num_classes": 0, "representation_size": A_POOLER}
DINOV2 = NO_HEAD | {"layer_scale": ANY_LAYER_SCALE}
CLIP = {"pre_norm": True, "patch_bias": False, "representation_size": None}
SIGLIP_POOLS = Holds(lambda p: p != "cls", "'map' or, without its head, 'mean'")

HF_ARCHITECTURES: dict[str, HFArchitecture] = {
    f.architecture: f
    for f in (
        HFArchitecture("ViTForImageClassification", VIT_TYPES, "vit.", VIT_LAYOUT + VIT_BLOCKS + CLASSIFIER,
                       UNUSED_POOLER, VIT_CLASSIFIER, _read_vit),
        HFArchitecture("ViTModel", VIT_TYPES, "", VIT_LAYOUT + VIT_BLOCKS + POOLER, (), VIT_POOLER, _read_vit),
        HFArchitecture("DeiTForImageClassification", VIT_TYPES, "deit.", VIT_LAYOUT + VIT_BLOCKS + CLASSIFIER,
                       UNUSED_POOLER, VIT_CLASSIFIER, _read_vit),
        HFArchitecture("DeiTModel", VIT_TYPES, "", VIT_LAYOUT + VIT_BLOCKS + POOLER, (), VIT_POOLER, _read_vit),
        HFArchitecture("DeiTForImageClassificationWithTeacher", ("deit",), "deit.", VIT_LAYOUT + VIT_BLOCKS + TEACHER,
                       (), {"distill_token": True, "representation_size": None, "embedding": False}, _read_vit),
        HFArchitecture("Dinov2Model", ("dinov2",), "", VIT_LAYOUT + DINOV2_BLOCKS, MASK_TOKEN, DINOV2, _read_dinov2),
        HFArchitecture("Dinov2WithRegistersModel", ("dinov2_with_registers",), "", VIT_LAYOUT + DINOV2_BLOCKS,
                       MASK_TOKEN,
                       DINOV2 | {"register_tokens": Holds(lambda r: r > 0, "registers"), "pos_embed_prefix": False},
                       _read_dinov2),
        HFArchitecture("CLIPVisionModel", ("clip_vision_model",), "", CLIP_LAYOUT, CLIP_UNUSED,
                       CLIP | {"num_classes": 0}, _read_clip),
        HFArchitecture("CLIPVisionModelWithProjection", ("clip_vision_model",), "vision_model.", CLIP_LAYOUT,
                       CLIP_UNUSED,
                       CLIP | {"head_bias": False, "num_classes": Holds(lambda k: k > 0, "a projection"),
                               "embedding": True},
                       _read_clip),
        HFArchitecture("SiglipVisionModel", ("siglip_vision_model",), "", CLIP_LAYOUT, CLIP_UNUSED,
                       NO_HEAD | {"class_token": False, "pool": SIGLIP_POOLS}, _read_siglip),
    )
}  # fmt: skip
# The architecture a config.json without ``architectures`` describes, by its model_type.
DEFAULT_ARCHITECTURE = {
    "vit": "ViTForImageClassification",
    "deit": "DeiTForImageClassification",
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
    "clip_vision_model": "CLIPVisionModel",
    "siglip_vision_model": "SiglipVisionModel",
}
# Keys that name the head of an architecture, never prefixed with the backbone's prefix.
HEAD_ROOTS = ("classifier.", "pooler.", "cls_classifier.", "distillation_classifier.", "visual_projection.")
# What files put before the backbone keys: ViTForImageClassification "vit.", DeiT's classifiers "deit.", CLIP and
# SigLIP checkpoints of older transformers "vision_model.". Read without it, written as the family's ``prefix``.
PREFIXES = ("vit.", "deit.", "vision_model.")
# A whole CLIP or SigLIP model (image and text towers): model_type -> (its architecture, the one its vision tower
# reads as). Its config.json keeps the tower's fields under vision_config, CLIP's projection_dim at the top.
WHOLE_MODELS = {
    "clip": ("CLIPModel", "CLIPVisionModelWithProjection"),
    "siglip": ("SiglipModel", "SiglipVisionModel"),
}
WHOLE_TYPES = {whole: model_type for model_type, (whole, _) in WHOLE_MODELS.items()}


def architecture_of(hf: Mapping[str, Any]) -> HFArchitecture:
    """The :class:`HFArchitecture` a config.json describes, by ``architectures[0]`` (else by its ``model_type``); the
    two must agree where both are given."""
    architectures = hf.get("architectures") or []
    if not isinstance(architectures, list) or architectures and not isinstance(architectures[0], str):
        raise TypeError(f"config.json architectures must be a list of names, got {architectures!r:.200}")
    first = architectures[0] if architectures else None
    named = HF_ARCHITECTURES[first].model_types[0] if first in HF_ARCHITECTURES else WHOLE_TYPES.get(first)
    model_type = hf.get("model_type", named or "vit")
    if not isinstance(model_type, str):
        raise TypeError(f"config.json model_type must be a string, got {model_type!r:.80}")
    if model_type in WHOLE_MODELS:
        whole, tower = WHOLE_MODELS[model_type]
        if first is not None and first != whole:
            raise ValueError(
                f"config.json model_type {model_type!r} does not fit architecture {first!r:.80} "
                f"(expected {whole!r})"
            )
        return HF_ARCHITECTURES[tower]
    if model_type not in DEFAULT_ARCHITECTURE:
        raise ValueError(
            f"config.json model_type {model_type!r:.80} is not a ViT; expected one of "
            f"{', '.join(map(repr, DEFAULT_ARCHITECTURE))}"
        )
    arch = first or DEFAULT_ARCHITECTURE[model_type]
    if arch not in HF_ARCHITECTURES:
        supported = ", ".join([*HF_ARCHITECTURES, *WHOLE_TYPES])
        raise ValueError(f"config.json architecture {arch!r:.80} is not supported; expected one of {supported}")
    hf_arch = HF_ARCHITECTURES[arch]
    if model_type not in hf_arch.model_types:
        raise ValueError(
            f"config.json model_type {model_type!r:.80} does not fit architecture {arch} "
            f"(expected {' or '.join(map(repr, hf_arch.model_types))})"
        )
    return hf_arch


def tower_config(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    """The fields of config.json that describe the vision tower: all of them, or a whole model's vision_config."""
    if hf.get("model_type") not in WHOLE_MODELS:
        return hf
    tower = hf.get("vision_config") or {}
    if not isinstance(tower, Mapping):
        raise TypeError(f"config.json vision_config must be a JSON object, got {tower!r:.80}")
    if hf["model_type"] == "clip":  # the projection to the joint embedding belongs to the whole model
        return {**tower, "projection_dim": hf.get("projection_dim", 512)}
    return tower


def hf_fields(hf: Mapping[str, Any], hf_arch: HFArchitecture, num_labels: int) -> dict[str, Any]:
    """Our ViTConfig fields of a config.json of ``hf_arch``; ``num_labels`` sizes the classifiers it has."""
    fields = hf_arch.read(tower_config(hf), hf_arch.architecture)
    if "num_classes" not in fields:
        fields["num_classes"] = num_labels
    return {"dynamic_size": "timm" if fields.get("register_tokens") else "hf"} | fields


def hf_names(message: str) -> str:
    """The config.json fields behind the ViTConfig fields a message names (each field's ``hf`` name)."""
    named = [about.hf for ours, about in FIELDS.items() if about.hf and re.search(rf"\b{ours}\b", message)]
    return f" (config.json's {', '.join(named)})" if named else ""


# --- weights ------------------------------------------------------------------------------------------------------


def _strip(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys without their backbone prefix (:data:`PREFIXES`); two keys that become one are an error."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        bare = next((key[len(p) :] for p in PREFIXES if key.startswith(p)), key)
        if bare in out:
            raise ValueError(f"{SOURCE} state dict holds {bare!r} twice, with and without a prefix ({key!r})")
        out[bare] = value
    return out


def from_architecture(
    state_dict: Mapping[str, torch.Tensor], config: ViTConfig, hf_arch: HFArchitecture
) -> dict[str, torch.Tensor]:
    """An HF state dict of ``hf_arch`` as ours for ``config``; every key and shape is checked first."""
    state_dict = _strip(check_state_dict(state_dict, SOURCE))
    state_dict = {k: v for k, v in state_dict.items() if not k.startswith(hf_arch.unused)}
    shapes = expected_shapes(conv_form(config))
    expected = hf_arch.layout.expected(shapes)
    fold = config.register_tokens and not config.pos_embed_prefix
    position = "embeddings.position_embeddings"
    if fold:  # HF's E_pos has the class token's row too
        expected[position] = torch.Size([1, shapes["patch_embed.pos_embed.weight"][1] + 1, config.dim])
    check_keys(state_dict, expected, SOURCE)
    if fold:
        pos = state_dict[position]
        state_dict["embeddings.cls_token"] = state_dict["embeddings.cls_token"] + pos[:, :1]
        state_dict[position] = pos[:, 1:]
    return convert_patchify(hf_arch.layout.move(state_dict, shapes, to_ours=True), config, "conv", config.patchify)


def to_architecture(
    state: Mapping[str, torch.Tensor], config: ViTConfig, hf_arch: HFArchitecture
) -> dict[str, torch.Tensor]:
    """Our state dict for ``config`` as ``hf_arch``'s keys (prefixed as transformers writes them)."""
    out = hf_arch.layout.from_ours(state, config)
    if config.register_tokens and not config.pos_embed_prefix:
        # our class token holds its position row already: HF adds a zero row to it, which changes no bit
        pos = out["embeddings.position_embeddings"]
        out["embeddings.position_embeddings"] = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)
    if "embeddings.mask_token" in hf_arch.unused:  # DINOv2's masked-image-modelling token, unused at inference
        out["embeddings.mask_token"] = torch.zeros(1, config.dim, dtype=out["embeddings.cls_token"].dtype)
    return {k if k.startswith(HEAD_ROOTS) else hf_arch.prefix + k: v for k, v in out.items()}


def target_architecture(config: ViTConfig) -> HFArchitecture:
    """The architecture that would hold a model of ``config``, by the option that tells the families apart."""
    if config.distill_token:
        return HF_ARCHITECTURES["DeiTForImageClassificationWithTeacher"]
    if not config.class_token:
        return HF_ARCHITECTURES["SiglipVisionModel"]
    if config.pre_norm:
        return HF_ARCHITECTURES["CLIPVisionModelWithProjection" if config.num_classes else "CLIPVisionModel"]
    if config.layer_scale is not None:
        return HF_ARCHITECTURES["Dinov2WithRegistersModel" if config.register_tokens else "Dinov2Model"]
    pooler_only = config.representation_size is not None and not config.num_classes
    return HF_ARCHITECTURES["ViTModel" if pooler_only else "ViTForImageClassification"]


def architecture_config(config: ViTConfig, hf_arch: HFArchitecture, names: list[str]) -> dict[str, Any]:
    """The config.json of ``hf_arch`` for ``config``; ``names`` label the classifier's outputs."""
    hf: dict[str, Any] = {
        "architectures": [hf_arch.architecture],
        "model_type": hf_arch.model_types[0],
        "hidden_size": config.dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.heads,
        "hidden_act": ACT_NAMES[config.act],
        "layer_norm_eps": config.layer_norm_eps,
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_channels,
    }
    if hf_arch.rules is CLIP_LAYOUT:  # CLIP and SigLIP
        hf |= {"intermediate_size": config.mlp_dim, "attention_dropout": config.attn_dropout}
        if hf_arch.architecture == "CLIPVisionModelWithProjection":
            hf["projection_dim"] = config.num_classes
        if hf_arch.architecture == "SiglipVisionModel":
            hf["vision_use_head"] = config.pool == "map"
        return hf
    hf |= {
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attn_dropout,
        "qkv_bias": True,
    }
    if hf_arch.model_types[0].startswith("dinov2"):
        return hf | {
            "mlp_ratio": config.mlp_dim // config.dim,
            "layerscale_value": config.layer_scale,
            "use_swiglu_ffn": False,
            **({"num_register_tokens": config.register_tokens} if config.register_tokens else {}),
        }
    hf |= {
        "intermediate_size": config.mlp_dim,
        "pooler_output_size": config.representation_size or config.dim,
        "pooler_act": "tanh",
    }
    if config.num_classes:
        hf |= {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}
    return hf
