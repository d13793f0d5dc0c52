"""Table 1 of the paper, plus the DeiT-sized Ti and S that every library also ships; also under timm's names, and
timm's ViT families (DINO, DINOv2, DeiT, DeiT III, CLIP, SigLIP, MAE) by their timm names.

Importing this module does not import torch (the command line reads the names for its --help); the model is
imported when a preset is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .preprocess import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, Preprocessing

if TYPE_CHECKING:
    from .model import ViT

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

# timm's model names for the same architectures: (our preset, image size). timm builds these with our defaults
# (class-token pooling, no fc_norm, LayerNorm eps 1e-6, 1000 classes), so only the image size differs; what
# timm's pretrained tags add (their mean/std, crop) is preprocessing, which travels with the weights.
TIMM_NAMES: dict[str, tuple[str, int]] = {
    "vit_tiny_patch16_224": ("vit_ti_16", 224),
    "vit_tiny_patch16_384": ("vit_ti_16", 384),
    "vit_small_patch16_224": ("vit_s_16", 224),
    "vit_small_patch16_384": ("vit_s_16", 384),
    "vit_small_patch32_224": ("vit_s_32", 224),
    "vit_small_patch32_384": ("vit_s_32", 384),
    "vit_base_patch16_224": ("vit_b_16", 224),
    "vit_base_patch16_384": ("vit_b_16", 384),
    "vit_base_patch32_224": ("vit_b_32", 224),
    "vit_base_patch32_384": ("vit_b_32", 384),
    "vit_large_patch16_224": ("vit_l_16", 224),
    "vit_large_patch16_384": ("vit_l_16", 384),
    "vit_large_patch32_224": ("vit_l_32", 224),
    "vit_large_patch32_384": ("vit_l_32", 384),
    "vit_huge_patch14_224": ("vit_h_14", 224),
}


# The widths of Table 1's Ti, S and B (D, L, h, MLP size), which timm's families share.
_TI, _S, _B = (
    {k: v for k, v in PRESETS[n].items() if k in ("dim", "depth", "heads", "mlp_dim")}
    for n in ("vit_ti_16", "vit_s_16", "vit_b_16")
)
_DINOV2 = {"patch_size": 14, "image_size": 518, "layer_scale": 1e-5, "num_classes": 0}  # 37 x 37 patches of 14
_REG4 = {"register_tokens": 4, "pos_embed_prefix": False}  # timm's reg_tokens=4, no_embed_class=True
_DEIT3 = {"layer_scale": 1e-6, "pos_embed_prefix": False}  # timm's init_values=1e-6, no_embed_class=True
_CLIP = {"pre_norm": True, "patch_bias": False, "layer_norm_eps": 1e-5}  # timm's pre_norm=True (no patch bias then)

# timm's ViT families: each name's ViTConfig fields, at its default pretrained tag's size and classes (timm 1.0's
# pretrained_cfg). The fields no tensor holds (heads, act, layer_norm_eps, image size, pooling, LayerScale's init)
# come from here when a state dict is loaded with arch=NAME; every other field is read off the tensors and must agree.
TIMM_ARCHS: dict[str, dict[str, Any]] = {
    name: {"image_size": 224, "patch_size": 16, "num_classes": 1000, **fields}
    for name, fields in {
        "vit_small_patch14_dinov2": {**_S, **_DINOV2},
        "vit_small_patch14_reg4_dinov2": {**_S, **_DINOV2, **_REG4},
        "vit_base_patch14_dinov2": {**_B, **_DINOV2},
        "vit_base_patch14_reg4_dinov2": {**_B, **_DINOV2, **_REG4},
        # DeiT's distilled models are timm.models.deit.VisionTransformerDistilled
        "deit_tiny_distilled_patch16_224": {**_TI, "distill_token": True},
        "deit_small_distilled_patch16_224": {**_S, "distill_token": True},
        "deit_base_distilled_patch16_224": {**_B, "distill_token": True},
        "deit3_small_patch16_224": {**_S, **_DEIT3},
        "deit3_base_patch16_224": {**_B, **_DEIT3},
        "vit_base_patch16_clip_224": {**_B, **_CLIP},
        "vit_base_patch16_clip_quickgelu_224": {**_B, **_CLIP, "act": "quick_gelu", "num_classes": 512},
        "vit_base_patch16_siglip_224": {**_B, "class_token": False, "pool": "map", "num_classes": 0},
    }.items()
}

# timm's pretrained tags ("name.tag") -> the classes of their head (pretrained_cfg num_classes; 0: no head). A name
# without a tag is its default tag (the first here, and the classes above).
TIMM_TAGS: dict[str, dict[str, int]] = {
    "vit_small_patch16_224": {"augreg_in21k_ft_in1k": 1000, "augreg_in1k": 1000, "augreg_in21k": 21843, "dino": 0},
    "vit_base_patch16_224": {
        "augreg2_in21k_ft_in1k": 1000,
        "augreg_in1k": 1000,
        "augreg_in21k": 21843,
        "augreg_in21k_ft_in1k": 1000,
        "dino": 0,
        "mae": 0,
        "orig_in21k": 0,
        "orig_in21k_ft_in1k": 1000,
        "sam_in1k": 1000,
    },
    **{name: {"lvd142m": 0} for name in TIMM_ARCHS if name.endswith("dinov2")},
    **{name: {"fb_in1k": 1000} for name in TIMM_ARCHS if name.startswith("deit_")},
    **{name: {"fb_in1k": 1000, "fb_in22k_ft_in1k": 1000} for name in TIMM_ARCHS if name.startswith("deit3_")},
    "vit_base_patch16_clip_224": {
        "laion2b_ft_in12k_in1k": 1000,
        "datacompxl": 512,
        "dfn2b": 512,
        "laion2b": 512,
        "laion2b_ft_in1k": 1000,
        "laion2b_ft_in12k": 11821,
        "laion400m_e32": 512,
        "metaclip_2pt5b": 512,
        "metaclip_400m": 512,
        "openai": 512,
        "openai_ft_in1k": 1000,
        "openai_ft_in12k": 11821,
        "openai_ft_in12k_in1k": 1000,
    },
    "vit_base_patch16_clip_quickgelu_224": {"metaclip_2pt5b": 512, "metaclip_400m": 512, "openai": 512},
    "vit_base_patch16_siglip_224": {"v2_webli": 0, "webli": 0},
}


def list_presets(*, timm_names: bool = False) -> list[str]:
    """Our preset names (torchvision's too: vit_b_16 ...), and with ``timm_names`` timm's after them (Table 1's
    ViTs, then the families of :data:`TIMM_ARCHS`)."""
    return [*PRESETS, *TIMM_NAMES, *TIMM_ARCHS] if timm_names else list(PRESETS)


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of preset ``name`` (ours, or timm's, "name" or "name.tag") with ``overrides`` applied."""
    if not isinstance(name, str):
        raise TypeError(f"a preset name is a str, got {name!r} of type {type(name).__name__}")
    if name in PRESETS:
        return {**PRESETS[name], **overrides}
    return {**timm_arch(name), **overrides}


def timm_arch(name: str) -> dict[str, Any]:
    """The ViTConfig fields of timm's model ``name`` ("vit_small_patch14_reg4_dinov2"), or of one of its pretrained
    tags ("vit_base_patch16_clip_224.openai": the tag sets the classes, as timm's pretrained_cfg)."""
    if not isinstance(name, str):
        raise TypeError(f"a timm model name is a str, got {name!r} of type {type(name).__name__}")
    base, dot, tag = name.partition(".")
    if base in TIMM_NAMES:
        preset, image_size = TIMM_NAMES[base]
        fields = {**PRESETS[preset], "image_size": image_size}
    elif base in TIMM_ARCHS:
        fields = dict(TIMM_ARCHS[base])
    else:
        import difflib

        close = difflib.get_close_matches(base, [*PRESETS, *TIMM_NAMES, *TIMM_ARCHS], n=4, cutoff=0.6)
        raise ValueError(
            f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}, or one of timm's names "
            f"{', '.join([*TIMM_NAMES, *TIMM_ARCHS])}" + (f"; close names: {', '.join(close)}" if close else "")
        )
    if dot:
        tags = TIMM_TAGS.get(base, {})
        if tag not in tags:
            known = ", ".join(f"{base}.{t}" for t in tags) or f"none: use {base}"
            raise ValueError(f"unknown timm pretrained tag {tag!r} of {base}; known tags: {known}")
        fields["num_classes"] = tags[tag]
    return fields


