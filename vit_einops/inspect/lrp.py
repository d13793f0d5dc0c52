"""Layer-wise relevance propagation in the Gradient x Input framework: AttnLRP (Achtibat et al., ICML 2024) and
CP-LRP (Ali et al., ICML 2022), as lxt 2.1 computes them.

LRP passes the target's score back through the network, each layer sharing out the relevance that reaches its
output among its inputs by a rule. In the Gradient x Input form (lxt's "efficient" mode) each rule is a change of a
layer's backward pass only, such that at every tensor ``tensor * gradient`` is the relevance there; the pixels'
relevance is the input times its gradient, and the map sums it over each patch's pixels and channels.

The rules, attached to the running model through :func:`~vit_einops.network.probes.module_hooks` (the forward pass
computes what it always does; each rule swaps a layer's output for the same values with its own backward):

- every LayerNorm (the blocks', the final one, qk-norm, CLIP's pre-norm, the attention pool's): the identity rule,
  its standard deviation held constant (lxt's ``layer_norm_forward``): the norm is then linear in its input.
- GELU, QuickGELU and tanh: the identity rule (AttnLRP Eq. 9), the gradient times output / (input + 1e-10), so
  each unit passes on the relevance it receives (lxt's ``identity_rule_implicit``).
- SwiGLU's gate SiLU(g) * x: SiLU by the identity rule, the product by the uniform rule, half to each factor
  (lxt's ``gated_mlp_forward``); CP-LRP holds the gate constant (``cp_gated_mlp_forward``).
- attention: AttnLRP's uniform rule on its matmuls q k^T and A v, with the softmax's own gradient (whose
  Gradient x Input is AttnLRP's softmax rule, Prop. 3.1): q's and k's gradients divided by 4 and v's by 2 as they
  enter the kernel, on every kernel (lxt's ``wrap_attention_forward``). CP-LRP holds q and k constant, so A is a
  constant mixing of the values (lxt's ``cp_multi_head_attention_forward``).
- the patch embedding (Conv2d, or the Linear of patchify "linear") and the Linear layers of the MLPs and the head:
  zennit's Gamma rule (``patch_gamma``, ``linear_gamma``, ``stabilizer``: zennit's 1e-6), turned into Gradient x Input
  as lxt's ``monkey_patch_zennit`` does (the relevance at the output is gradient * output; the gradient passed on
  is the rule's relevance / stabilised input). The attention's projections (qkv, proj) pass the plain gradient
  (LRP-0), as in lxt's explanation of torchvision's ViT, whose projections run inside
  ``F.multi_head_attention_forward`` where zennit's module rules do not reach.
- everything else (the residual additions, LayerScale, RoPE, the pooling, the distilled head's mean) is linear and
  passes the plain gradient.

Conservation. With every bias zero (the Linear and LayerNorm biases, E_pos and the prefix tokens, which LRP counts as
biases too), every rule but AttnLRP's softmax passes on exactly the relevance it receives, at any gamma (the Gamma
rule's shares of an output add up to its relevance), up to the stabilizers (each denominator z of the Gamma rule is z +
stabilizer: a small model's small outputs lose a relative 1e-3 to zennit's 1e-6): CP-LRP's relevance over the pixels
sums to the target's score. AttnLRP's softmax rule keeps x_i (R_i - A_i sum_j R_j) of the relevance R reaching A, and
what it drops (with AttnLRP's halving, half the difference between the relevance at A and at its logits) the softmax
absorbs, as a bias would. With biases, each absorbs the share of the relevance its part of the output carried. A
backbone target's cosine similarity is differentiated with the norms held constant, as LayerNorm's (the identity rule),
and a patch target's dot products by the uniform rule, so that their relevance also starts as the score.

Axes: b images, c channels, H W pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from einops import einsum
from torch import nn
from torch.autograd import Function

from ..base.checks import check_choice, check_nonnegative_float, check_positive_float
from ..inputs import model_inputs
from ..network.attention import Attend
from ..network.blocks import MLP, GatedSiLU, QuickGELU
from ..network.probes import ModuleHook, module_hooks
from ..network.sizes import check_model_forward
from .targets import BACKBONE_TARGETS, PatchTarget, class_targets, one_class_each, resolve_target

RULES = ("attnlrp", "cp-lrp")
# The gammas of lxt's ViT explanations (its tutorial's Conv2d 0.25, Linear 0.1; its example sweeps Conv2d 0.1, 0.25
# and 100 against Linear 0, 0.01, 0.05, 0.1 and 1): a larger gamma favours the positive contributions.
PATCH_GAMMA = 0.25
LINEAR_GAMMA = 0.1
STABILIZER = 1e-6  # zennit's Gamma default: added to each denominator with its sign (+ for 0)
IDENTITY_EPSILON = 1e-10  # lxt's identity_rule_implicit: output / (input + 1e-10)
INPUT_EPSILON = 1e-10  # lxt's monkey_patch_zennit: the rule's relevance / the input, stabilised by 1e-10
ELEMENTWISE = (nn.GELU, QuickGELU, nn.Tanh)


def stabilize(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    """zennit's ``stabilize``: z + epsilon * sign(z), 0 counted as positive, for a safe division."""
    return z + ((z == 0).to(z) + z.sign()) * epsilon


