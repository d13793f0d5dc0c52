"""torch's own modules carrying our weights: the independent implementations our layers are checked against.

Because our fused ``qkv`` is laid out (qkv h d), it *is* ``in_proj_weight``; no permutation is involved, which is
exactly what the equivalence tests prove.

A reference that silently computes something else than the model proves nothing, so each builder models an option
with torch's own module or refuses the layer with a ValueError naming the option and its value. What it models and
what it refuses is written once, below (:data:`MODELS`, :data:`REFUSES`): an option nobody decided for is refused.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .network.attention import MultiHeadAttention
from .network.blocks import TransformerEncoderBlock, activation
from .network.config import ACTIVATIONS, DEFAULTS
from .network.model import ViT


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x sigmoid(1.702 x), written with torch's SiLU (y sigmoid(y) at y = 1.702 x), not with our QuickGELU."""
    return F.silu(1.702 * x) / 1.702


# The activation each act becomes in nn.TransformerEncoderLayer: torch's own functions. "gelu" stays torch's string,
# which keeps its fused fast path in eval.
TORCH_ACTIVATIONS: dict[str, Any] = {
    "gelu": "gelu",
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "quick_gelu": _quick_gelu,
}

# The fields of the patch embedding and the head: torch_reference_vit keeps the model's own modules for them, so
# they are the model's by construction, checked against nothing.
SHARED = (
    "image_size",
    "patch_size",
    "in_channels",
    "num_classes",
    "pool",
    "patchify",
    "representation_size",
    "fc_norm",
    "register_tokens",
    "pos_embed_prefix",
    "class_token",
    "distill_token",
    "pre_norm",
    "patch_bias",
    "head_bias",
    "embedding",
    "dynamic_size",
)
_QK_NORM = "nn.MultiheadAttention has no LayerNorm on each head's q and k"
_SWIGLU = "nn.TransformerEncoderLayer's MLP is Linear, activation, Linear: no gate"
_ROPE = "nn.MultiheadAttention has no rotary position embedding of q and k"
_ENCODER_LAYER = {
    "dim": "d_model",
    "qkv_bias": "in_proj_bias: True copied, False and 'qv' as zeros in the missing thirds",
    "heads": "nhead",
    "mlp_dim": "dim_feedforward",
    "layer_norm_eps": "layer_norm_eps (norm1, norm2)",
    "dropout": "dropout: dropout1 after the attention, the MLP's after its activation, dropout2 after the MLP",
    "attn_dropout": "self_attn.dropout, on the attention weights",
    "act": f"activation: {', '.join(TORCH_ACTIVATIONS)} (TORCH_ACTIVATIONS)",
    "layer_scale": "gamma folded into out_proj and linear2: gamma * (W a + b) = (gamma[:, None] W) a + gamma b",
}
# What each builder models: field -> where torch's module carries it. A field a builder's input does not hold (the
# MLP's for an attention layer) is no part of its decision.
MODELS: dict[str, dict[str, str]] = {
    "torch_mha_from": {
        "dim": "embed_dim",
        "heads": "num_heads",
        "qkv_bias": "in_proj_bias: True copied, False and 'qv' as zeros in the missing thirds",
        "attn_dropout": "dropout, on the attention weights",
    },
    "torch_encoder_layer_from": _ENCODER_LAYER,
    "torch_reference_vit": {
        **_ENCODER_LAYER,
        "depth": "one nn.TransformerEncoderLayer per block",
        **{name: "the model's own patch embedding and head" for name in SHARED},
    },
}
# What each builder refuses at any value but the field's default: field -> why torch's module cannot hold it. A field
# in neither table is refused the same way ("no reference models it yet"), so a new option never passes unseen.
REFUSES: dict[str, dict[str, str]] = {
    "torch_mha_from": {
        "dropout": "nn.MultiheadAttention has no dropout after its output projection",
        "qk_norm": _QK_NORM,
    },
    "torch_encoder_layer_from": {"qk_norm": _QK_NORM, "ffn": _SWIGLU},
    "torch_reference_vit": {"qk_norm": _QK_NORM, "ffn": _SWIGLU, "rope_grid": _ROPE},
}