# timm's eval preprocessing of each family (its pretrained_cfg at the default tag: mean, std, crop_pct; bicubic for
# all), and the tags whose crop differs. A model of the family records it, so model.transforms() reads a photo as
# timm would for those weights, never with another family's mean and std.
_IMAGENET_NORM, _CLIP_NORM, _HALF_NORM = (IMAGENET_MEAN, IMAGENET_STD), (CLIP_MEAN, CLIP_STD), (INCEPTION_MEAN,) * 2
TIMM_PREPROCESSING: dict[str, tuple[tuple[tuple[float, ...], tuple[float, ...]], float]] = {
    **{name: (_IMAGENET_NORM, 1.0) for name in TIMM_ARCHS if name.endswith("dinov2")},
    **{name: (_IMAGENET_NORM, 0.9) for name in TIMM_ARCHS if name.startswith("deit")},
    "vit_base_patch16_clip_224": (_CLIP_NORM, 0.95),
    "vit_base_patch16_clip_224.openai": (_CLIP_NORM, 0.9),
    "vit_base_patch16_clip_quickgelu_224": (_CLIP_NORM, 1.0),
    "vit_base_patch16_siglip_224": (_HALF_NORM, 0.9),
    "vit_small_patch16_224.dino": (_IMAGENET_NORM, 0.9),
    "vit_base_patch16_224.dino": (_IMAGENET_NORM, 0.9),
    "vit_base_patch16_224.mae": (_IMAGENET_NORM, 0.9),
}


