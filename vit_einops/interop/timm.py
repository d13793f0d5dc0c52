"""timm's ``VisionTransformer`` (and DeiT's ``VisionTransformerDistilled``) <-> vit-einops.

timm's names are closest to ours: ``blocks.i.attn.qkv`` is our fused ``qkv`` in the same (qkv h d) layout,
``norm1``/``norm2`` the two pre-norms, ``mlp.fc1``/``mlp.fc2`` the MLP, ``norm`` the final LayerNorm and ``head`` the
classifier (absent when timm's ``num_classes=0``).

The families timm builds with these two classes load and save both ways: DINO, DINOv2 with and without registers
(``reg_token``), DeiT's distillation token and second classifier (``dist_token``, ``head_dist``: timm's
``timm.models.deit.VisionTransformerDistilled``), DeiT III, CLIP (``norm_pre``, no patch bias, LayerNorm eps 1e-5,
quick-GELU for OpenAI's), SigLIP (no class token; attention pooling ``attn_pool.*``, our ``head.pool.*``) and MAE;
also qk-norm (``blocks.i.attn.q_norm``/``k_norm``), LayerScale (``blocks.i.ls1.gamma``/``ls2.gamma``), pooling
``global_pool="token"`` (our ``pool="cls"``), ``"avg"`` (our ``"mean"``) or ``"map"``, with the final LayerNorm
before pooling (timm's ``norm``) or after it (timm's ``fc_norm``, our ``fc_norm=True``).

Read off the state dict: P, C, D, L, MLP size, image size (square unless ``image_size`` is given), classes, and
which parts exist: class token, distillation token, registers, pre-norm, patch bias, qk-norm, LayerScale, fc_norm,
attention pooling (pool "map"), classifier bias, and whether E_pos covers the prefix tokens (its number of rows).
Not readable: the heads h, the activation, LayerNorm's eps, the pooling between "token" and "avg", LayerScale's
initial value. ``arch=`` (a timm model name, :data:`vit_einops.presets.FAMILIES`) supplies them, and the state dict
must then agree with that architecture. Without it, the tensors are matched against every name of that table (and
the paper's ViTs'): the one architecture they fit supplies them; architectures that fit but differ in what
no tensor holds are refused, listing them. A file no name fits is a plain ViT (Table 1's h by D, GELU, eps 1e-6,
"token"), unless it holds a family's parts (norm_pre, registers, LayerScale...), which the paper's defaults would
read as another model: it is refused, asking for arch=.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..base.checks import check_choice, to_pair
from ..network.config import DEFAULTS, FIELDS, ViTConfig, differences
from ..imagenet import assume_imagenet_names
from ..network.model import ViT
from ..presets import TIMM_ARCHS, embedding_of, tags_of, timm_arch, timm_preprocessing
from ..statedict import build_vit, check_free_fields, check_state_dict
from ..preprocess import Preprocessing
from .io import weights_reader
from .keys import (
    ATTN_LS,
    ATTN_NORM,
    FF,
    MHA,
    MLP_LS,
    MLP_NORM,
    KeyLayout,
    check_pos_rows,
    count_blocks,
    infer_heads,
    infer_image_size,
    model_and_config,
    require,
)

SOURCE = "timm"
# timm's global_pool -> our pool.
TIMM_POOLS = {"token": "cls", "avg": "mean", "map": "map"}
# LayerScale's initial gamma is not in the weights (they hold the trained gamma): timm's DINOv2 init_values, taken when
# no arch says otherwise (DeiT III's is 1e-6).
LAYER_SCALE_INIT = 1e-5
# timm's act_layer names of our activations (GELU is its default).
ACT_LAYERS = {"gelu": None, "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
# The classes that build a config in timm: DeiT's distillation token and head need timm.models.deit's.
VISION_TRANSFORMER = "timm.models.vision_transformer.VisionTransformer"
DISTILLED = "timm.models.deit.VisionTransformerDistilled"
EVA = "timm.models.eva.Eva"
_RULES = (
    (r"patch_embed\.proj\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"patch_embed\.(cls|dist|reg)_token\.weight", r"\1_token"),
    (r"patch_embed\.pos_embed\.weight", "pos_embed"),
    (r"patch_embed\.norm_pre\.(weight|bias)", r"norm_pre.\1"),
    (ATTN_LS + r"gamma", r"blocks.\1.ls1.gamma"),
    (MLP_LS + r"gamma", r"blocks.\1.ls2.gamma"),
    (ATTN_NORM + r"(weight|bias)", r"blocks.\1.norm1.\2"),
    (MHA + r"(qkv|proj|q_norm|k_norm)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (MHA + r"(q_bias|v_bias)", r"blocks.\1.attn.\2"),  # EVA's q and v biases
    (MLP_NORM + r"(weight|bias)", r"blocks.\1.norm2.\2"),
    (FF + r"(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"head\.pool\.(.+)", r"attn_pool.\1"),  # SigLIP's attention pooling: latent, q, kv, proj, norm, mlp
    (r"head\.fc\.(weight|bias)", r"head.\1"),
    (r"head\.fc_dist\.(weight|bias)", r"head_dist.\1"),
)
# Our head.norm is timm's norm (before pooling) or fc_norm (after it, our fc_norm=True; timm's norm is then Identity).
LAYOUT = KeyLayout(SOURCE, (*_RULES, (r"head\.norm\.(weight|bias)", r"norm.\1")))
FC_NORM_LAYOUT = KeyLayout(SOURCE, (*_RULES, (r"head\.norm\.(weight|bias)", r"fc_norm.\1")))
# The fields a timm state dict fixes, which must agree with a named arch (the ones a checkpoint may change, image
# size and classes, only where the caller did not pass the size and a tag names the classes).
_ARCH_CHECKED = tuple(name for name, about in FIELDS.items() if about.held and not about.per_checkpoint)
# The fields no tensor holds that a named arch supplies (heads and the free fields are passed on their own).
_UNTOLD = tuple(name for name, about in FIELDS.items() if about.held is None and not about.free and name != "heads")
_UNTOLD += ("layer_norm_eps",)  # free to override, but the arch's own value by default (CLIP's 1e-5)
# The parts a tensor shows (q and v biases, a SwiGLU MLP) of the families with RoPE, which only an arch can tell.
_ROPE_PARTS = {
    name
    for fields in TIMM_ARCHS.values()
    if fields.get("rope_grid") is not None
    for name in ("qkv_bias", "ffn")
    if fields.get(name, DEFAULTS[name]) != DEFAULTS[name]
}


def _layout(config: ViTConfig) -> KeyLayout:
    return FC_NORM_LAYOUT if config.fc_norm else LAYOUT


def timm_config(
    state_dict: Mapping[str, torch.Tensor],
    *,
    arch: str | None = None,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    global_pool: str | None = None,
    pos_embed_prefix: bool | None = None,
    act: str | None = None,
    dynamic_size: str | None = None,
    **overrides: Any,
) -> ViTConfig:
    """The ViTConfig of a timm ViT state dict.

    Args:
        state_dict: timm ``VisionTransformer.state_dict()`` (keys ``pos_embed``, ``blocks.i...``, ``cls_token``...).
        arch: timm's model name ("vit_small_patch14_reg4_dinov2", "vit_base_patch16_clip_224.openai"): the fields
            no tensor holds (heads, act, layer_norm_eps, image size, pooling, LayerScale's init) come from its entry
            in :data:`vit_einops.presets.FAMILIES`, and the ones the tensors fix must agree with it (a ValueError
            names each field that differs). A tag after the dot fixes the classes too, and whether the head is a
            classifier or an embedding projection (CLIP's openai, laion2b... tags; for the name alone, what its tags
            with the file's number of outputs are: :func:`vit_einops.presets.embedding_of`). The arguments below,
            when given, replace the arch's. None: the arch the tensors determine, if they determine one (a ValueError
            lists the candidates where they do not).
        heads: h; not stored in any shape, so by default the arch's, else Table 1's value for the width D.
        image_size: the checkpoint's (H, W); by default the arch's, else a square grid.
        global_pool: the timm model's ``global_pool``: "token", "avg" or "map". "map" is read off the keys
            (``attn_pool.*``); "token" and "avg" have the same keys, so by default the arch's, else "token" (or
            "avg" without a class token).
        pos_embed_prefix: whether pos_embed has rows for the prefix tokens (False: timm's no_embed_class); None reads
            it off the rows.
        act: the MLP's activation ("gelu", "gelu_tanh", "quick_gelu"); by default the arch's, else "gelu".
        dynamic_size: "timm" to accept any input size at forward as timm's ``dynamic_img_size=True`` does (opt-in
            there too), "hf" to resample as Hugging Face does, None (default) for the checkpoint's size only.
        **overrides: fields no tensor holds: dropout, attn_dropout, patchify, layer_norm_eps, embedding.
    """
    told = dict(
        heads=heads,
        image_size=image_size,
        global_pool=global_pool,
        pos_embed_prefix=pos_embed_prefix,
        act=act,
        dynamic_size=dynamic_size,
        **overrides,
    )
    return _read_config(state_dict, arch, told)[1]


def _read_config(
    state_dict: Mapping[str, torch.Tensor], arch: str | None, told: dict[str, Any]
) -> tuple[str | None, ViTConfig]:
    """The arch (``arch``, else the one the tensors determine: :func:`_arch_of`) and the config it reads."""
    if arch is None:
        arch, told = _arch_of(state_dict, **told)
    return arch, _config_of_arch(state_dict, arch, **told)


class _NoArchFits(ValueError):
    """A file with a family's parts that fits no arch of the table, told too little to be read as it is."""