# The submodules each layer builder reads; any other (a module a new option added) is refused by its path.
_MHA_MODULES = (
    "qkv",
    "split_heads",
    "q_norm",
    "k_norm",
    "attend",
    "attend.softmax",
    "attend.dropout",
    "merge_heads",
    "proj",
    "dropout",
)
_BLOCK_MODULES = (
    *(f"attn{path}" for path in ("", ".norm", ".mha", ".ls")),
    *(f"attn.mha.{path}" for path in _MHA_MODULES),
    *(f"mlp{path}" for path in ("", ".norm", ".ff", ".ls")),
    *(f"mlp.ff.{path}" for path in ("fc1", "act", "drop1", "fc2", "drop2")),
)


def _refuse_unmodelled(builder: str, values: Mapping[str, Any]) -> None:
    """A ValueError naming the first field of ``values`` (field -> value) that ``builder`` does not model and that is
    not at its ViTConfig default: refused in :data:`REFUSES`, or decided nowhere."""
    for name, value in values.items():
        if name in MODELS[builder] or (name in DEFAULTS and value == DEFAULTS[name]):
            continue
        why = REFUSES[builder].get(name, "no reference models it yet (vit_einops.reference.MODELS)")
        raise ValueError(f"{builder} cannot model {name}={value!r}: {why}")


def _refuse_unknown_modules(builder: str, module: nn.Module, known: tuple[str, ...]) -> None:
    for path, sub in module.named_modules():
        if path and path not in known:
            raise ValueError(
                f"{builder} cannot model {type(module).__name__}'s {path} ({type(sub).__name__}): it is no option "
                f"the reference knows (vit_einops.reference.MODELS)"
            )


def _activation_name(module: nn.Module) -> str:
    """The ViTConfig act that builds a module equal to ``module``, else its repr (no act: refused by name)."""
    return next((name for name in ACTIVATIONS if repr(activation(name)) == repr(module)), repr(module))


def _attention_options(mha: MultiHeadAttention) -> dict[str, Any]:
    """The ViTConfig fields an attention layer holds, read off the layer."""
    return {
        "dim": mha.dim,
        "heads": mha.heads,
        "attn_dropout": mha.attend.dropout.p,
        "dropout": mha.dropout.p,
        "qk_norm": hasattr(mha, "q_norm"),
    }