class IdentityRule(Function):
    """y = f(x) given as (x, y), passing back the gradient times y / (x + 1e-10): the identity rule."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(y / (x + IDENTITY_EPSILON))
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.saved_tensors[0] * grad, None


class DivideGradient(Function):
    """x unchanged, its gradient divided by ``factor``: the uniform rule on a product's factors."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad / ctx.factor, None


def _layer(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``layer`` (an nn.Linear or nn.Conv2d) with other parameters."""
    if isinstance(layer, nn.Conv2d):
        return F.conv2d(x, weight, bias, layer.stride, layer.padding, layer.dilation, layer.groups)
    return F.linear(x, weight, bias)


def _transposed(layer: nn.Module, shape: torch.Size, m: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """J^T m of ``layer`` with ``weight``: the gradient of its input of ``shape`` for an output gradient m."""
    if isinstance(layer, nn.Conv2d):
        return torch.nn.grad.conv2d_input(shape, weight, m, layer.stride, layer.padding, layer.dilation, layer.groups)
    return m @ weight


class GammaRule(Function):
    """A Linear or Conv2d ``layer``'s output y for input x, passing back zennit's Gamma rule (zennit 0.5.1's
    ``Gamma(gamma, stabilizer)``, four modified copies of the layer: x+ and x- through W + gamma W+ and W + gamma W-,
    their biases b + gamma b+ and b + gamma b- with the positive inputs) in lxt's Gradient x Input form."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, y: torch.Tensor, layer: nn.Module, gamma: float, stabilizer: float
    ) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        ctx.layer, ctx.gamma, ctx.stabilizer = layer, gamma, stabilizer
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        x, y = ctx.saved_tensors
        layer, gamma, stabilizer = ctx.layer, ctx.gamma, ctx.stabilizer
        relevance = grad * y
        w = layer.weight.detach()
        w_pos, w_neg = w + gamma * w.clamp(min=0), w + gamma * w.clamp(max=0)
        b = None if layer.bias is None else layer.bias.detach()
        b_pos = None if b is None else b + gamma * b.clamp(min=0)
        b_neg = None if b is None else b + gamma * b.clamp(max=0)
        x_pos, x_neg = x.clamp(min=0), x.clamp(max=0)
        # zennit's denominators: the positive outputs' share of x+ W_pos + x- W_neg, the negative outputs' of the
        # mirror image; each output's relevance goes back through the copy of the layer that made it.
        z_pos = _layer(layer, x_pos, w_pos, b_pos) + _layer(layer, x_neg, w_neg, None)
        z_neg = _layer(layer, x_pos, w_neg, b_neg) + _layer(layer, x_neg, w_pos, None)
        m_pos = (y > 0) * relevance / stabilize(z_pos, stabilizer)
        m_neg = (y < 0) * relevance / stabilize(z_neg, stabilizer)
        back = partial(_transposed, layer, x.shape)
        rel_in = x_pos * (back(m_pos, w_pos) + back(m_neg, w_neg)) + x_neg * (back(m_pos, w_neg) + back(m_neg, w_pos))
        return rel_in / stabilize(x, INPUT_EPSILON), None, None, None, None


def _same_values(output: torch.Tensor, computed: torch.Tensor) -> torch.Tensor:
    """``output``'s values with ``computed``'s gradient (the two agree to rounding)."""
    return output.detach() + (computed - computed.detach())


