"""Table 1 of the paper, plus the DeiT-sized Ti and S that every library also ships; also under timm's names.

Importing this module does not import torch (the command line reads the names for its --help); the model is
imported when a preset is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def list_presets(*, timm_names: bool = False) -> list[str]:
    """Our preset names (torchvision's too: vit_b_16 ...), and with ``timm_names`` timm's after them."""
    return [*PRESETS, *TIMM_NAMES] if timm_names else list(PRESETS)


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of preset ``name`` (ours or timm's) with ``overrides`` applied."""
    if not isinstance(name, str):
        raise TypeError(f"a preset name is a str, got {name!r} of type {type(name).__name__}")
    if name in TIMM_NAMES:
        preset, image_size = TIMM_NAMES[name]
        return {**PRESETS[preset], "image_size": image_size, **overrides}
    if name not in PRESETS:
        raise ValueError(
            f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}, "
            f"or one of timm's names {', '.join(TIMM_NAMES)}"
        )
    return {**PRESETS[name], **overrides}


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

    return ViT(**preset_config(name, **overrides))