def _copy_attention(mha: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    ref.in_proj_weight.copy_(mha.qkv.weight)
    if "q_bias" in mha._parameters:  # qkv_bias="qv": k's third of the bias is zero
        ref.in_proj_bias.copy_(torch.cat((mha.q_bias, torch.zeros_like(mha.q_bias), mha.v_bias)))
    elif mha.qkv.bias is None:  # qkv_bias=False: torch's fused projection always has a bias; zero is the same map
        ref.in_proj_bias.zero_()
    else:
        ref.in_proj_bias.copy_(mha.qkv.bias)
    ref.out_proj.weight.copy_(mha.proj.weight)
    ref.out_proj.bias.copy_(mha.proj.bias)


@torch.no_grad()
def torch_mha_from(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` with ``mha``'s weights and attention dropout.

    Refuses with a ValueError what it cannot model (:data:`REFUSES`): q and k norms, a dropout after the output
    projection, a submodule it does not know."""
    _refuse_unknown_modules("torch_mha_from", mha, _MHA_MODULES)
    options = _attention_options(mha)
    _refuse_unmodelled("torch_mha_from", options)
    weight = mha.qkv.weight
    ref = nn.MultiheadAttention(
        mha.dim, mha.heads, dropout=options["attn_dropout"], batch_first=True, device=weight.device, dtype=weight.dtype
    )
    _copy_attention(mha, ref)
    return ref


@torch.no_grad()
def torch_encoder_layer_from(block: TransformerEncoderBlock) -> nn.TransformerEncoderLayer:
    """An ``nn.TransformerEncoderLayer`` (pre-norm) with ``block``'s weights, activation, epsilon and dropouts.

    LayerScale has no place in torch's layer: each branch's gamma is folded into the Linear before it (out_proj,
    linear2), which computes the same function by another route; the gradient of the folded weight W' = gamma W is
    then ours divided by gamma, row by row. Refuses with a ValueError what it cannot model (:data:`REFUSES`): q and
    k norms, an activation torch has not, a submodule it does not know."""
    _refuse_unknown_modules("torch_encoder_layer_from", block, _BLOCK_MODULES)
    attn, mlp = block.attn, block.mlp
    mha, ff = attn.mha, mlp.ff
    options = {
        **_attention_options(mha),
        "mlp_dim": ff.fc1.out_features,
        "act": _activation_name(ff.act),
        "layer_norm_eps": attn.norm.eps,
        "layer_scale": attn.ls.init if hasattr(attn, "ls") else None,
    }
    _refuse_unmodelled("torch_encoder_layer_from", options)
    if options["act"] not in TORCH_ACTIVATIONS:
        raise ValueError(
            f"torch_encoder_layer_from cannot model act={options['act']!r}: it has no torch activation in "
            f"TORCH_ACTIVATIONS ({', '.join(TORCH_ACTIVATIONS)})"
        )
    weight = mha.qkv.weight
    ref = nn.TransformerEncoderLayer(
        mha.dim,
        mha.heads,
        dim_feedforward=options["mlp_dim"],
        dropout=options["dropout"],
        activation=TORCH_ACTIVATIONS[options["act"]],
        layer_norm_eps=options["layer_norm_eps"],
        batch_first=True,
        norm_first=True,
        device=weight.device,
        dtype=weight.dtype,
    )
    ref.self_attn.dropout = options["attn_dropout"]
    _copy_attention(mha, ref.self_attn)
    for ours, theirs in ((attn.norm, ref.norm1), (mlp.norm, ref.norm2), (ff.fc1, ref.linear1), (ff.fc2, ref.linear2)):
        theirs.load_state_dict(ours.state_dict())
    for branch, linear in ((attn, ref.self_attn.out_proj), (mlp, ref.linear2)):
        if hasattr(branch, "ls"):
            linear.weight.mul_(branch.ls.gamma[:, None])
            linear.bias.mul_(branch.ls.gamma)
    return ref


def forward_backward(fn, x: torch.Tensor, params: list[torch.Tensor], upstream: torch.Tensor):
    """Return ``fn(x)`` and the gradients of ``<fn(x), upstream>`` with respect to x and each of ``params``.

    A random ``upstream`` (rather than ``.sum()``) makes every output element weigh differently, so a permuted
    output cannot hide in a symmetric gradient.
    """
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    grads = torch.autograd.grad((out * upstream).sum(), [x, *params])
    return out.detach(), grads


def torch_reference_vit(model: ViT) -> nn.Sequential:
    """``model`` with every encoder block replaced by torch's ``nn.TransformerEncoderLayer`` (same weights).

    Patch embedding and head are shared modules (not copies): only the encoder is swapped for torch's. Refuses with
    a ValueError a model with an option it cannot model (:data:`REFUSES`) or that no reference has decided for.
    """
    config = model.config
    _refuse_unmodelled("torch_reference_vit", {f.name: getattr(config, f.name) for f in fields(config)})
    return nn.Sequential(
        OrderedDict(
            patch_embed=model.patch_embed,
            blocks=nn.Sequential(*(torch_encoder_layer_from(b) for b in model.blocks)),
            head=model.head,
        )
    )