def _arch_of(state_dict: Mapping[str, torch.Tensor], **told: Any) -> tuple[str | None, dict[str, Any]]:
    """The timm architecture a state dict's tensors determine, for reading it without ``arch=`` (None for a plain
    ViT), and ``told`` with the file's own image size where it has one: a family's file at another resolution (a
    fine-tuned checkpoint) is that family at its size.

    Each untagged name of :data:`vit_einops.presets.TIMM_ARCHS` (every family's members) is a
    candidate when the fields the tensors fix (D, L, P, tokens, registers, pre-norm, patch bias, LayerScale, pooling,
    image size...) agree with it. ``told`` are :func:`timm_config`'s other arguments, which replace a candidate's.
    The candidates must agree on everything else (heads, act, eps: the config they give) and on their preprocessing;
    a ValueError lists them where they do not, and asks for ``arch=``. None where no family fits (or only the plain
    ViTs, which are the paper's defaults); a file that holds a family's parts is then refused unless ``told`` names
    heads, act and layer_norm_eps, since the paper's defaults would read it silently as another model.
    """
    fits: dict[str, tuple[ViTConfig, Preprocessing | None]] = {}
    if told.get("image_size") is None:
        try:
            told = {**told, "image_size": _config_of_arch(state_dict, None, **told).image_size}
        except ValueError:
            pass  # the plain reading's own refusal is raised below, where no family fits
    for name in TIMM_ARCHS:
        try:
            config = _config_of_arch(state_dict, name, **told)
        except ValueError:
            continue
        # The paper's ViTs' names differ only in their size's crop: a file of one is read as the paper's ViT.
        plain = not config.beyond_paper()
        fits[name] = (config, None if plain else timm_preprocessing(name, config.image_size))
    families = [name for name, (_, prep) in fits.items() if prep is not None]
    configs = {name: dataclasses.asdict(config) for name, (config, _) in fits.items()}
    preprocessings = {name: repr(prep and prep.to_dict()) for name, (_, prep) in fits.items()}
    differ = [field for field in FIELDS if len({repr(c[field]) for c in configs.values()}) > 1]
    if differ or len(set(preprocessings.values())) > 1:
        own = ["its preprocessing"] * (len(set(preprocessings.values())) > 1)
        listed = ", ".join(
            f"{name} ({', '.join([*(f'{field} {configs[name][field]!r}' for field in differ), *own])})" for name in fits
        )
        raise ValueError(
            f"the timm state dict fits {len(fits)} of timm's architectures, which differ in what no tensor holds: "
            f"{listed}. Name the one it is: arch=NAME (on the command line, --arch NAME)"
        )
    if families:
        return families[0], told
    if not fits:
        plain = _config_of_arch(state_dict, None, **told)  # what a plain ViT's reading refuses is the closer reason
        # The parts beyond the paper that its tensors hold (registers, LayerScale, a pre-norm...: the field registry),
        # but for the two that timm's VisionTransformer takes as plain options (class_token=False with avg pooling,
        # no_embed_class), which imply nothing of the fields no tensor holds.
        parts = [
            part for part in plain.beyond_paper()
            if FIELDS[part.split()[0]].held and part.split()[0] not in ("class_token", "pos_embed_prefix")
        ]  # fmt: skip
        # EVA-02's parts come with RoPE, which no tensor and no argument tells: only its arch can.
        eva = [part for part in parts if part.split()[0] in _ROPE_PARTS]
        if eva:
            raise _NoArchFits(
                f"the timm state dict holds {', '.join(eva)}, parts of timm's Eva (EVA-02), but fits none of its "
                "architectures (vit_einops.presets.FAMILIES): whether it rotates q and k by RoPE, and on which "
                "reference grid, is nowhere in its tensors. Name its architecture: arch=NAME (on the command line, "
                "--arch NAME)"
            )
        told_enough = all(told.get(field) is not None for field in ("heads", "act", "layer_norm_eps"))
        if parts and not told_enough:
            raise _NoArchFits(
                f"the timm state dict holds {', '.join(parts)}, parts of timm's ViT families, but fits none of their "
                "architectures (vit_einops.presets.FAMILIES): its heads, activation and LayerNorm eps are nowhere "
                "in its tensors. Name its architecture: arch=NAME (on the command line, --arch NAME), or pass heads=, "
                "act= and layer_norm_eps= (--heads, --act and --layer-norm-eps)"
            )
    return None, told


