"""The one configuration of a ViT, validated once at construction (the paper's Table 1 sizes by default)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ._budget import check_memory
from ._checks import (
    MAX_SIZE,
    check_bool,
    check_choice,
    check_heads,
    check_patch_grid,
    check_positive_float,
    check_probability,
    check_size,
    show_int,
)

# The attention paths a model can run (runtime state, not architecture: ViT(attn_impl=...), model.set_attn_impl).
ATTN_IMPLS = ("einsum", "chunked", "sdpa")
POOLS = ("cls", "mean", "map")
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")
# How a model with dynamic_size resamples E_pos for another input size: the library whose numbers it reproduces.
DYNAMIC_SIZES = ("timm", "hf")
PATCHIFY = ("conv", "linear")
# Configs written before the attention path became runtime state list it among their fields; a stored config that
# does still loads, and its model starts on that impl (vit_einops.attention.stored_attn_impl).
FORMER_FIELDS = ("attn_impl",)
# float32's largest value and its smallest positive one (a subnormal): the weights' dtype. A layer_scale past the
# first is inf in the model, one under the second 0; a layer_norm_eps under it adds nothing to the variance.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45
# What naming one register token costs Python ("reg123", its tuple slot), for the budget of prefix_tokens.
NAME_BYTES = 72


@dataclass(frozen=True)
class ViTConfig:
    """Every hyper-parameter of a :class:`~vit_einops.ViT`, validated here once: the modules read it and check
    nothing again. Frozen, so a config in hand cannot drift from the model it describes (``model.config`` reports
    what the model's own methods changed since it was built).

    Which attention kernel runs is not part of it: that is a choice about running the model (``ViT(attn_impl=...)``,
    ``model.set_attn_impl``), as timm keeps its fused flag out of its model config.

    Change a copy with ``dataclasses.replace(config, num_classes=10)``, or the model with its own methods
    (``reset_classifier``).
    """

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
    patchify: str = "conv"  # "conv": Conv2d(k=s=P); "linear": einops patches times E (Eq. 1 literally)
    representation_size: int | None = None  # the pre-training head's hidden layer (tanh), None at fine-tuning
    fc_norm: bool = False  # final LayerNorm after pooling (timm's fc_norm) rather than on every token before it
    layer_norm_eps: float = 1e-6  # torchvision and timm; torch's default 1e-5 would not load their weights exactly
    layer_scale: float | None = None  # LayerScale's initial gamma in each residual branch (timm's init_values;
    # DINOv2 1e-5, DeiT III 1e-6), None for none (the paper)
    register_tokens: int = 0  # learned tokens after the class token, before the patches (Darcet et al. 2024: 4)
    pos_embed_prefix: bool = True  # E_pos covers the class (and register) tokens (the paper); False adds positions
    # to the patches only, then prepends the prefix tokens (timm's no_embed_class: DINOv2 with registers, DeiT III)
    class_token: bool = True  # x_class of Eq. 1; False (SigLIP) leaves the patches alone, pooled by "mean" or "map"
    distill_token: bool = False  # DeiT's distillation token after the class token, read by a second classifier
    # ``head.fc_dist``; the two classifiers' logits are averaged (Touvron et al. 2021, timm and HF at inference)
    pre_norm: bool = False  # a LayerNorm on z_0 before the first block (CLIP's ln_pre, timm's norm_pre)
    patch_bias: bool = True  # the patch projection's bias (CLIP has none)
    act: str = "gelu"  # the MLP's nonlinearity: "gelu" (exact, the paper), "gelu_tanh" (SigLIP's HF config),
    # "quick_gelu" (x * sigmoid(1.702 x), OpenAI's CLIP)
    qk_norm: bool = False  # a LayerNorm over D_h on every head's q and k before Eq. 6 (timm's qk_norm)
    head_bias: bool = True  # the classifier's bias; CLIP's projection to the joint embedding has none
    dynamic_size: str | None = None  # None: inputs must be image_size; "timm" or "hf": any multiple of the patch
    # size, E_pos resampled at forward as that library does (timm's dynamic_img_size, HF's interpolate_pos_encoding)

    def __post_init__(self) -> None:
        # Frozen: normalised values are stored with object.__setattr__, once, here.
        def store(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        image_size, patch_size = check_patch_grid(self.image_size, self.patch_size)
        store("image_size", image_size)
        store("patch_size", patch_size)
        for name in ("in_channels", "dim", "depth", "heads", "mlp_dim"):
            store(name, check_size(name, getattr(self, name)))
        store("num_classes", check_size("num_classes", self.num_classes, positive=False))  # 0: the head gives features
        check_heads(self.dim, self.heads)
        store("dropout", check_probability("dropout", self.dropout))
        store("attn_dropout", check_probability("attn_dropout", self.attn_dropout))
        check_choice("pool", self.pool, POOLS)
        check_choice("patchify", self.patchify, PATCHIFY)
        check_bool("fc_norm", self.fc_norm)
        if self.representation_size is not None:
            store("representation_size", check_size("representation_size", self.representation_size))
        store("layer_norm_eps", check_float32("layer_norm_eps", self.layer_norm_eps))
        if self.layer_scale is not None:
            store("layer_scale", check_float32("layer_scale", self.layer_scale))
        store("register_tokens", check_size("register_tokens", self.register_tokens, positive=False))
        if self.num_tokens > MAX_SIZE:
            raise ValueError(
                f"the tokens must be at most 2**63 - 1 (torch's sizes are int64), got {show_int(self.num_tokens)} "
                f"from image_size {self.image_size}, patch_size {self.patch_size} and register_tokens "
                f"{self.register_tokens}"
            )
        flags = ("pos_embed_prefix", "class_token", "distill_token", "pre_norm", "patch_bias", "qk_norm", "head_bias")
        for name in flags:
            check_bool(name, getattr(self, name))
        check_choice("act", self.act, ACTIVATIONS)
        if self.dynamic_size is not None:
            check_choice("dynamic_size", self.dynamic_size, DYNAMIC_SIZES)
        self._check_combinations()

    def _check_combinations(self) -> None:
        """The options that only make sense together, as timm and HF build them."""
        if not self.class_token and self.pool == "cls":
            raise ValueError('pool "cls" reads the class token, but class_token is False; use pool "mean" or "map"')
        if self.distill_token:
            if not self.class_token or self.pool != "cls":
                raise ValueError(
                    f'distill_token needs the class token and pool "cls" (DeiT reads both tokens), got class_token '
                    f"{self.class_token}, pool {self.pool!r}"
                )
            if self.fc_norm or self.representation_size is not None:
                raise ValueError("distill_token has no fc_norm or representation_size (DeiT's heads are plain Linears)")
        if self.pool == "map" and (self.fc_norm or self.representation_size is not None):
            raise ValueError('pool "map" (attention pooling) has no fc_norm or representation_size, as in timm')

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patches along height and width."""
        return (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])

    @property
    def num_patches(self) -> int:
        """N' = HW / P^2."""
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class, distillation and register tokens (timm's name)."""
        return self.class_token + self.distill_token + self.register_tokens

    @property
    def prefix_tokens(self) -> tuple[str, ...]:
        """The names of the tokens before the patches, in order: "cls" (the class token), "dist" (DeiT's
        distillation token), then "reg1".."regR" (the register tokens); the tools label those rows and columns of A
        with them. Empty for a model without a class token (SigLIP). Made on each call, one name per register
        within the memory budget: every count (:attr:`num_prefix_tokens`, :attr:`num_tokens`) is arithmetic."""
        if self.register_tokens:
            check_memory(self.register_tokens * NAME_BYTES, f"naming {self.register_tokens:,} register tokens")
        named = ("cls",) * self.class_token + ("dist",) * self.distill_token
        return named + tuple(f"reg{i + 1}" for i in range(self.register_tokens))

    @property
    def num_tokens(self) -> int:
        """N = N' + the prefix tokens (1 in the paper), the tokens the encoder sees."""
        return self.num_patches + self.num_prefix_tokens

    @property
    def num_pos_tokens(self) -> int:
        """Rows of E_pos: every token, or the patches alone when ``pos_embed_prefix`` is False."""
        return self.num_tokens if self.pos_embed_prefix else self.num_patches

    def beyond_paper(self) -> list[str]:
        """The options set here that the 2021 paper's ViT lacks (LayerScale, registers, positions for the patches
        only, ...: :data:`BEYOND_PAPER`), each as "field value"; empty for the paper's architecture. Formats and
        tools that know only that architecture refuse a config with any of them."""
        # dynamic_size is how a forward treats other input sizes, not architecture: every format holds such a model.
        found = [
            f"{name} {getattr(self, name)}"
            for name, plain in BEYOND_PAPER.items()
            if getattr(self, name) != plain and name != "dynamic_size"
        ]
        return found + (["pool 'map'"] if self.pool == "map" else [])

    @property
    def head_dim(self) -> int:
        """D_h = D / h."""
        return self.dim // self.heads

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name the config does not have: say where a former field went.
        if name in FORMER_FIELDS:
            raise AttributeError(f"ViTConfig has no {name}: {MOVED}; read model.{name}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists. The options beyond the paper are left out at their plain values, so a
        paper ViT's config (and the files holding it) reads as it did before those options existed."""
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
            if not (k in BEYOND_PAPER and v == BEYOND_PAPER[k])
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ViTConfig:
        """The config of :meth:`to_dict`'s mapping; a former field (``attn_impl``) is skipped."""
        if not isinstance(d, Mapping):
            raise TypeError(f"a ViTConfig is read from a mapping of its fields, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known - set(FORMER_FIELDS), key=str)
        if unknown:
            raise ValueError(f"unknown ViTConfig fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})


# The fields of options the 2021 paper's ViT lacks, each with the value that leaves it out.
BEYOND_PAPER: dict[str, Any] = {
    "layer_scale": None,
    "register_tokens": 0,
    "pos_embed_prefix": True,
    "class_token": True,
    "distill_token": False,
    "pre_norm": False,
    "patch_bias": True,
    "act": "gelu",
    "qk_norm": False,
    "head_bias": True,
    "dynamic_size": None,
}

MOVED = (
    "the attention path is runtime state, not architecture: pass attn_impl= to ViT(...), ViT.from_config(config, "
    "attn_impl=...), create_vit, load_vit or load_model, or call model.set_attn_impl(impl)"
)
_dataclass_init = ViTConfig.__init__


@functools.wraps(_dataclass_init)
def _init(self: ViTConfig, *args: Any, **kwargs: Any) -> None:
    former = sorted(set(kwargs) & set(FORMER_FIELDS))
    if former:
        raise TypeError(f"ViTConfig has no field {former[0]}: {MOVED}")
    _dataclass_init(self, *args, **kwargs)


ViTConfig.__init__ = _init  # a former field gets a message saying where it went, not "unexpected keyword argument"


def check_float32(name: str, value: Any) -> float:
    """A positive float the weights' dtype float32 holds (LayerScale's gamma, LayerNorm's epsilon), else a
    ValueError naming ``name``, the value and the range."""
    value = check_positive_float(name, value)
    if not FLOAT32_TINY <= value <= FLOAT32_MAX:
        raise ValueError(
            f"{name} {value:g} is outside float32's range, the weights' dtype: expected a positive float from "
            f"{FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g}"
        )
    return value


def check_config(config: Any, module: str) -> ViTConfig:
    """``config`` if it is a ViTConfig: the model, its blocks and head, and each layer's ``from_config`` are built
    from one (``module`` names the builder)."""
    if not isinstance(config, ViTConfig):
        raise TypeError(
            f"{module} takes a ViTConfig, e.g. {module}(ViTConfig(dim=64, heads=4)); "
            f"got {type(config).__name__}"
        )
    return config
