"""Eq. 4, y = LN(z_L^0), and the classifier attached to it."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from einops.layers.torch import Rearrange
from torch import nn

from ..base.checks import check_choice
from ..base.init import trunc_normal_
from ..base.sequential import Sequential
from .attention import Attend
from .blocks import FeedForwardBlock
from .config import ViTConfig, check_config
from .probes import HookPoint


def head_swap_help(dim: int, features: int) -> str:
    """What to do instead of a head swap that cannot work: the one sentence every such error ends with."""
    return (
        f"To change the classifier call model.reset_classifier(num_classes) (a zero-initialised "
        f"Linear({features}, num_classes)), or assign model.head.fc = nn.Linear({features}, num_classes); "
        f"model.forward_features(x) gives the (b, n, {dim}) tokens and model.forward_head(x, pre_logits=True) "
        f"the pooled features."
    )


def _outputs(classifier: nn.Module) -> int:
    """The outputs of a head's classifier: 0 for nn.Identity (no classifier), else the Linear's out_features."""
    return 0 if isinstance(classifier, nn.Identity) else classifier.out_features


class TokenPool(nn.Module):
    """(b, n, D) -> (b, D): "cls" takes the class token z^0 (the paper); "mean" averages the patch tokens,
    the ``num_prefix_tokens`` before them (class, distillation and register tokens) excluded.

    ``distilled``: "cls" takes the class and distillation tokens, (b, n, D) -> (b, 2, D), for DeiT's two
    classifiers."""

    def __init__(self, mode: str = "cls", num_prefix_tokens: int = 1, distilled: bool = False) -> None:
        super().__init__()
        self.mode = check_choice("pool", mode, ("cls", "mean"))
        self.num_prefix_tokens = num_prefix_tokens
        self.distilled = distilled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "cls":
            return x[:, :2] if self.distilled else x[:, 0]
        return x[:, self.num_prefix_tokens :].mean(dim=1)

    def probe_sites(self) -> dict[str, HookPoint]:
        """None: taking or averaging tokens has no activation of its own beside the head's ``hook_pooled``."""
        return {}

    def extra_repr(self) -> str:
        prefix = f", num_prefix_tokens={self.num_prefix_tokens}" if self.num_prefix_tokens != 1 else ""
        return f"mode={self.mode!r}{prefix}" + (", distilled=True" if self.distilled else "")


class AttentionPool(nn.Module):
    """Multi-head attention pooling, "MAP" (Zhai et al. 2022; SigLIP's head, timm's AttentionPoolLatent, HF's
    SiglipMultiheadAttentionPoolingHead): one learned query ``latent`` attends over every token, then a
    pre-norm MLP is added to the result, as in an encoder block: (b, n, D) -> (b, D).

    ``q`` and ``kv`` project the query and the tokens (kv laid out (kv h d), as timm's); ``attend`` is an
    :class:`~vit_einops.network.attention.Attend` (the einsum kernel, which forms the 1 x n matrix A per head);
    ``proj`` is the output projection, ``norm`` and ``mlp`` the residual MLP.

    Probe sites (the model's ``attn_pool.`` ones, docs/probes.md): ``hook_q`` (b, 1, h, d), the latent query;
    ``hook_k``, ``hook_v`` (b, n, h, d), the tokens' keys and values; ``attend``'s ``hook_attn_scores`` and
    ``hook_pattern`` (b, h, 1, n), the pooling attention's logits and A; ``hook_z`` (b, 1, h, d), each head's A v.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d = config.dim
        self.latent = nn.Parameter(torch.empty(1, 1, d))
        trunc_normal_(self.latent, d**-0.5)  # timm's init of the latent query
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.split_q = Rearrange("b n (h d) -> b h n d", h=config.heads)
        self.split_kv = Rearrange("b n (kv h d) -> kv b h n d", kv=2, h=config.heads)
        self.attend = Attend(config.head_dim)
        self.attend.hook_attn_scores.shape = self.attend.hook_pattern.shape = "(b, h, 1, n)"  # one query
        self.merge_heads = Rearrange("b h n d -> b n (h d)")
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.mlp = FeedForwardBlock.from_config(config)
        self.hook_q, self.hook_k, self.hook_v, self.hook_z = (HookPoint(shape, heads_second=True) for shape in (
            "(b, 1, h, d)", "(b, n, h, d)", "(b, n, h, d)", "(b, 1, h, d)"))  # fmt: skip

    @property
    def mode(self) -> str:
        return "map"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.hook_q(self.split_q(self.q(self.latent.expand(x.shape[0], -1, -1))))
        k, v = self.split_kv(self.kv(x))
        z = self.hook_z(self.attend(q, self.hook_k(k), self.hook_v(v)))
        pooled = self.proj(self.merge_heads(z))
        pooled = pooled + self.mlp(self.norm(pooled))
        return pooled[:, 0]

    def probe_sites(self) -> dict[str, HookPoint]:
        """The pooling attention's sites, in the order the forward pass reaches them."""
        sites = {"hook_q": self.hook_q, "hook_k": self.hook_k, "hook_v": self.hook_v}
        sites |= {"hook_attn_scores": self.attend.hook_attn_scores, "hook_pattern": self.attend.hook_pattern}
        return sites | {"hook_z": self.hook_z}


