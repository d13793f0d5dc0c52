"""The encoder: Eq. 2 and Eq. 3 as pre-norm residual blocks, composed so that print(model) shows them."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..base.checks import check_choice, check_probability, check_size
from ..base.sequential import Sequential, forward_takes
from .attention import MultiHeadAttention
from .config import ACTIVATIONS, ViTConfig, check_config
from .probes import HookPoint
from .rope import RopeTable


class ResidualAdd(nn.Sequential):
    """x + branch(x), out of place (the input tensor is never modified), the branch being its modules in order:
    ``ResidualAdd(norm, layer[, ls])`` is a pre-norm residual branch, its children named as its keys read
    (``blocks.0.attn.norm``, ``blocks.0.attn.mha.qkv``). Each keyword argument of ``forward`` (the attention's
    ``rope``) goes by name to the modules whose ``forward`` takes a parameter of that name; one that none takes is a
    TypeError naming it.

    Probe site: ``hook_normalized``, the pre-norm's output (b, n, D) that the layer takes (TransformerLens's
    ``blocks.{l}.ln1.hook_normalized`` for the attention branch, ``ln2`` for the MLP's)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.hook_normalized = HookPoint("(b, n, D)")

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return x + self.branch(x, **kwargs)

    def branch(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """What the block adds to the residual stream: the modules in order, LayerScale (``ls``) last."""
        routed = [(module, {k: v for k, v in kwargs.items() if forward_takes(module, k)}) for module in self]
        unknown = [k for k in kwargs if not any(k in given for _, given in routed)]
        if unknown:
            children = ", ".join(f"{name} ({type(m).__name__})" for name, m in self.named_children())
            raise TypeError(f"ResidualAdd got keyword arguments {unknown} that none of its modules takes: {children}")
        for i, (module, given) in enumerate(routed):
            x = module(x, **given)
            if i == 0 and len(self) > 1:  # the pre-norm's output, which the layer takes
                x = self.hook_normalized(x)
        return x


class LayerScale(nn.Module):
    """x * gamma, a learned per-channel scale on a residual branch (Touvron et al. 2021, CaiT; timm's LayerScale),
    gamma starting at ``init``. Shapes: (b, n, D) -> (b, n, D)."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"dim={self.gamma.shape[0]}, init={self.init:g}"


def _branch(config: ViTConfig, name: str, fn: nn.Module) -> ResidualAdd:
    """ResidualAdd(norm, fn[, ls]): one pre-norm residual branch, ``ls`` (LayerScale) when config.layer_scale."""
    stages = [("norm", nn.LayerNorm(config.dim, eps=config.layer_norm_eps)), (name, fn)]
    if config.layer_scale is not None:
        stages.append(("ls", LayerScale(config.dim, config.layer_scale)))
    return ResidualAdd(OrderedDict(stages))


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), the GELU approximation OpenAI's CLIP was trained with (timm's and HF's quick_gelu)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(name: str) -> nn.Module:
    """The MLP nonlinearity ``name`` (one of ACTIVATIONS): "gelu" exact (erf, the paper), "gelu_tanh" (the tanh
    approximation: HF's gelu_pytorch_tanh) or "quick_gelu"."""
    if check_choice("act", name, ACTIVATIONS) == "quick_gelu":
        return QuickGELU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


def _mlp(dim: int, mlp_dim: int, act: nn.Module, dropout: float, gated: bool = False) -> OrderedDict[str, nn.Module]:
    """fc1, act, drop1, fc2, drop2, sizes and rate checked; fc1 twice as wide when ``act`` gates one half of its
    output with the other (SwiGLU)."""
    dim, mlp_dim = check_size("dim", dim), check_size("mlp_dim", mlp_dim)
    dropout = check_probability("dropout", dropout)
    return OrderedDict(
        fc1=nn.Linear(dim, 2 * mlp_dim if gated else mlp_dim),
        act=act,
        drop1=nn.Dropout(dropout),
        fc2=nn.Linear(mlp_dim, dim),
        drop2=nn.Dropout(dropout),
    )


class MLP(Sequential):
    """The MLPs' forward: ``fc1``, ``act``, ``drop1``, ``fc2``, ``drop2``, with the probe sites ``hook_pre`` (fc1's
    output) and ``hook_post`` (the nonlinearity's)."""

    def __init__(self, stages: OrderedDict[str, nn.Module]) -> None:
        super().__init__(stages)
        self.hook_pre = HookPoint("(b, n, fc1 outputs)")
        self.hook_post = HookPoint("(b, n, mlp_dim)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_pre(self.fc1(x))
        x = self.hook_post(self.act(x))
        return self.drop2(self.fc2(self.drop1(x)))


class FeedForwardBlock(MLP):
    """The MLP of Eq. 3: ``fc1`` Linear(D, mlp_dim), ``act`` (exact GELU, erf, by default), ``drop1`` Dropout,
    ``fc2`` Linear(mlp_dim, D), ``drop2`` Dropout. Built alone as timm's ``Mlp(in_features, hidden_features)``:
    ``FeedForwardBlock(64, 256)``; an encoder block builds it with :meth:`from_config`.

    Args:
        dim: D, the width of the tokens.
        mlp_dim: the hidden width (Table 1's "MLP size", 4D for every preset).
        act: "gelu" (exact, the paper), "gelu_tanh" (the tanh approximation) or "quick_gelu" (OpenAI's CLIP).
        dropout: the rate of both Dropouts (Appendix B.1).

    Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, dim: int, mlp_dim: int, *, act: str = "gelu", dropout: float = 0.0) -> None:
        super().__init__(_mlp(dim, mlp_dim, activation(act), dropout))

    @classmethod
    def from_config(cls, config: ViTConfig) -> FeedForwardBlock:
        """The MLP of an encoder block of ``config``: its ``dim``, ``mlp_dim``, ``act`` and ``dropout``."""
        check_config(config, "FeedForwardBlock.from_config")
        return cls(config.dim, config.mlp_dim, act=config.act, dropout=config.dropout)


class GatedSiLU(nn.Module):
    """SiLU(g) * x of the two halves [g; x] of its input: the gate of SwiGLU. Shapes: (..., 2 m) -> (..., m)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, x = x.chunk(2, dim=-1)
        return F.silu(gate) * x


class SwiGLU(MLP):
    """The MLP of EVA-02 (Shazeer 2020, "GLU Variants Improve Transformer"): SwiGLU(x) = (SiLU(x W_g) * x W_x) W_2.

    ``fc1`` Linear(D, 2 mlp_dim) computes x W_g and x W_x at once (W_g's rows first), ``act`` :class:`GatedSiLU`
    multiplies them, then ``drop1`` Dropout, ``fc2`` Linear(mlp_dim, D), ``drop2`` Dropout. timm's
    ``SwiGLUPacked`` (``GluMlp(act_layer=nn.SiLU, gate_last=False)``), which EVA-02 tiny and small use: the same
    keys and shapes. Built alone: ``SwiGLU(64, 170)``.

    Args:
        dim: D, the width of the tokens.
        mlp_dim: the hidden width after the gate (EVA-02: int(D * 4 * 2/3), keeping the parameters of a 4D MLP).
        dropout: the rate of both Dropouts.

    Shapes: (b, n, D) -> (b, n, D).
    """

    def __init__(self, dim: int, mlp_dim: int, *, dropout: float = 0.0) -> None:
        super().__init__(_mlp(dim, mlp_dim, GatedSiLU(), dropout, gated=True))

    @classmethod
    def from_config(cls, config: ViTConfig) -> SwiGLU:
        """The SwiGLU MLP of an encoder block of ``config``: its ``dim``, ``mlp_dim`` and ``dropout``."""
        check_config(config, "SwiGLU.from_config")
        return cls(config.dim, config.mlp_dim, dropout=config.dropout)


# Each ViTConfig.ffn name (config.FFNS) -> its MLP block.
FFN_BLOCKS: dict[str, type[FeedForwardBlock | SwiGLU]] = {"mlp": FeedForwardBlock, "swiglu": SwiGLU}


class TransformerEncoderBlock(Sequential):
    """One layer l of the encoder, built from a :class:`ViTConfig`: its layers each built from the config
    (``from_config``), composed as two pre-norm residual branches.

    ``attn``: z'_l = MSA(LN(z_{l-1})) + z_{l-1}   (Eq. 2)
    ``mlp``:  z_l  = MLP(LN(z'_l)) + z'_l         (Eq. 3)

    With ``config.layer_scale`` each branch ends in a :class:`LayerScale` ``ls`` (DINOv2, DeiT III): MSA and MLP
    outputs are scaled per channel before the addition.

    Probe sites (TransformerLens's names, under ``blocks.{l}.``): ``hook_resid_pre`` z_{l-1}, ``hook_attn_out``
    (what the attention branch adds to the residual stream, LayerScale included), ``hook_resid_mid`` z'_l,
    ``hook_mlp_out`` (what the MLP branch adds, LayerScale included), ``hook_resid_post`` z_l; each (b, n, D).

    Shapes: (b, n, D) -> (b, n, D); ``rope``, the input's :class:`~vit_einops.network.rope.RopeTable`, goes to the MSA.
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "TransformerEncoderBlock")
        super().__init__(
            OrderedDict(
                attn=_branch(config, "mha", MultiHeadAttention.from_config(config)),
                mlp=_branch(config, "ff", FFN_BLOCKS[config.ffn].from_config(config)),
            )
        )
        for site in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
            setattr(self, site, HookPoint("(b, n, D)"))

    def forward(self, x: torch.Tensor, rope: RopeTable | None = None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn.branch(x, rope=rope)))  # Eq. 2
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp.branch(x)))  # Eq. 3

    def probe_sites(self) -> dict[str, HookPoint]:
        """The block's probe sites in the order the forward pass reaches them, by their names under ``blocks.{l}.``."""
        mha, ff = self.attn.mha, self.mlp.ff
        return {
            "hook_resid_pre": self.hook_resid_pre,
            "ln1.hook_normalized": self.attn.hook_normalized,
            **{f"attn.{name}": getattr(mha, name) for name in ("hook_q", "hook_k", "hook_v")},
            "attn.hook_attn_scores": mha.attend.hook_attn_scores,
            "attn.hook_pattern": mha.attend.hook_pattern,
            "attn.hook_z": mha.hook_z,
            "attn.hook_result": mha.hook_result,
            "hook_attn_out": self.hook_attn_out,
            "hook_resid_mid": self.hook_resid_mid,
            "ln2.hook_normalized": self.mlp.hook_normalized,
            "mlp.hook_pre": ff.hook_pre,
            "mlp.hook_post": ff.hook_post,
            "hook_mlp_out": self.hook_mlp_out,
            "hook_resid_post": self.hook_resid_post,
        }


class TransformerEncoder(Sequential):
    """``config.depth`` TransformerEncoderBlocks in a row (l = 1..L). Shapes: (b, n, D) -> (b, n, D); ``rope``,
    computed once for the input, goes to every block (as timm's Eva passes ``rope=rot_pos_embed``)."""

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "TransformerEncoder")
        super().__init__(*(TransformerEncoderBlock(config) for _ in range(config.depth)))
        self.needs_rope = config.rope_grid is not None

    def forward(self, x: torch.Tensor, rope: RopeTable | None = None) -> torch.Tensor:
        if self.needs_rope and rope is None:  # model[:2] would run it without the patches' positions
            raise ValueError(
                "this encoder rotates q and k by RoPE (rope_grid): run the whole model (model(x), "
                "model.forward_features(x)), or pass rope=model.rope(grid, model.num_prefix_tokens)"
            )
        for block in self:
            x = block(x, rope=rope)
        return x