def _config_of_arch(
    state_dict: Mapping[str, torch.Tensor],
    arch: str | None,
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    global_pool: str | None = None,
    pos_embed_prefix: bool | None = None,
    act: str | None = None,
    dynamic_size: str | None = None,
    **overrides: Any,
) -> ViTConfig:
    """:func:`timm_config` of ``arch``, or of a plain ViT (the paper's defaults) where it is None."""
    check_free_fields(overrides)
    fields = timm_arch(arch) if arch is not None else {}
    if global_pool is not None:
        check_choice("global_pool", global_pool, TIMM_POOLS)
    state_dict = check_state_dict(state_dict, SOURCE)
    head = state_dict.get("head.weight")
    classes = head.shape[0] if isinstance(head, torch.Tensor) and head.ndim else 0
    read = functools.partial(
        _config_from_keys,
        state_dict,
        heads=heads if heads is not None else fields.get("heads"),
        pool=TIMM_POOLS[global_pool] if global_pool is not None else None,
        default_pool=fields.get("pool"),
        pos_embed_prefix=pos_embed_prefix,
        layer_scale=fields.get("layer_scale") or LAYER_SCALE_INIT,
        # What no tensor holds comes from the arch (the field registry says which: act, eps, RoPE's grid), else the
        # paper's default; the caller's arguments replace it.
        extra={
            **{name: fields.get(name, DEFAULTS[name]) for name in _UNTOLD},
            "act": act if act is not None else fields.get("act", "gelu"),
            "dynamic_size": dynamic_size,
            # whether the head is a projection (CLIP's image embedding): the arch's tags say, for the file's classes
            "embedding": arch is not None and embedding_of(arch, classes),
            **overrides,
        },
    )
    if arch is None or image_size is not None:
        config = read(image_size=image_size)
    else:
        try:
            config = read(image_size=fields["image_size"])
        except ValueError:
            config = read(image_size=None)  # E_pos does not fit the arch's grid: read the file's, and say so below
    if arch is not None:
        _check_arch(config, arch, fields, image_size_given=image_size is not None)
    return config


