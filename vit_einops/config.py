"""The one configuration of a ViT, validated once at construction (SPEC.md, Table 1)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ._checks import check_choice, check_nonnegative_int, check_positive_int, check_probability, to_pair

ATTN_IMPLS = ("einsum", "chunked", "sdpa")
POOLS = ("cls", "mean")
PATCHIFY = ("conv", "linear")


@dataclass
class ViTConfig:
    # Defaults are ViT-B/16 at 224 px with the 1000 ImageNet classes (Table 1).
    image_size: int | tuple[int, int] = 224  # H, W; an int means square
    patch_size: int | tuple[int, int] = 16  # P; an int means square patches
    in_channels: int = 3  # C
    num_classes: int = 1000  # K; 0 means no classifier, the head returns the pooled features
    dim: int = 768  # D, the hidden size
    depth: int = 12  # L, the number of encoder blocks
    heads: int = 12  # h; D_h = D / h
    mlp_dim: int = 3072  # Table 1 "MLP size", 4D for every preset
    dropout: float = 0.0  # Appendix B.1: 0.1 for ImageNet runs, 0 for JFT pre-training
    attn_dropout: float = 0.0  # dropout on the attention matrix A (not in the paper; timm's attn_drop)
    pool: str = "cls"  # "cls": Eq. 4 reads z_L^0; "mean": average of the patch tokens
    attn_impl: str = (
        "einsum"  # "einsum": Eq. 6 written out; "chunked": the same per block of queries; "sdpa": torch's fused kernel
    )
    patchify: str = "conv"  # "conv": Conv2d(k=s=P); "linear": einops patches times E (Eq. 1 literally)
    representation_size: int | None = None  # the pre-training head's hidden layer (tanh), None at fine-tuning
    fc_norm: bool = False  # final LayerNorm after pooling (timm's fc_norm) rather than on every token before it
    layer_norm_eps: float = 1e-6  # torchvision and timm; torch's default 1e-5 would not load their weights exactly

    def __post_init__(self) -> None:
        self.image_size = to_pair("image_size", self.image_size)
        self.patch_size = to_pair("patch_size", self.patch_size)
        for size, patch, axis in zip(self.image_size, self.patch_size, ("height", "width")):
            if size % patch:
                raise ValueError(
                    f"image {axis} {size} is not divisible by patch {axis} {patch} "
                    f"(image_size {self.image_size}, patch_size {self.patch_size})"
                )
        for name in ("in_channels", "dim", "depth", "heads", "mlp_dim"):
            check_positive_int(name, getattr(self, name))
        check_nonnegative_int("num_classes", self.num_classes)  # 0: no classifier, the head returns features
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}")
        check_probability("dropout", self.dropout)
        check_probability("attn_dropout", self.attn_dropout)
        check_choice("pool", self.pool, POOLS)
        check_choice("attn_impl", self.attn_impl, ATTN_IMPLS)
        check_choice("patchify", self.patchify, PATCHIFY)
        if not isinstance(self.fc_norm, bool):
            raise TypeError(f"fc_norm must be a bool, got {self.fc_norm!r}")
        if self.representation_size is not None:
            check_positive_int("representation_size", self.representation_size)
        if (
            isinstance(self.layer_norm_eps, bool)
            or not isinstance(self.layer_norm_eps, (int, float))
            or self.layer_norm_eps <= 0
        ):
            raise ValueError(f"layer_norm_eps must be a positive float, got {self.layer_norm_eps!r}")

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patches along height and width."""
        return (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])

    @property
    def num_patches(self) -> int:
        """N' = HW / P^2."""
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        """N = N' + 1, the class token included."""
        return self.num_patches + 1

    @property
    def head_dim(self) -> int:
        """D_h = D / h."""
        return self.dim // self.heads

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: pairs become lists."""
        d = asdict(self)
        d["image_size"], d["patch_size"] = list(self.image_size), list(self.patch_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ViTConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ViTConfig fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**d)