def timm_preprocessing(name: str, image_size: int | tuple[int, int] | None = None) -> Preprocessing | None:
    """timm's eval preprocessing for the family ``name`` ("name" or "name.tag", as :data:`TIMM_PREPROCESSING`),
    cropping to ``image_size`` (by default the name's); None for a name the table does not hold (the augreg ViTs
    keep :meth:`Preprocessing.timm`'s defaults)."""
    entry = TIMM_PREPROCESSING.get(name, TIMM_PREPROCESSING.get(name.partition(".")[0]))  # the tag's, else the name's
    if entry is None:
        return None
    (mean, std), crop_pct = entry
    size = image_size if image_size is not None else timm_arch(name)["image_size"]
    return Preprocessing.timm(size, crop_pct, mean=mean, std=std)


def create_vit(name: str, **overrides: Any) -> ViT:
    """Build preset ``name`` (see :func:`list_presets`; timm's names such as "vit_base_patch16_224" work too);
    any ViT keyword overrides it, e.g. num_classes=10. The architecture only: ``vit_einops.create_vit`` adds
    ``pretrained=True`` and ``weights=PATH``."""
    from .model import ViT

    if "pretrained" in overrides or "weights" in overrides:
        raise TypeError(
            "presets.create_vit builds the architecture only; for weights call vit_einops.create_vit "
            "(pretrained=True, or weights=PATH)"
        )

    model = ViT(**preset_config(name, **overrides))
    if name not in PRESETS:  # a timm family records timm's preprocessing for its weights, as its pretrained_cfg
        model.preprocessing = timm_preprocessing(name, model.config.image_size)
    return model