class ClassificationHead(Sequential):
    """``norm`` (the final LayerNorm of Eq. 4), ``pool``, optional ``pre_logits`` (Linear + tanh, the paper's
    pre-training head, when the :class:`ViTConfig` has a ``representation_size``), then ``fc`` to ``num_classes``
    (nn.Identity when num_classes is 0).

    With ``fc_norm`` the LayerNorm comes after the pooling (timm's ``fc_norm``, its default for average pooling).
    For "cls" pooling the order makes no difference (LayerNorm acts on each token alone); for "mean" it does.

    ``pool`` is an :class:`AttentionPool` for pool "map" (SigLIP). With a distillation token the pooling keeps the
    class and distillation tokens and a second classifier ``fc_dist`` reads the latter; the logits are the mean of
    the two (:meth:`classify`).

    ``fc`` may be replaced by an ``nn.Linear(in_features, K)`` or an ``nn.Identity()``; anything else (another
    module, a Linear of the wrong width, a new stage) raises, since ViTConfig could not describe the result.

    Probe sites: ``hook_normalized`` (the model's ``ln_final.hook_normalized``), the output of ``norm``: the
    normed tokens (b, n, D), or with fc_norm the normed pooled features (b, D); ``hook_pooled``, the output of
    ``pool``: (b, D), or (b, 2, D) for a distilled head, before ``norm`` with fc_norm; and an attention pool's
    (``attn_pool.*``, :class:`AttentionPool`).

    Shapes: (b, n, D) -> (b, num_classes), or (b, D or representation_size) when num_classes is 0.
    """

    def __init__(self, config: ViTConfig) -> None:
        check_config(config, "ClassificationHead")
        if config.pool == "map":
            pool: nn.Module = AttentionPool(config)
        else:
            pool = TokenPool(config.pool, config.num_prefix_tokens, config.distill_token)
        stages = [("norm", nn.LayerNorm(config.dim, eps=config.layer_norm_eps)), ("pool", pool)]
        if config.fc_norm:
            stages.reverse()
        features = config.dim
        if config.representation_size is not None:
            features = config.representation_size
            pre_logits = nn.Sequential(OrderedDict(fc=nn.Linear(config.dim, features), act=nn.Tanh()))
            stages.append(("pre_logits", pre_logits))
        k, bias = config.num_classes, config.head_bias
        stages.append(("fc", nn.Linear(features, k, bias=bias) if k else nn.Identity()))
        if config.distill_token:
            stages.append(("fc_dist", nn.Linear(features, k, bias=bias) if k else nn.Identity()))
        super().__init__(OrderedDict(stages))
        self.embedding = config.embedding  # fc projects into an embedding (CLIP's); a new fc is a classifier
        self.token_norm = not config.fc_norm  # norm acts on every token before the pooling (the paper)
        self.hook_normalized = HookPoint("(b, n, D), or (b, D) with fc_norm")
        self.hook_pooled = HookPoint("(b, D), or (b, 2, D) distilled")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.pool_features(x))

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """``fc`` on the pooled features; with a distillation token the mean of ``fc`` on the class token and
        ``fc_dist`` on the distillation token (DeiT at inference, as timm and HF average them)."""
        if "fc_dist" in self._modules:
            self.check_classifiers()
            return (self.fc(x[:, 0]) + self.fc_dist(x[:, 1])) / 2
        return self.fc(x)

    @property
    def distilled(self) -> bool:
        """True when the head has DeiT's second classifier ``fc_dist``."""
        return "fc_dist" in self._modules

    @property
    def dim(self) -> int:
        """D, the width of the tokens the head reads."""
        return self.norm.normalized_shape[0]

    @property
    def in_features(self) -> int:
        """The width of the classifier's input: D, or representation_size with a ``pre_logits`` layer
        (what ``nn.Linear(model.head.in_features, K)`` needs, as with timm's ``model.head.in_features``)."""
        return self.pre_logits.fc.out_features if "pre_logits" in self._modules else self.dim

    @property
    def out_features(self) -> int:
        """The number of outputs: num_classes, or in_features when there is no classifier."""
        return self.num_classes or self.in_features

    @property
    def num_classes(self) -> int:
        """K, the classifier's outputs; 0 when ``fc`` is nn.Identity (see :meth:`check_classifiers`)."""
        return self.check_classifiers()

    def check_classifiers(self) -> int:
        """K, the outputs of ``fc``; with a distillation token ``fc_dist`` must have as many (their logits are
        averaged): a ValueError saying how to change both otherwise, rather than torch's error on the sum."""
        k = _outputs(self.fc)
        if "fc_dist" in self._modules and _outputs(self.fc_dist) != k:
            raise ValueError(
                f"head.fc has {k} outputs but head.fc_dist has {_outputs(self.fc_dist)}: a distilled head averages "
                f"the two classifiers' logits, so they must agree. Assign both head.fc and head.fc_dist "
                f"(nn.Linear({self.in_features}, num_classes) each), or call model.reset_classifier(num_classes)"
            )
        return k

    def pool_features(self, x: torch.Tensor, *, normed: bool = False) -> torch.Tensor:
        """Every stage before the classifiers: (b, n, D) tokens -> (b, in_features), the classifier's input: Eq. 4's
        LN, then the pooling (with fc_norm the pooling, then the LN), then ``pre_logits`` where the head has it.

        ``normed``: the tokens already went through ``norm`` (``ViT.forward_features`` applies it), so it is
        skipped here when it acts on tokens.
        """
        if self.token_norm:
            x = self.hook_pooled(self.pool(x if normed else self.normed(x)))
        else:
            x = self.normed(self.hook_pooled(self.pool(x)))
        return self.pre_logits(x) if "pre_logits" in self._modules else x

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm (Eq. 4's LN), through the probe site ``hook_normalized``."""
        return self.hook_normalized(self.norm(x))

    def probe_sites(self) -> dict[str, HookPoint]:
        """The head's probe sites by the model's names, in the order the forward pass reaches them:
        ``ln_final.hook_normalized``, the pooling attention's ``attn_pool.*`` (pool "map"), ``hook_pooled``; with
        fc_norm the LayerNorm's last."""
        normalized = {"ln_final.hook_normalized": self.hook_normalized}
        pooled = {f"attn_pool.{name}": site for name, site in self.pool.probe_sites().items()}
        pooled["hook_pooled"] = self.hook_pooled
        return normalized | pooled if self.token_norm else pooled | normalized

    def check_classifier(self, module: Any) -> nn.Module:
        """``module`` if it can serve as ``fc``: an nn.Identity, or an nn.Linear reading in_features."""
        if isinstance(module, nn.Identity):
            return module
        if not isinstance(module, nn.Linear):
            raise TypeError(
                f"head.fc must be an nn.Linear({self.in_features}, num_classes) or nn.Identity(), got "
                f"{type(module).__name__}: ViTConfig (and so saving and loading) describes no other classifier. "
                f"For more layers, wrap the model: nn.Sequential(model, your_layers) with "
                f"model.reset_classifier(0). " + head_swap_help(self.dim, self.in_features)
            )
        if module.in_features != self.in_features:
            raise ValueError(
                f"head.fc must read the {self.in_features} pooled features, got nn.Linear with in_features="
                f"{module.in_features}. " + head_swap_help(self.dim, self.in_features)
            )
        return module

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, nn.Module) and "_modules" in self.__dict__:
            if name in ("fc", "fc_dist"):
                value = self.check_classifier(value)
                self.embedding = False
            elif name not in self._modules:
                raise TypeError(
                    f"ClassificationHead has no stage {name!r} (its stages are {', '.join(self._modules)}); "
                    f"assigning a module here would add a stage to its nn.Sequential forward. "
                    + head_swap_help(self.dim, self.in_features)
                )
        super().__setattr__(name, value)