def _config_from_keys(
    state_dict: Mapping[str, torch.Tensor],
    *,
    heads: int | None,
    image_size: Any,
    pool: str | None,
    default_pool: str | None,
    pos_embed_prefix: bool | None,
    layer_scale: float,
    extra: dict[str, Any],
) -> ViTConfig:
    """The config the keys and shapes of a timm state dict fix, with the fields no tensor holds as given: ``pool``
    must fit the keys; ``default_pool`` (an arch's) applies where they allow it."""
    proj = require(state_dict, "patch_embed.proj.weight", 4, SOURCE)
    if 0 in proj.shape:
        raise ValueError(
            f"timm: patch_embed.proj.weight has shape {tuple(proj.shape)}; a patch projection has no side of 0"
        )
    dim, in_channels, *patch = proj.shape
    pos = require(state_dict, "pos_embed", 3, SOURCE)
    fc1 = require(state_dict, "blocks.0.mlp.fc1.weight", 2, SOURCE)
    fc2 = require(state_dict, "blocks.0.mlp.fc2.weight", 2, SOURCE)
    gated = fc1.shape[0] == 2 * fc2.shape[1]  # SwiGLU: fc1 computes the gate and the value (EVA-02's GluMlp)
    head = state_dict.get("head.weight")
    class_token = "cls_token" in state_dict
    distill_token = "dist_token" in state_dict
    registers = require(state_dict, "reg_token", 3, SOURCE).shape[1] if "reg_token" in state_dict else 0
    has_layer_scale = "blocks.0.ls1.gamma" in state_dict
    prefix = class_token + distill_token + registers
    _check_token_keys(state_dict, pos.shape[1], prefix, tuple(patch), image_size, pos_embed_prefix)
    read_pool = "map" if "attn_pool.latent" in state_dict else ("cls" if class_token else "mean")
    if pool is None:
        fits = default_pool in ("cls", "mean") and read_pool != "map" and (class_token or default_pool == "mean")
        pool = default_pool if fits else read_pool
    elif (pool == "map") != (read_pool == "map"):
        where = "has" if read_pool == "map" else "has no"
        raise ValueError(
            f"global_pool {_global_pool(pool)!r} does not fit the timm state dict, which {where} attention pooling "
            f"(attn_pool.*): its global_pool is {_global_pool(read_pool)!r}"
        )
    if pos_embed_prefix is None:
        # Only families with registers or LayerScale (DINOv2, DeiT III) drop the prefix rows; a plain ViT keeps the
        # paper's layout, so that its pos_embed rows alone say whether the grid is square. With the image size known
        # the rows tell either way; without prefix tokens there is nothing to cover.
        pos_embed_prefix = prefix == 0 or (
            not (registers or has_layer_scale or image_size is not None)
            or _pos_embed_prefix(pos.shape[1], prefix, tuple(patch), image_size)
        )
    elif not isinstance(pos_embed_prefix, bool):
        raise TypeError(f"pos_embed_prefix must be a bool or None, got {type(pos_embed_prefix).__name__}")
    check_pos_rows(pos, "pos_embed", prefix * pos_embed_prefix, SOURCE)
    return ViTConfig(
        image_size=infer_image_size(pos.shape[1] - prefix * pos_embed_prefix, tuple(patch), image_size, SOURCE),
        patch_size=tuple(patch),
        in_channels=in_channels,
        num_classes=0 if head is None else head.shape[0],
        dim=dim,
        depth=count_blocks(state_dict, r"blocks\.(\d+)\.", SOURCE),
        heads=infer_heads(dim, heads),
        mlp_dim=fc2.shape[1],
        ffn="swiglu" if gated else "mlp",
        qkv_bias="qv" if "blocks.0.attn.q_bias" in state_dict else "blocks.0.attn.qkv.bias" in state_dict,
        pool=pool,
        fc_norm="fc_norm.weight" in state_dict,
        layer_scale=layer_scale if has_layer_scale else None,
        register_tokens=registers,
        pos_embed_prefix=pos_embed_prefix,
        class_token=class_token,
        distill_token=distill_token,
        pre_norm="norm_pre.weight" in state_dict,
        patch_bias="patch_embed.proj.bias" in state_dict,
        qk_norm="blocks.0.attn.q_norm.weight" in state_dict,
        head_bias=head is None or "head.bias" in state_dict,
        **extra,
    )


