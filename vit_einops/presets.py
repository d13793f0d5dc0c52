"""The named architectures: Table 1 of the paper (plus the DeiT-sized Ti and S that every library also ships), and
the registry of ViT families (:data:`FAMILIES`), each written once with its timm names, pretrained tags, their
preprocessing and hub repositories.

Importing this module does not import torch (the command line reads the names for its --help); the model is
imported when a preset is built.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .preprocess import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, Preprocessing

if TYPE_CHECKING:
    from .network.model import ViT

# (patch_size, dim D, depth L, heads h); the MLP size is 4D for all of them (Table 1).
_SIZES: dict[str, tuple[int, int, int, int]] = {
    "vit_ti_16": (16, 192, 12, 3),
    "vit_s_16": (16, 384, 12, 6),
    "vit_s_32": (32, 384, 12, 6),
    "vit_b_16": (16, 768, 12, 12),
    "vit_b_32": (32, 768, 12, 12),
    "vit_l_16": (16, 1024, 24, 16),
    "vit_l_32": (32, 1024, 24, 16),
    "vit_h_14": (14, 1280, 32, 16),
}

PRESETS: dict[str, dict[str, Any]] = {
    name: dict(image_size=224, patch_size=p, dim=d, depth=depth, heads=h, mlp_dim=4 * d, num_classes=1000)
    for name, (p, d, depth, h) in _SIZES.items()
}

Norm = tuple[tuple[float, ...], tuple[float, ...]]
_IMAGENET: Norm = (IMAGENET_MEAN, IMAGENET_STD)
_CLIP: Norm = (CLIP_MEAN, CLIP_STD)
_HALF: Norm = (INCEPTION_MEAN, INCEPTION_MEAN)


@dataclass(frozen=True)
class Family:
    """One ViT family as timm publishes it, written once.

    Args:
        name: our name for it ("dinov2").
        cite: the paper, for the docs' tables.
        members: timm's model names -> their ViTConfig fields at the default tag's size (timm 1.0's pretrained_cfg;
            the classes are the default tag's). The fields no tensor holds (heads, act, layer_norm_eps, image size,
            pooling, LayerScale's init, RoPE) come from here when a timm file of that name is read.
        tags: each member's pretrained tags -> the classes of their head (0: none), timm's default tag first. A tag
            of another family's member makes that name.tag this family's (DINO and MAE are tags of timm's plain
            ViTs).
        norm: the mean and std of its eval preprocessing (bicubic, timm's).
        crop_pct: timm's crop_pct; ``tag_crops`` maps each tag whose crop differs to its own.
        hub_repos: members whose weights sit in another name's hub repository (timm's hf_hub_id).
        hf: the Hugging Face transformers architectures that hold the family -> the image processor transformers
            pairs with each (AutoImageProcessor's table; ``convert --to hf`` writes its preprocessor_config.json).
        projections: the tags whose head is not a classifier but the projection into a joint image-text embedding
            (CLIP's image tower: timm stores it as the head of num_classes outputs); their models output that
            embedding (ViTConfig.embedding) and are studied as backbones.
    """

    name: str
    cite: str
    members: Mapping[str, Mapping[str, Any]]
    tags: Mapping[str, Mapping[str, int]]
    norm: Norm
    crop_pct: float = 0.9
    tag_crops: Mapping[str, float] = field(default_factory=dict)
    hub_repos: Mapping[str, str] = field(default_factory=dict)
    hf: Mapping[str, str] = field(default_factory=dict)
    projections: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        heads = {tag: classes for tags in self.tags.values() for tag, classes in tags.items()}
        stray = [tag for tag in self.projections if not heads.get(tag)]
        if stray:
            raise ValueError(f"family {self.name}: projections {stray} are not tags of it with a head")

    def crop(self, tag: str) -> float:
        return self.tag_crops.get(tag, self.crop_pct)


def _widths(preset: str) -> dict[str, Any]:
    return {k: v for k, v in PRESETS[preset].items() if k in ("patch_size", "dim", "depth", "heads", "mlp_dim")}


_TI, _S, _B = _widths("vit_ti_16"), _widths("vit_s_16"), _widths("vit_b_16")


def _plain(preset: str, size: int) -> dict[str, Any]:
    return {**PRESETS[preset], "image_size": size}


_AUGREG = {"augreg_in21k_ft_in1k": 1000}
_DINOV2 = {"patch_size": 14, "image_size": 518, "layer_scale": 1e-5}  # 37 x 37 patches of 14
_REG4 = {"register_tokens": 4, "pos_embed_prefix": False}  # timm's reg_tokens=4, no_embed_class=True
_DEIT3 = {"layer_scale": 1e-6, "pos_embed_prefix": False}  # timm's init_values=1e-6, no_embed_class=True
_CLIP_OPTS = {"pre_norm": True, "patch_bias": False, "layer_norm_eps": 1e-5}  # timm's pre_norm=True (no patch bias)
_CLIP_TAGS = {
    "laion2b_ft_in12k_in1k": 1000, "datacompxl": 512, "dfn2b": 512, "laion2b": 512, "laion2b_ft_in1k": 1000,
    "laion2b_ft_in12k": 11821, "laion400m_e32": 512, "metaclip_2pt5b": 512, "metaclip_400m": 512, "openai": 512,
    "openai_ft_in1k": 1000, "openai_ft_in12k": 11821, "openai_ft_in12k_in1k": 1000,
}  # fmt: skip

# Table 1's ViTs under timm's names: timm builds them with our defaults (class-token pooling, no fc_norm, LayerNorm
# eps 1e-6), so only the image size differs (and the crop: 1.0 at 384 px).
_VIT_NAMES = (("tiny", 16, "vit_ti_16"), ("small", 16, "vit_s_16"), ("small", 32, "vit_s_32"), ("base", 16, "vit_b_16"),
              ("base", 32, "vit_b_32"), ("large", 16, "vit_l_16"), ("large", 32, "vit_l_32"))  # fmt: skip
_VIT_MEMBERS = {f"vit_{size}_patch{p}_224": _plain(preset, 224) for size, p, preset in _VIT_NAMES}
_VIT_MEMBERS["vit_huge_patch14_224"] = _plain("vit_h_14", 224)
_VIT_384 = {f"vit_{size}_patch{p}_384": _plain(preset, 384) for size, p, preset in _VIT_NAMES}
_VIT_TAGS = {
    "vit_tiny_patch16_224": _AUGREG, "vit_tiny_patch16_384": _AUGREG,
    "vit_small_patch16_224": {**_AUGREG, "augreg_in1k": 1000, "augreg_in21k": 21843},
    "vit_small_patch16_384": _AUGREG, "vit_small_patch32_224": _AUGREG, "vit_small_patch32_384": _AUGREG,
    "vit_base_patch16_224": {
        "augreg2_in21k_ft_in1k": 1000, "augreg_in1k": 1000, "augreg_in21k": 21843, "augreg_in21k_ft_in1k": 1000,
        "orig_in21k": 0, "orig_in21k_ft_in1k": 1000, "sam_in1k": 1000,
    },
    "vit_base_patch16_384": _AUGREG, "vit_base_patch32_224": _AUGREG, "vit_base_patch32_384": _AUGREG,
    "vit_large_patch16_224": _AUGREG, "vit_large_patch16_384": _AUGREG,
    "vit_large_patch32_224": {"orig_in21k": 0}, "vit_large_patch32_384": {"orig_in21k_ft_in1k": 1000},
    "vit_huge_patch14_224": {"orig_in21k": 0},
}  # fmt: skip

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # Table 1's ViTs under timm's names: timm builds them with our defaults (class-token pooling, no fc_norm,
        # LayerNorm eps 1e-6), so only the image size differs; crop_pct 1.0 at 384 px.
        Family("vit", "Dosovitskiy et al. 2021", members=_VIT_MEMBERS, norm=_HALF,
               tags={name: _VIT_TAGS[name] for name in _VIT_MEMBERS},
               hf={"ViTForImageClassification": "ViTImageProcessor", "ViTModel": "ViTImageProcessor",
                   "DeiTForImageClassification": "DeiTImageProcessor", "DeiTModel": "DeiTImageProcessor"}),
        Family("vit_384", "Dosovitskiy et al. 2021, fine-tuned at 384 px", members=_VIT_384, norm=_HALF, crop_pct=1.0,
               tags={name: _VIT_TAGS[name] for name in _VIT_384}),
        Family("dino", "Caron et al. 2021", members={}, norm=_IMAGENET,
               tags={"vit_small_patch16_224": {"dino": 0}, "vit_base_patch16_224": {"dino": 0}}),
        Family("mae", "He et al. 2022", members={}, norm=_IMAGENET, tags={"vit_base_patch16_224": {"mae": 0}}),
        Family(
            "dinov2", "Oquab et al. 2024", norm=_IMAGENET, crop_pct=1.0,
            members={"vit_small_patch14_dinov2": {**_S, **_DINOV2}, "vit_base_patch14_dinov2": {**_B, **_DINOV2}},
            tags={"vit_small_patch14_dinov2": {"lvd142m": 0}, "vit_base_patch14_dinov2": {"lvd142m": 0}},
            hf={"Dinov2Model": "BitImageProcessor"},
        ),
        Family(
            "dinov2_reg", "Darcet et al. 2024", norm=_IMAGENET, crop_pct=1.0,
            members={"vit_small_patch14_reg4_dinov2": {**_S, **_DINOV2, **_REG4},
                     "vit_base_patch14_reg4_dinov2": {**_B, **_DINOV2, **_REG4}},
            tags={"vit_small_patch14_reg4_dinov2": {"lvd142m": 0}, "vit_base_patch14_reg4_dinov2": {"lvd142m": 0}},
            hf={"Dinov2WithRegistersModel": "BitImageProcessor"},
        ),
        # DeiT's distilled models are timm.models.deit.VisionTransformerDistilled
        Family(
            "deit", "Touvron et al. 2021", norm=_IMAGENET,
            members={f"deit_{s}_distilled_patch16_224": {**w, "distill_token": True}
                     for s, w in (("tiny", _TI), ("small", _S), ("base", _B))},
            tags={f"deit_{s}_distilled_patch16_224": {"fb_in1k": 1000} for s in ("tiny", "small", "base")},
            hf={"DeiTForImageClassificationWithTeacher": "DeiTImageProcessor"},
        ),
        Family(
            "deit3", "Touvron et al. 2022", norm=_IMAGENET,
            members={"deit3_small_patch16_224": {**_S, **_DEIT3}, "deit3_base_patch16_224": {**_B, **_DEIT3}},
            tags={f"deit3_{s}_patch16_224": {"fb_in1k": 1000, "fb_in22k_ft_in1k": 1000} for s in ("small", "base")},
            tag_crops={"fb_in22k_ft_in1k": 1.0},
        ),
        Family(
            "clip", "Radford et al. 2021", norm=_CLIP, crop_pct=0.95,
            members={"vit_base_patch16_clip_224": {**_B, **_CLIP_OPTS}},
            tags={"vit_base_patch16_clip_224": _CLIP_TAGS},
            hf={"CLIPVisionModel": "CLIPImageProcessor", "CLIPVisionModelWithProjection": "CLIPImageProcessor"},
            projections=("datacompxl", "dfn2b", "laion2b", "laion400m_e32", "metaclip_2pt5b", "metaclip_400m",
                         "openai"),
            tag_crops={tag: 1.0 for tag in ("datacompxl", "dfn2b", "laion2b", "laion2b_ft_in1k", "laion400m_e32",
                                            "metaclip_2pt5b", "metaclip_400m")}
            | {tag: 0.9 for tag in ("laion2b_ft_in12k", "openai", "openai_ft_in1k", "openai_ft_in12k")},
        ),
        Family(
            "clip_quickgelu", "Radford et al. 2021 (OpenAI's QuickGELU)", norm=_CLIP, crop_pct=1.0,
            tag_crops={"openai": 0.9},
            members={"vit_base_patch16_clip_quickgelu_224": {**_B, **_CLIP_OPTS, "act": "quick_gelu"}},
            tags={"vit_base_patch16_clip_quickgelu_224": {"metaclip_2pt5b": 512, "metaclip_400m": 512, "openai": 512}},
            hub_repos={"vit_base_patch16_clip_quickgelu_224": "vit_base_patch16_clip_224"},
            projections=("metaclip_2pt5b", "metaclip_400m", "openai"),
        ),
        # timm's Eva: q and v biases, SwiGLU MLP (2/3 of 4D wide), RoPE on the patches beside E_pos, mean pooling
        Family(
            "eva02", "Fang et al. 2024", norm=_CLIP,
            members={f"eva02_{s}_patch14_224": {**w, "patch_size": 14, "mlp_dim": w["dim"] * 8 // 3, "ffn": "swiglu",
                                                 "qkv_bias": "qv", "rope_grid": 16, "pool": "mean", "fc_norm": True}
                     for s, w in (("tiny", _TI), ("small", _S))},
            tags={f"eva02_{s}_patch14_224": {"mim_in22k": 0} for s in ("tiny", "small")},
        ),
        Family(
            "siglip", "Zhai et al. 2023", norm=_HALF,
            members={"vit_base_patch16_siglip_224": {**_B, "class_token": False, "pool": "map"}},
            tags={"vit_base_patch16_siglip_224": {"v2_webli": 0, "webli": 0}},
            hf={"SiglipVisionModel": "SiglipImageProcessor"},
        ),
    )
}  # fmt: skip


def _head(family: Family, tag: str, classes: int) -> dict[str, Any]:
    """The head's fields of a tag: its classes, and ``embedding`` for a projection (left out for a classifier)."""
    return {"num_classes": classes, **({"embedding": True} if tag in family.projections else {})}


# timm's model names -> their ViTConfig fields, derived from FAMILIES: every family's members, with the head of
# their default tag (what timm.create_model(name) builds).
TIMM_ARCHS: dict[str, dict[str, Any]] = {
    name: {"image_size": 224, "patch_size": 16, **fields, **_head(family, *next(iter(family.tags[name].items())))}
    for family in FAMILIES.values()
    for name, fields in family.members.items()
}


def family_of(name: str) -> Family:
    """The family of timm's "name" or "name.tag": the one whose tags hold the tag, else the one listing the name."""
    base, _, tag = name.partition(".")
    family = _listing(base)
    if tag:
        family = next((f for f in FAMILIES.values() if tag in f.tags.get(base, {})), family)
    return family


def tags_of(name: str) -> dict[str, int]:
    """Every pretrained tag of timm's untagged ``name`` -> its classes, in every family; timm's default first."""
    return {tag: classes for family in FAMILIES.values() for tag, classes in family.tags.get(name, {}).items()}


# Each Hugging Face architecture a family holds -> its image processor (every family's ``hf``).
HF_PROCESSORS: dict[str, str] = {arch: proc for family in FAMILIES.values() for arch, proc in family.hf.items()}


def family_table() -> str:
    """The registry as the Markdown table docs/models.md holds (a test keeps the two equal): each family, its paper,
    timm names, pretrained tags (timm's default first; in italics those whose head is an embedding projection),
    eval normalisation and crop, and the transformers classes."""
    norms = {_IMAGENET: "ImageNet", _CLIP: "CLIP", _HALF: "0.5"}
    rows = ["| family | paper | timm names | tags | mean/std, crop_pct | Hugging Face |", "|---|---|---|---|---|---|"]
    for f in FAMILIES.values():
        names = ", ".join(f"`{n}`" for n in f.members) or f"tags of {', '.join(f'`{n}`' for n in f.tags)}"
        listed = dict.fromkeys(t for tags in f.tags.values() for t in tags)
        tags = ", ".join(f"*{t}*" if t in f.projections else t for t in listed)
        hf = ", ".join(f"`{a}`" for a in f.hf) or "none"
        rows.append(f"| {f.name} | {f.cite} | {names} | {tags} | {norms[f.norm]}, {f.crop_pct:g} | {hf} |")
    return "\n".join(rows)


def list_presets(*, timm_names: bool = False) -> list[str]:
    """Our preset names (torchvision's too: vit_b_16 ...), and with ``timm_names`` timm's after them (Table 1's
    ViTs, then the families of :data:`FAMILIES`)."""
    return [*PRESETS, *TIMM_ARCHS] if timm_names else list(PRESETS)


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of preset ``name`` (ours, or timm's, "name" or "name.tag") with ``overrides`` applied;
    ``num_classes`` there is a new classifier, not the tag's projection (unless ``embedding`` says so too)."""
    if not isinstance(name, str):
        raise TypeError(f"a preset name is a str, got {name!r} of type {type(name).__name__}")
    if name in PRESETS:
        return {**PRESETS[name], **overrides}
    fields = timm_arch(name)
    if "num_classes" in overrides:
        fields.pop("embedding", None)
    return {**fields, **overrides}


def _listing(base: str) -> Family:
    """The family that lists timm's name ``base`` among its members."""
    _check_timm_name(base)
    return next(f for f in FAMILIES.values() if base in f.members)


def _check_timm_name(base: str) -> None:
    if base not in TIMM_ARCHS:
        close = difflib.get_close_matches(base, [*PRESETS, *TIMM_ARCHS], n=4, cutoff=0.6)
        raise ValueError(
            f"unknown preset {base!r}; expected one of {', '.join(PRESETS)}, or one of timm's names "
            f"{', '.join(TIMM_ARCHS)}" + (f"; close names: {', '.join(close)}" if close else "")
        )


def timm_arch(name: str) -> dict[str, Any]:
    """The ViTConfig fields of timm's model ``name`` ("vit_small_patch14_reg4_dinov2"), or of one of its pretrained
    tags ("vit_base_patch16_clip_224.openai": the tag sets the classes, as timm's pretrained_cfg, and whether they
    are an embedding projection: the family's ``projections``)."""
    if not isinstance(name, str):
        raise TypeError(f"a timm model name is a str, got {name!r} of type {type(name).__name__}")
    base, dot, tag = name.partition(".")
    _check_timm_name(base)
    fields = dict(TIMM_ARCHS[base])
    if dot:
        tags = tags_of(base)
        if tag not in tags:
            known = ", ".join(f"{base}.{t}" for t in tags) or f"none: use {base}"
            raise ValueError(f"unknown timm pretrained tag {tag!r} of {base}; known tags: {known}")
        fields.pop("embedding", None)
        fields |= _head(family_of(name), tag, tags[tag])
    return fields


def embedding_of(name: str, num_classes: int) -> bool:
    """Whether a head of ``num_classes`` outputs on timm's ``name`` is an embedding projection (ViTConfig.embedding),
    as the registry says: for "name.tag" the tag's say; for the name alone, that of its tags with that many outputs
    where they all say it (CLIP's 512-wide tags are all projections). No head is no projection."""
    base, dot, tag = name.partition(".")
    if not num_classes:
        return False
    if dot:
        return tag in family_of(name).projections
    tags = [(f"{base}.{t}", classes) for t, classes in tags_of(base).items() if classes == num_classes]
    return bool(tags) and all(embedding_of(tagged, classes) for tagged, classes in tags)


def default_tag(name: str) -> str:
    """timm's default pretrained tag of ``name`` (the first its family lists)."""
    return next(iter(_listing(name).tags[name]))


def timm_preprocessing(name: str, image_size: int | tuple[int, int] | None = None) -> Preprocessing:
    """timm's eval preprocessing for ``name`` ("name" at its default tag, or "name.tag"), cropping to
    ``image_size`` (by default the name's): its family's mean and std, and the tag's crop_pct, bicubic."""
    base, _, tag = name.partition(".")
    family = family_of(name)
    size = image_size if image_size is not None else timm_arch(name)["image_size"]
    crop_pct = family.crop(tag or default_tag(base))
    return Preprocessing.timm(size, crop_pct, mean=family.norm[0], std=family.norm[1])


def create_architecture(name: str, **overrides: Any) -> ViT:
    """Build preset ``name`` (see :func:`list_presets`; timm's names such as "vit_base_patch16_224" work too);
    any ViT keyword overrides it, e.g. num_classes=10. The architecture only: ``vit_einops.create_vit`` adds
    ``pretrained=True`` and ``weights=PATH``."""
    from .network.model import ViT

    if "pretrained" in overrides or "weights" in overrides:
        raise TypeError(
            "presets.create_architecture builds the architecture only; for weights call vit_einops.create_vit "
            "(pretrained=True, or weights=PATH)"
        )

    model = ViT(**preset_config(name, **overrides))
    if name not in PRESETS:  # a timm name records timm's preprocessing for its weights, as its pretrained_cfg
        model.preprocessing = timm_preprocessing(name, model.config.image_size)
    return model
