"""The one configuration of a ViT (the paper's Table 1 sizes by default), and the registry of its fields.

Each field is declared once, in :class:`ViTConfig`, with everything the rest of the package needs to know about it
(:class:`Field`): its check, whether it is an option beyond the 2021 paper, whether a state dict's tensors hold it,
whether loading weights may set it, and its names in timm and Hugging Face. Every list of fields elsewhere (the
options beyond the paper, the fields a loader may override, the fields a named architecture promises, what an
exporter can express) is derived from :data:`FIELDS`, so a new field is a new line here and every view sees it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..base.checks import (
    MAX_SIZE,
    check_bool,
    check_choice,
    check_heads,
    check_patch_grid,
    check_positive_float,
    check_probability,
    check_size,
    show_int,
    to_pair,
)

POOLS = ("cls", "mean", "map")
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")
# How a model with dynamic_size resamples E_pos for another input size: the library whose numbers it reproduces.
DYNAMIC_SIZES = ("timm", "hf")
PATCHIFY = ("conv", "linear")
# The MLP of each block: "mlp" Linear-act-Linear (Eq. 3), "swiglu" a SiLU-gated MLP (EVA-02).
FFNS = ("mlp", "swiglu")
# float32's largest value and its smallest positive one (a subnormal): the weights' dtype. A layer_scale past the
# first is inf in the model, one under the second 0; a layer_norm_eps under it adds nothing to the variance.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SMALLEST_SUBNORMAL = 1.401298464324817e-45


def check_float32(name: str, value: Any) -> float:
    """A positive float the weights' dtype float32 holds (LayerScale's gamma, LayerNorm's epsilon), else a
    ValueError naming ``name``, the value and the range."""
    value = check_positive_float(name, value)
    if not FLOAT32_SMALLEST_SUBNORMAL <= value <= FLOAT32_MAX:
        raise ValueError(
            f"{name} {value:g} is outside float32's range, the weights' dtype: expected a positive float from "
            f"{FLOAT32_SMALLEST_SUBNORMAL:.4g} to {FLOAT32_MAX:.4g}"
        )
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    return functools.partial(check_choice, choices=choices)


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return functools.partial(_check_optional, check=check)


def _check_optional(name: str, value: Any, check: Callable[[str, Any], Any]) -> Any:
    return None if value is None else check(name, value)


def check_qkv_bias(name: str, value: Any) -> bool | str:
    """The fused qkv Linear's bias: True, False or "qv" (q and v biases, k's fixed at 0), for the config and the
    attention layer built alone."""
    if isinstance(value, bool) or value == "qv":
        return value
    error = ValueError if isinstance(value, str) else TypeError  # a str is the right kind, the wrong value
    raise error(f"{name} must be True, False or 'qv' (q and v biases, none on k), got {value!r}")


_count = functools.partial(check_size, positive=False)


def _pass(name: str, value: Any) -> Any:
    return value  # image_size and patch_size are checked together, in ViTConfig.__post_init__


@dataclass(frozen=True)
class Field:
    """What the package knows of one ViTConfig field, declared beside it.

    check: validates a value and returns it normalised (``check(name, value)``).
    beyond_paper: an option the 2021 paper's ViT lacks (True: its default leaves it out, as LayerScale's None or 0
        registers; a tuple: the values beyond the paper, as pool's "map").
    held: what a state dict's tensors say of it: "shapes" (its keys and shapes fix it), "presence" (only whether it
        is there: LayerScale's initial value is not in trained weights) or None (nothing: heads, eps, dropout).
    free: may be set when weights are loaded (dropout, the patch projection's form): the same tensors load either way.
    per_checkpoint: may differ between checkpoints of one architecture (a fine-tuned file's resolution, classes).
    timm: the argument of timm's VisionTransformer that expresses it, None where timm has none.
    hf: its name in a Hugging Face config.json, None where transformers' ViTs have none.
    """

    check: Callable[[str, Any], Any]
    beyond_paper: bool | tuple[Any, ...] = False
    held: str | None = "shapes"
    free: bool = False
    per_checkpoint: bool = False
    timm: str | None = None
    hf: str | None = None


def _field(default: Any, check: Callable[[str, Any], Any], **about: Any) -> Any:
    return field(default=default, metadata={"field": Field(check, **about)})


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
    image_size: int | tuple[int, int] = _field(224, _pass, per_checkpoint=True, timm="img_size", hf="image_size")
    # H, W; an int means square
    patch_size: int | tuple[int, int] = _field(16, _pass, timm="patch_size", hf="patch_size")  # P; an int: square
    in_channels: int = _field(3, check_size, timm="in_chans", hf="num_channels")  # C
    # K; 0 means no classifier, the head returns the pooled features
    num_classes: int = _field(
        1000, _count, per_checkpoint=True, timm="num_classes", hf="num_labels, id2label or projection_dim"
    )
    dim: int = _field(768, check_size, timm="embed_dim", hf="hidden_size")  # D, the hidden size
    depth: int = _field(12, check_size, timm="depth", hf="num_hidden_layers")  # L, the number of encoder blocks
    heads: int = _field(12, check_size, held=None, timm="num_heads", hf="num_attention_heads")  # h; D_h = D / h
    # Table 1 "MLP size", 4D for every preset
    mlp_dim: int = _field(3072, check_size, timm="mlp_ratio", hf="intermediate_size or mlp_ratio")
    # Appendix B.1: 0.1 for ImageNet runs, 0 for JFT pre-training
    dropout: float = _field(0.0, check_probability, held=None, free=True, timm="proj_drop_rate",
                            hf="hidden_dropout_prob")  # fmt: skip
    # dropout on the attention matrix A (not in the paper; timm's attn_drop)
    attn_dropout: float = _field(0.0, check_probability, held=None, free=True, timm="attn_drop_rate",
                                 hf="attention_probs_dropout_prob or attention_dropout")  # fmt: skip
    # "cls": Eq. 4 reads z_L^0; "mean": average of the patch tokens; "map": attention pooling (SigLIP)
    pool: str = _field("cls", _choice(POOLS), beyond_paper=("map",), timm="global_pool")
    # "conv": Conv2d(k=s=P); "linear": einops patches times E (Eq. 1 literally)
    patchify: str = _field("conv", _choice(PATCHIFY), held=None, free=True)
    # the pre-training head's hidden layer (tanh), None at fine-tuning
    representation_size: int | None = _field(None, _optional(check_size), hf="pooler_output_size")
    # final LayerNorm after pooling (timm's fc_norm) rather than on every token before it
    fc_norm: bool = _field(False, check_bool, timm="fc_norm")
    # torchvision and timm; torch's default 1e-5 would not load their weights exactly
    layer_norm_eps: float = _field(1e-6, check_float32, held=None, free=True, timm="norm_layer", hf="layer_norm_eps")
    # LayerScale's initial gamma in each residual branch (timm's init_values; DINOv2 1e-5, DeiT III 1e-6), None for
    # none (the paper)
    layer_scale: float | None = _field(None, _optional(check_float32), beyond_paper=True, held="presence",
                                       timm="init_values", hf="layerscale_value")  # fmt: skip
    # learned tokens after the class token, before the patches (Darcet et al. 2024: 4)
    register_tokens: int = _field(0, _count, beyond_paper=True, timm="reg_tokens", hf="num_register_tokens")
    # E_pos covers the class (and register) tokens (the paper); False adds positions to the patches only, then
    # prepends the prefix tokens (timm's no_embed_class: DINOv2 with registers, DeiT III)
    pos_embed_prefix: bool = _field(True, check_bool, beyond_paper=True, timm="no_embed_class")
    # x_class of Eq. 1; False (SigLIP) leaves the patches alone, pooled by "mean" or "map"
    class_token: bool = _field(True, check_bool, beyond_paper=True, timm="class_token")
    # DeiT's distillation token after the class token, read by a second classifier ``head.fc_dist``; the two
    # classifiers' logits are averaged (Touvron et al. 2021, timm and HF at inference)
    distill_token: bool = _field(False, check_bool, beyond_paper=True, timm="VisionTransformerDistilled")
    # a LayerNorm on z_0 before the first block (CLIP's ln_pre, timm's norm_pre)
    pre_norm: bool = _field(False, check_bool, beyond_paper=True, timm="pre_norm")
    # the patch projection's bias (CLIP has none; timm ties it to pre_norm)
    patch_bias: bool = _field(True, check_bool, beyond_paper=True, timm="pre_norm")
    # the MLP's nonlinearity: "gelu" (exact, the paper), "gelu_tanh" (SigLIP's HF config), "quick_gelu"
    # (x * sigmoid(1.702 x), OpenAI's CLIP)
    act: str = _field("gelu", _choice(ACTIVATIONS), beyond_paper=True, held=None, timm="act_layer", hf="hidden_act")
    # a LayerNorm over D_h on every head's q and k before Eq. 6 (timm's qk_norm)
    qk_norm: bool = _field(False, check_bool, beyond_paper=True, timm="qk_norm")
    # the classifier's bias; CLIP's projection to the joint embedding has none
    head_bias: bool = _field(True, check_bool, beyond_paper=True)
    # the head's num_classes outputs are an embedding, not class logits: CLIP's projection of the pooled features
    # into its joint image-text space (a family's tags say which: vit_einops.presets.FAMILIES). The tensors are the
    # same either way, so a loader may be told it; a new classifier (reset_classifier, head.fc =) makes it False.
    embedding: bool = _field(False, check_bool, beyond_paper=True, free=True, per_checkpoint=True)
    # the fused qkv Linear's bias: True (the paper), False, or "qv": q and v biases, k's fixed at 0 (BEiT, EVA-02)
    qkv_bias: bool | str = _field(True, check_qkv_bias, beyond_paper=True, timm="qkv_bias")
    # the MLP of Eq. 3: "mlp" (Linear, act, Linear), or "swiglu" (SiLU(x W_g) * x W_x, then W_2: EVA-02), whose fc1
    # is 2 mlp_dim wide
    ffn: str = _field("mlp", _choice(FFNS), beyond_paper=True, timm="swiglu_mlp")
    # 2-D rotary position embedding of the patch tokens' q and k (EVA-02), positions scaled to this reference grid
    # (the pre-training grid: 16 x 16 for 224 / 14); None for none (the paper: E_pos only)
    rope_grid: int | tuple[int, int] | None = _field(None, _optional(to_pair), beyond_paper=True, held=None,
                                                     timm="ref_feat_shape")  # fmt: skip
    # None: inputs must be image_size; "timm" or "hf": any multiple of the patch size, E_pos resampled at forward as
    # that library does (timm's dynamic_img_size, HF's interpolate_pos_encoding). How a forward treats other input
    # sizes, not architecture: every format holds such a model.
    dynamic_size: str | None = _field(None, _optional(_choice(DYNAMIC_SIZES)), beyond_paper=True, held=None,
                                      free=True, timm="dynamic_img_size")  # fmt: skip

    def __post_init__(self) -> None:
        # Frozen: normalised values are stored with object.__setattr__, once, here.
        image_size, patch_size = check_patch_grid(self.image_size, self.patch_size)
        object.__setattr__(self, "image_size", image_size)
        object.__setattr__(self, "patch_size", patch_size)
        for name, about in FIELDS.items():
            object.__setattr__(self, name, about.check(name, getattr(self, name)))
        check_heads(self.dim, self.heads)
        if self.num_tokens > MAX_SIZE:
            raise ValueError(
                f"the tokens must be at most 2**63 - 1 (torch's sizes are int64), got {show_int(self.num_tokens)} "
                f"from image_size {self.image_size}, patch_size {self.patch_size} and register_tokens "
                f"{self.register_tokens}"
            )
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
        if self.embedding and not self.num_classes:
            raise ValueError("embedding True needs the projection's outputs: num_classes is its width, got 0")
        if self.rope_grid is not None and self.head_dim % 4:
            raise ValueError(
                f"rope_grid needs a head size D/h divisible by 4 (2-D RoPE turns D_h/4 channel pairs per axis), got "
                f"{self.head_dim} from dim {self.dim} and heads {self.heads}"
            )

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
    def num_tokens(self) -> int:
        """N = N' + the prefix tokens (1 in the paper), the tokens the encoder sees."""
        return self.num_patches + self.num_prefix_tokens

    @property
    def num_pos_tokens(self) -> int:
        """Rows of E_pos: every token, or the patches alone when ``pos_embed_prefix`` is False."""
        return self.num_tokens if self.pos_embed_prefix else self.num_patches

    def beyond_paper(self) -> list[str]:
        """The options set here that the 2021 paper's ViT lacks (LayerScale, registers, positions for the patches
        only, attention pooling...: the fields :class:`Field` marks ``beyond_paper``), each as "field value"; empty
        for the paper's architecture. Formats and tools that know only that architecture refuse a config with any of
        them. The free fields (``dynamic_size``: how a forward treats other input sizes) are no architecture: every
        format holds them."""
        return [
            f"{name} {getattr(self, name)!r}"
            for name, about in FIELDS.items()
            if about.beyond_paper and not about.free and _beyond(name, about, getattr(self, name))
        ]

    @property
    def has_classifier(self) -> bool:
        """True when the outputs are class logits: False for pooled features (num_classes 0) and for an embedding
        projection (``embedding``: CLIP's image embedding), which have no classes to predict or explain."""
        return self.num_classes > 0 and not self.embedding

    @property
    def head_dim(self) -> int:
        """D_h = D / h."""
        return self.dim // self.heads

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists. The options beyond the paper are left out at their plain values, so a
        paper ViT's config (and the files holding it) reads as it did before those options existed."""
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
            if not (FIELDS[k].beyond_paper is True and v == DEFAULTS[k])
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ViTConfig:
        """The config of :meth:`to_dict`'s mapping."""
        if not isinstance(d, Mapping):
            raise TypeError(f"a ViTConfig is read from a mapping of its fields, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known, key=str)
        if unknown:
            raise ValueError(f"unknown ViTConfig fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**d)


# The registry: each field's Field and default, in declaration order. Every list of fields is derived from these.
FIELDS: dict[str, Field] = {f.name: f.metadata["field"] for f in fields(ViTConfig)}
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ViTConfig)}
# The fields a loader may set beside the weights it reads: no tensor holds them, and the same tensors load either way.
FREE_FIELDS = tuple(name for name, about in FIELDS.items() if about.free)


def _beyond(name: str, about: Field, value: Any) -> bool:
    if isinstance(about.beyond_paper, tuple):
        return value in about.beyond_paper
    return value != DEFAULTS[name]


def same(name: str, a: Any, b: Any) -> bool:
    """Whether two values of field ``name`` describe the same architecture: equal, or for a field the weights hold
    only by presence (LayerScale, whose initial value trained weights forget), both present or both absent."""
    if FIELDS[name].held == "presence":
        return (a is None) == (b is None)
    return a == b


def differences(got: ViTConfig, want: ViTConfig, names: Iterable[str]) -> list[tuple[str, Any, Any]]:
    """(field, got's value, want's value) for each of ``names`` where the two configs describe other architectures."""
    return [(n, getattr(got, n), getattr(want, n)) for n in names if not same(n, getattr(got, n), getattr(want, n))]


def check_config(config: Any, module: str) -> ViTConfig:
    """``config`` if it is a ViTConfig: the model, its blocks and head, and each layer's ``from_config`` are built
    from one (``module`` names the builder)."""
    if not isinstance(config, ViTConfig):
        raise TypeError(
            f"{module} takes a ViTConfig, e.g. {module}(ViTConfig(dim=64, heads=4)); "
            f"got {type(config).__name__}"
        )
    return config