def _check_token_keys(
    state_dict: Mapping[str, torch.Tensor],
    rows: int,
    prefix: int,
    patch: tuple[int, int],
    image_size: Any,
    pos_embed_prefix: bool | None,
) -> None:
    """ValueError where the other tensors show a token key the state dict lacks: DeiT's second classifier
    (``head_dist``) without its ``dist_token``, or a pos_embed with one row more than the patches and the prefix
    tokens the file holds (the row of a missing ``cls_token`` or ``dist_token``). Without this, the extra row reads
    as a patch, and the message is about a grid that is not square."""
    dim = state_dict["patch_embed.proj.weight"].shape[0]
    if "head_dist.weight" in state_dict and "dist_token" not in state_dict:
        raise ValueError(
            "the timm state dict holds DeiT's second classifier (head_dist) but no dist_token, which a distilled DeiT "
            f"holds beside it ({_distilled_archs(dim, patch)}): the file is incomplete"
        )
    if pos_embed_prefix is False:
        return  # E_pos covers the patches alone: a missing token leaves its rows as they are
    cells = None
    if image_size is not None:
        h, w = to_pair("image_size", image_size)
        cells = (h // patch[0]) * (w // patch[1])

    def grid(n: int) -> bool:
        return n == cells if cells is not None else n > 0 and round(n**0.5) ** 2 == n

    patches = rows - prefix - 1  # the patches, were one more prefix token's row there
    if grid(rows - prefix) or grid(rows) or not grid(patches):
        return
    missing = "cls_token" if "cls_token" not in state_dict else "dist_token" if "dist_token" not in state_dict else None
    if missing is None:
        return
    held = [key for key in ("cls_token", "dist_token", "reg_token") if key in state_dict]
    tokens = (
        f"the {prefix} prefix token{'s' * (prefix > 1)} it holds ({', '.join(held)})"
        if prefix
        else "no prefix token"
    )
    side = round(patches**0.5)
    where = (
        f"A distilled DeiT holds cls_token and dist_token ({_distilled_archs(dim, patch)})"
        if missing == "dist_token"
        else "A timm ViT holds its class token first"
    )
    raise ValueError(
        f"the timm state dict's pos_embed has {rows} rows, one more than {patches} patches"
        f"{f' (a {side}x{side} grid)' if cells is None else ''} and {tokens}: is its {missing} missing? {where}"
        + ("; if the grid is not square, pass image_size=(H, W)" if cells is None else "")
    )


def _distilled_archs(dim: int, patch: tuple[int, int]) -> str:
    """timm's distilled DeiTs of width ``dim`` and ``patch``, named for a message; all of them where none is."""
    archs = [name for name, f in TIMM_ARCHS.items() if f.get("distill_token")]
    fitting = [
        name
        for name in archs
        if TIMM_ARCHS[name]["dim"] == dim and to_pair("patch_size", TIMM_ARCHS[name]["patch_size"]) == patch
    ]
    return f"timm's {', '.join(fitting or archs)}"


def _global_pool(pool: str) -> str:
    return {v: k for k, v in TIMM_POOLS.items()}[pool]


def _check_arch(config: ViTConfig, arch: str, fields: dict[str, Any], *, image_size_given: bool) -> None:
    """ValueError naming each field the state dict fixes that differs from timm's ``arch``."""
    want = ViTConfig(**fields)
    base, tagged, _ = arch.partition(".")
    checked = [*_ARCH_CHECKED, *(("image_size",) * (not image_size_given)), *(("num_classes",) * bool(tagged))]
    differ = [
        f"{name} {got!r} (timm's {arch} has {wanted!r})" for name, got, wanted in differences(config, want, checked)
    ]
    if differ:
        tags = [f"{base}.{t}" for t, n in tags_of(base).items() if n == config.num_classes]
        hint = f"; the tags with {config.num_classes} classes: {', '.join(tags)}" if tagged and tags else ""
        if config.image_size != want.image_size:
            hint += "; image_size= names a checkpoint's other resolution"
        raise ValueError(
            f"the timm state dict is not a {arch}: {'; '.join(differ)}{hint}. Load it without arch= to read what it "
            f"holds, or name the architecture it is"
        )


def _pos_embed_prefix(rows: int, prefix: int, patch: tuple[int, int], image_size: Any) -> bool:
    """Whether timm's pos_embed of ``rows`` rows covers the ``prefix`` tokens (no_embed_class=False) or the patch
    grid alone: the grid of ``image_size`` when given, else the one reading that leaves a square grid."""
    if image_size is not None:
        h, w = to_pair("image_size", image_size)
        return rows != (h // patch[0]) * (w // patch[1])  # a wrong size is refused by infer_image_size
    square = [n > 0 and round(n**0.5) ** 2 == n for n in (rows - prefix, rows)]
    if all(square):
        raise ValueError(
            f"the timm pos_embed has {rows} rows: a square grid both with its {prefix} prefix tokens' rows and "
            f"without them (no_embed_class); pass image_size=(H, W) to tell which"
        )
    return square[0] or not square[1]  # neither square: infer_image_size names the rows and asks for image_size


def from_timm(state_dict: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """A timm state dict renamed to ours for ``config``; every key and shape is checked
    (:class:`~vit_einops.statedict.StateDictMismatchError` lists what is missing, unexpected or mis-shaped)."""
    return _layout(config).to_ours(state_dict, config)


def to_timm(
    model_or_state: ViT | Mapping[str, torch.Tensor], config: ViTConfig | None = None
) -> dict[str, torch.Tensor]:
    """Our weights (a ViT, or its state dict plus ``config``) as a timm state dict; build the timm model with
    :func:`timm_class` and :func:`timm_kwargs`."""
    state_dict, config = model_and_config(model_or_state, config)
    timm_kwargs(config)  # raises if timm cannot express this config
    return _layout(config).from_ours(state_dict, config)


def timm_class(config: ViTConfig) -> str:
    """The timm class that builds ``config`` (with :func:`timm_kwargs`): ``VisionTransformer``, DeiT's
    ``timm.models.deit.VisionTransformerDistilled`` for a distillation token, or ``timm.models.eva.Eva`` for
    EVA-02's parts (q and v biases, SwiGLU, RoPE)."""
    if config.rope_grid is not None or config.ffn == "swiglu" or config.qkv_bias == "qv":
        return EVA
    return DISTILLED if config.distill_token else VISION_TRANSFORMER


def timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Arguments of timm's :func:`timm_class` (``VisionTransformer``, or ``VisionTransformerDistilled`` for DeiT's
    distillation token) that build the architecture of ``config``; a ValueError for a config timm cannot build."""
    # Allow-listed: a field with no timm argument (FIELDS[name].timm) must be at its default, whatever it is.
    unexpressed = [f"{name} {getattr(config, name)!r}" for name, about in FIELDS.items()
                   if about.timm is None and not about.free and getattr(config, name) != DEFAULTS[name]]  # fmt: skip
    if unexpressed:
        raise ValueError(f"timm's VisionTransformer has no counterpart of {', '.join(unexpressed)}")
    if config.patch_bias == config.pre_norm:
        # timm ties them: PatchEmbed(bias=not pre_norm)
        raise ValueError(
            f"timm's patch projection has a bias exactly when it has no pre-norm; got patch_bias {config.patch_bias} "
            f"with pre_norm {config.pre_norm}"
        )
    if config.distill_token and not config.pos_embed_prefix:
        raise ValueError("timm's VisionTransformerDistilled gives its prefix tokens position rows (pos_embed_prefix)")
    mlp_ratio = config.mlp_dim / config.dim
    if int(config.dim * mlp_ratio) != config.mlp_dim:  # timm builds int(dim * mlp_ratio) hidden units
        raise ValueError(f"timm cannot express mlp_dim {config.mlp_dim} as int(dim {config.dim} * mlp_ratio)")
    kwargs: dict[str, Any] = dict(
        img_size=config.image_size,
        patch_size=config.patch_size,
        in_chans=config.in_channels,
        num_classes=config.num_classes,
        global_pool=_global_pool(config.pool),
        fc_norm=config.fc_norm,
        embed_dim=config.dim,
        depth=config.depth,
        num_heads=config.heads,
        mlp_ratio=mlp_ratio,
        qkv_bias=True,
        qk_norm=config.qk_norm,
        class_token=config.class_token,
        reg_tokens=config.register_tokens,
        no_embed_class=not config.pos_embed_prefix,
        pre_norm=config.pre_norm,
        init_values=config.layer_scale,
        # Only timm's own resampling: a model resampling as HF does (antialias off) becomes a fixed-size timm model,
        # which refuses other sizes itself rather than giving other numbers there.
        dynamic_img_size=config.dynamic_size == "timm",
        proj_drop_rate=config.dropout,
        pos_drop_rate=config.dropout,
        attn_drop_rate=config.attn_dropout,
    )
    if ACT_LAYERS[config.act] is not None:
        kwargs["act_layer"] = ACT_LAYERS[config.act]
    if config.layer_norm_eps != 1e-6:  # timm's LayerNorm default
        kwargs["norm_layer"] = functools.partial(torch.nn.LayerNorm, eps=config.layer_norm_eps)
    if timm_class(config) == EVA:
        return _eva_kwargs(config, kwargs)
    return kwargs


def _eva_kwargs(config: ViTConfig, kwargs: dict[str, Any]) -> dict[str, Any]:
    """timm's Eva arguments for ``config`` (EVA-02's q and v biases, SwiGLU, RoPE), from VisionTransformer's."""
    others = [
        f"{name} {getattr(config, name)!r}"
        for name in ("distill_token", "qk_norm", "pre_norm", "register_tokens")
        if getattr(config, name) != DEFAULTS[name]
    ]
    if config.qkv_bias is True:
        others.append("qkv_bias True (Eva's qkv_bias is q and v biases, none on k: 'qv')")
    if config.pool == "map" or config.act != "gelu":
        others.append(f"pool {config.pool!r}, act {config.act!r} (this Eva has mean or token pooling and GELU)")
    if others:
        raise ValueError(f"timm's Eva has no counterpart of {', '.join(others)}")
    for name in ("fc_norm", "qk_norm", "reg_tokens", "pre_norm", "proj_drop_rate"):
        kwargs.pop(name)
    return kwargs | dict(
        qkv_bias=config.qkv_bias == "qv",
        swiglu_mlp=config.ffn == "swiglu",
        use_rot_pos_emb=config.rope_grid is not None,
        ref_feat_shape=config.rope_grid,
        use_fc_norm=config.fc_norm,
        drop_rate=0.0,
        proj_drop_rate=config.dropout,
    )


def load_timm(
    source: str | os.PathLike | Mapping[str, torch.Tensor],
    arch: str | None = None,
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    global_pool: str | None = None,
    pos_embed_prefix: bool | None = None,
    act: str | None = None,
    dynamic_size: str | None = None,
    dtype: torch.dtype | None = torch.float32,
    attn_impl: str | Sequence[str] = "einsum",
    **overrides: Any,
) -> ViT:
    """A ViT holding timm weights: from a file (safetensors, .pth, .bin) or a state dict.

    Args: as :func:`timm_config` (``arch="vit_small_patch14_reg4_dinov2"`` names the architecture, which fills what
    the keys cannot tell and which the weights must fit; ``dynamic_size="timm"`` accepts any input size, as timm's
    ``dynamic_img_size=True``); ``dtype`` casts the weights (None keeps theirs); ``attn_impl`` as in
    :class:`~vit_einops.ViT`. The model records timm's eval preprocessing (``model.transforms()``): the family's of the
    arch, named or determined by the tensors (:data:`vit_einops.presets.FAMILIES`: DINOv2 ImageNet mean/std
    at crop_pct 1.0, CLIP's mean/std, ...), else the augreg ViTs' (crop_pct 0.9, bicubic, mean = std = 0.5); set
    ``model.preprocessing`` for checkpoints trained otherwise. Resample to another resolution afterwards with
    :func:`vit_einops.interop.resample_vit` (``mode="timm"`` matches timm's own).
    """
    shapes, read = weights_reader(source, SOURCE)
    told = dict(
        heads=heads,
        image_size=image_size,
        global_pool=global_pool,
        pos_embed_prefix=pos_embed_prefix,
        act=act,
        dynamic_size=dynamic_size,
        **overrides,
    )
    try:
        arch, config = _read_config(shapes, arch, told)
    except _NoArchFits as refusal:
        # A file that is also broken (a key missing, a value not finite) says that first: it is the closer reason.
        plain = _config_of_arch(shapes, None, **told)
        from_timm(read(plain, dtype), plain)
        raise refusal from None
    model = build_vit(config, from_timm(read(config, dtype), config), attn_impl)
    # The family's own (DINOv2's ImageNet mean/std, CLIP's, SigLIP's), else the augreg ViTs' crop_pct 0.9, bicubic, 0.5
    if arch is not None:
        model.preprocessing = timm_preprocessing(arch, config.image_size)
    else:
        model.preprocessing = Preprocessing.timm(crop=config.image_size)
    model.source = {"library": SOURCE, "file": None if isinstance(source, Mapping) else str(source)}
    if arch is not None:
        model.source["arch"] = arch
    assume_imagenet_names(model)  # the file holds no names; 1000 logits are ImageNet-1k's
    return model
