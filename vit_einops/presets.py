"""Table 1 of the paper, plus the DeiT-sized Ti and S that every library also ships."""

from __future__ import annotations

from typing import Any

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


def list_presets() -> list[str]:
    return list(PRESETS)


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of preset ``name`` with ``overrides`` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    return {**PRESETS[name], **overrides}


def create_vit(name: str, **overrides: Any) -> ViT:
    """Build preset ``name`` (see :func:`list_presets`); any ViT keyword overrides it, e.g. num_classes=10."""
    return ViT(**preset_config(name, **overrides))