def _layer_norm(module: nn.LayerNorm, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    x = inputs[0]
    centred = x - x.mean(dim=-1, keepdim=True)
    std = (centred.pow(2).mean(dim=-1, keepdim=True) + module.eps).sqrt()
    y = centred / std.detach()
    if module.weight is not None:
        y = y * module.weight
    if module.bias is not None:
        y = y + module.bias
    return _same_values(output, y)


def _elementwise(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return IdentityRule.apply(inputs[0], output.detach())


def _gate(cp: bool, module: GatedSiLU, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    gate, value = inputs[0].chunk(2, dim=-1)
    if cp:
        return _same_values(output, F.silu(gate.detach()) * value)
    return _same_values(output, DivideGradient.apply(IdentityRule.apply(gate, F.silu(gate).detach()) * value, 2))


def _attention(cp: bool, module: Attend, args: tuple) -> tuple:
    q, k, v, *rest = args
    if cp:
        return (q.detach(), k.detach(), v, *rest)
    return (DivideGradient.apply(q, 4), DivideGradient.apply(k, 4), DivideGradient.apply(v, 2), *rest)


def _gamma(gamma: float, stabilizer: float, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return GammaRule.apply(inputs[0], output.detach(), module, gamma, stabilizer)


def lrp_rules(
    model: nn.Module, rule: str = "attnlrp", *, patch_gamma: float = PATCH_GAMMA, linear_gamma: float = LINEAR_GAMMA,
    stabilizer: float = STABILIZER,
) -> tuple[list[tuple[nn.Module, ModuleHook]], list[tuple[nn.Module, ModuleHook]]]:
    """The (forward hooks, forward pre-hooks) of ``rule`` ("attnlrp" or "cp-lrp") on ``model``'s modules, for
    :func:`~vit_einops.network.probes.module_hooks` (see the module docstring for the rules)."""
    cp = check_choice("rule", rule, RULES) == "cp-lrp"
    patch_gamma = check_nonnegative_float("patch_gamma", patch_gamma)
    linear_gamma = check_nonnegative_float("linear_gamma", linear_gamma)
    stabilizer = check_positive_float("stabilizer", stabilizer)
    forward: list[tuple[nn.Module, Callable]] = [(model.patch_embed.proj, partial(_gamma, patch_gamma, stabilizer))]
    pre: list[tuple[nn.Module, Callable]] = []
    head = model.head
    linears = [head.pre_logits.fc] if "pre_logits" in head._modules else []
    linears += [m for m in (head.fc, getattr(head, "fc_dist", None)) if isinstance(m, nn.Linear)]
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            forward.append((module, _layer_norm))
        elif isinstance(module, ELEMENTWISE):
            forward.append((module, _elementwise))
        elif isinstance(module, GatedSiLU):
            forward.append((module, partial(_gate, cp)))
        elif isinstance(module, Attend):
            pre.append((module, partial(_attention, cp)))
        elif isinstance(module, MLP):
            linears += [module.fc1, module.fc2]
    forward += [(linear, partial(_gamma, linear_gamma, stabilizer)) for linear in linears]
    return forward, pre


def _held_norm(v: torch.Tensor) -> torch.Tensor:
    """v / |v| with the norm held constant: the identity rule of a normalisation."""
    return v / v.norm(dim=-1, keepdim=True).detach()


def _score(model: nn.Module, x: torch.Tensor, target: Any, rule: str) -> torch.Tensor:
    """(b,) the score LRP starts from: the target class's logit, or a backbone target's score with its norms held
    constant (a cosine similarity's Gradient x Input would be 0: it does not change with the output's scale)."""
    if not isinstance(target, BACKBONE_TARGETS):
        logits = model(x)
        classes = one_class_each(class_targets(target, logits.detach()), rule)
        return logits.gather(1, classes[:, None])[:, 0]
    tokens = model.forward_features(x)
    output = model.forward_head(tokens)
    if isinstance(target, PatchTarget):
        layout = model.patch_embed.layout(x.shape[-2:])
        target.similarity(tokens.detach(), layout)  # its checks: the patch is on the grid
        patches = _held_norm(tokens[:, layout.patches])
        chosen = patches[:, target.row * layout.grid[1] + target.col]
        return DivideGradient.apply(einsum(patches, chosen, "b n d, b d -> b n"), 2).mean(dim=-1)
    target.scores(output.detach())  # its checks: one vector per image or for all, of the output's width
    e = target.vector.to(output)
    return (_held_norm(output) * (e / e.norm(dim=-1, keepdim=True))).sum(dim=-1)


def lrp(
    model: nn.Module, images: Any, target: Any = None, *, rule: str = "attnlrp", patch_gamma: float = PATCH_GAMMA,
    linear_gamma: float = LINEAR_GAMMA, stabilizer: float = STABILIZER, preprocessed: bool | None = None,
) -> torch.Tensor:
    """The relevance of each input pixel for ``target``'s score by ``rule``, "attnlrp" or "cp-lrp" (see the module
    docstring), in the model's input space: input times its gradient under the rules.

    Args:
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them (``preprocessed``: how a float tensor is taken).
        target: None (each image's predicted class), a class index, one per image (b,), or a backbone target.
        patch_gamma: the Gamma rule's gamma on the patch embedding (lxt's Conv2d gamma).
        linear_gamma: the Gamma rule's gamma on the MLPs' and the head's Linear layers (lxt's Linear gamma).
        stabilizer: the Gamma rule's epsilon, added to each denominator with its sign (zennit's ``stabilizer``).

    The model's train/eval mode is the caller's (call ``model.eval()``: dropout would break conservation); no hook
    remains and parameters' ``.grad`` are left untouched. Shapes: images (b, c, H, W) -> (b, c, H, W).
    """
    forward, pre = lrp_rules(model, rule, patch_gamma=patch_gamma, linear_gamma=linear_gamma, stabilizer=stabilizer)
    x = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, x, grad=True)
    target = resolve_target(model, target, len(x))
    with module_hooks(forward, pre), torch.enable_grad():
        x = x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(_score(model, x, target, rule).sum(), x)  # images do not interact
    return x.detach() * grad
