"""The tiny models every test builds: one home for their sizes.

A test that needs another size derives it from one of these with overrides, and says why in a comment.
"""

from __future__ import annotations

from vit_einops import ViT

# The bundled 8x8 grey digits in 2x2 patches: 16 tokens and a class token, two blocks (so that layers are
# numbered), two heads. The size `vit-einops train` and the inspection tools' tests run on.
TINY_DIGITS = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=16, depth=2, heads=2, mlp_dim=32)

# RGB, as the libraries' ViTs are (torchvision, timm): 32x32 in 8x8 patches, 4 heads of 12, every part present.
TINY_RGB = dict(image_size=32, patch_size=8, dim=48, depth=2, heads=4, mlp_dim=96, num_classes=5)

# The model-API and error tests' RGB model: 16x16 in 4x4 patches (a 4x4 grid, 17 tokens), width 32 in 4 heads of 8.
TINY_RGB16 = dict(TINY_RGB, image_size=16, patch_size=4, dim=32, mlp_dim=64)

# The families' parts, each as options on one of the sizes above: every pooling and token layout, LayerScale, RoPE
# with SwiGLU and qk-norm.
FAMILIES = {
    "vit": {},
    "registers": dict(register_tokens=2, layer_scale=0.1),
    "distilled": dict(distill_token=True),
    "mean pool": dict(class_token=False, pool="mean", fc_norm=True),
    "attention pool": dict(class_token=False, pool="map"),
    "rope": dict(rope_grid=4, ffn="swiglu", qk_norm=True),
}


def tiny_vit(base: dict = TINY_DIGITS, **overrides) -> ViT:
    """A ViT of ``base``'s size with ``overrides``, in eval mode (inspection; ``train()`` sets its own mode)."""
    return ViT(**{**base, **overrides}).eval()


def model_flags(base: dict = TINY_DIGITS) -> list[str]:
    """``base``'s width and depth as `vit-einops train` flags (its image and patch size are the command's own on the
    digits)."""
    return [f"--{field.replace('_', '-')}={base[field]}" for field in ("dim", "depth", "heads", "mlp_dim")]
