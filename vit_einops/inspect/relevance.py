"""Gradient-weighted attention relevance (Chefer, Gur and Wolf 2021), on every attention implementation.

Rollout (rollout.py) multiplies the attention maps as they are. Chefer et al. weight each map by how much the
chosen class's logit depends on it, keeping only the positive part, so that heads that push towards the class
count and heads that push away do not. Their rule for self-attention in a ViT (Eqs. 5-6 of "Generic
Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV 2021, the
gradient-weighted successor of "Transformer Interpretability Beyond Attention Visualization", CVPR 2021, that
replaces the latter's LRP relevance of A by A itself):

    Abar_l = E_h[(dy_t/dA_l * A_l)^+]          (mean over heads of the positive part, element-wise)
    R_0 = I,   R_l = R_{l-1} + Abar_l R_{l-1}    for l = 1..L

where y_t is the logit of the target class t (not its softmax probability, as in their code), or for a model without
a classifier the score s of a backbone target (:mod:`vit_einops.inspect.targets`: a cosine similarity to an
embedding, another image, or the chosen patch's token). The class token's
row of R over the patch keys (the prefix tokens' columns skipped: :func:`~vit_einops.inspect.class_attention_grid`
with the input's token layout) is its relevance map. (A model with ``pool="mean"`` classifies the mean
of the patch tokens, not the class token; the mean of R's patch rows, :func:`~vit_einops.inspect.patch_attention_grid`,
is then the closer reading.) Only the encoder's layers (``model.blocks``) enter R.

Fused implementations (sdpa, chunked) never form A, so it has no autograd node there; the chosen kernel still runs
its own forward and backward here. Since each head's output is O = A v (Eq. 7, the probe site ``hook_z``), the
gradient of A is dy_t/dA = (dy_t/dO) v^T: it is read at the probe sites (docs/probes.md) from the gradient of
``hook_z`` and the ``hook_v`` the kernel took, and A itself is formed from ``hook_q`` and ``hook_k`` outside the
graph, with the einsum kernel's arithmetic (the encoder's layers take no mask). With attention dropout active
(training mode, ``attn_dropout`` > 0) O is not A v, so the methods refuse it: call ``model.eval()`` first.

Axes: l layers, b images, h heads, i queries, j keys, k target classes per image.
"""

from __future__ import annotations

from typing import Any

import torch
from einops import einsum, reduce
from torch import nn

from ..base.checks import check_dense_tensor, check_index
from ..inputs import model_inputs
from ..network.probes import attached
from ..network.sizes import check_model_forward
from .record import attention_matrix
from .targets import BACKBONE_TARGETS, class_targets, resolve_target, target_scores


class _GradientProbes:
    """What :func:`attention_gradients` reads at each encoder layer's probe sites: A from q and k (outside the graph),
    v, and O = A v kept in the graph (the hook hands it back, so the rest of the pass is computed from it and its
    gradient exists).

    Axes as the sites give them: q, k, v, O (b, n, h, d); A (b, h, n, n).
    """

    def __init__(self, model: nn.Module) -> None:
        blocks = getattr(model, "blocks", None)
        if not hasattr(model, "probe_sites") or not isinstance(blocks, nn.Module):
            raise ValueError(f"{type(model).__name__} is not a ViT with probe sites (model.probe_sites())")
        for layer, block in enumerate(blocks):
            if block.attn.mha.attend.dropout_p > 0:
                raise ValueError(
                    f"attention dropout is active in layer {layer} (p={block.attn.mha.attend.dropout_p} in training "
                    "mode): the output is then not A v and dy/dA cannot be read from it; call model.eval() first"
                )
        self.depth = len(blocks)
        self.scales = [block.attn.mha.attend.scale for block in blocks]
        self.maps: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        self._q: torch.Tensor | None = None
        sites = model.probe_sites()
        self.hooks = []
        for layer in range(self.depth):
            site = f"blocks.{layer}.attn.hook_"
            self.hooks += [(sites[site + "q"], self._keep_q), (sites[site + "k"], self._form_attention(layer))]
            self.hooks += [(sites[site + "v"], self._keep_v), (sites[site + "z"], self._keep_output)]

    def _keep_q(self, q: torch.Tensor, hook: Any) -> None:
        self._q = q.detach()

    def _form_attention(self, layer: int):
        def form(k: torch.Tensor, hook: Any) -> None:
            with torch.no_grad():
                q, k = self._q.transpose(1, 2), k.detach().transpose(1, 2)
                self.maps.append(attention_matrix(q, k, self.scales[layer]))
            self._q = None

        return form

    def _keep_v(self, v: torch.Tensor, hook: Any) -> None:
        self.values.append(v.detach())

    def _keep_output(self, output: torch.Tensor, hook: Any) -> torch.Tensor:
        self.outputs.append(output)
        return output  # handed back: the pass goes on from this tensor, so d score / d output exists

    def gradients(self, score: torch.Tensor, retain: bool) -> torch.Tensor:
        """(l, b, h, n, n): d score / d A_l = (d score / d O_l) v_l^T for every layer, zeros where O_l does not reach
        the score."""
        grads = torch.autograd.grad(score, self.outputs, retain_graph=retain, allow_unused=True)
        return torch.stack([
            torch.zeros_like(a) if d is None else einsum(d, v.to(d.dtype), "b i h d, b j h d -> b h i j")
            for a, d, v in zip(self.maps, grads, self.values, strict=True)
        ])  # fmt: skip


def attention_gradients(
    model: nn.Module, images: torch.Tensor, target: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A of every layer and the gradient of the target logit with respect to it, on any attention impl.

    One forward pass of the chosen kernel with the probe sites read (see the module docstring), then one backward
    pass per target class. Parameters' ``.grad`` are left untouched (``torch.autograd.grad``), and no hook remains.
    The model's train/eval mode is the caller's: call ``model.eval()`` first, as for any explanation (attention
    dropout, active in training, is refused).

    Args:
        target: None (each image's predicted class), an int (the same class for all), (b,) (one class per
            image) or (b, k) (k classes per image); or a backbone target (:class:`EmbeddingTarget`,
            :class:`ImageTarget`, :class:`PatchTarget`), the only kind a model with ``num_classes`` 0 takes.

    Returns (logits (b, classes), maps (l, b, h, n, n), grads (k, l, b, h, n, n), targets (b, k)), where
    ``grads[t, l] = d y_{targets[:, t]} / d A_l``. For a backbone target: (the model's output (b, D_out), maps,
    grads (1, l, b, h, n, n) of the target's score s, the scores s (b, 1)).
    """
    target = resolve_target(model, target, len(images))  # an image's embedding first, outside the recording
    backbone = isinstance(target, BACKBONE_TARGETS)
    probes = _GradientProbes(model)
    check_model_forward(model, images, kept=probes.depth, grad=True)
    with attached(probes.hooks), torch.enable_grad():
        # The input requires grad so the graph exists even where every parameter is frozen.
        if backbone:
            output, scores = target_scores(model, images.detach().requires_grad_(True), target)
            grads = [probes.gradients(scores.sum(), retain=False)]  # images do not interact
            return output.detach(), torch.stack(probes.maps), torch.stack(grads), scores.detach()[:, None]
        logits = model(images.detach().requires_grad_(True))
        if logits.ndim != 2:
            raise ValueError(f"expected the model to return logits (b, classes), got {tuple(logits.shape)}")
        targets = class_targets(target, logits.detach())
        grads = []
        for t in range(targets.shape[1]):
            score = logits.gather(1, targets[:, t : t + 1]).sum()  # images do not interact: one sum serves all
            grads.append(probes.gradients(score, retain=t + 1 < targets.shape[1]))
    return logits.detach(), torch.stack(probes.maps), torch.stack(grads), targets


def relevance_from_gradients(maps: torch.Tensor, grads: torch.Tensor, start_layer: int = 0) -> torch.Tensor:
    """Chefer et al.'s rule: ``Abar_l = mean_h (grads_l * A_l)^+``, ``R = I``, ``R <- R + Abar_l R`` for
    l = ``start_layer``..L-1 (layers numbered from 0; negative counts from the end).

    ``start_layer`` skips the first layers, as Transformer-Explainability's ``start_layer`` does: there
    ``compute_rollout_attention`` starts its product at layer ``start_layer``, and Transformer-MM-Explainability
    issue #8 shows ViT-B/16 maps swamped by the early layers until they are skipped (``if i <= 10: continue``,
    start_layer 11 of 12).

    Shapes: maps (l, b, h, n, n), grads (..., l, b, h, n, n) -> R (..., b, n, n); row i of R is token i's
    relevance over the input tokens (the class token's row is the explanation).
    """
    if not isinstance(maps, torch.Tensor) or maps.ndim != 5 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"expected maps (layers, b, h, n, n), got {getattr(maps, 'shape', type(maps).__name__)}")
    if not isinstance(grads, torch.Tensor) or grads.shape[-5:] != maps.shape:
        got = getattr(grads, "shape", type(grads).__name__)
        raise ValueError(f"expected grads (..., {', '.join(map(str, maps.shape))}), got {got}")
    depth = maps.shape[0]
    start_layer = check_index("start_layer", start_layer, depth, f"{depth} layers")
    weighted = reduce((grads * maps).clamp(min=0), "... l b h i j -> ... l b i j", "mean")
    n = maps.shape[-1]
    relevance = torch.eye(n, dtype=weighted.dtype, device=weighted.device).expand_as(weighted[..., 0, :, :, :])
    for layer in range(start_layer, depth):
        relevance = relevance + weighted[..., layer, :, :, :] @ relevance
    return relevance


def attention_relevance(
    model: nn.Module, images: Any, target: Any = None, *, preprocessed: bool | None = None, start_layer: int = 0
) -> torch.Tensor:
    """Gradient-weighted relevance R for ``target`` (see the module docstring), on any attention impl.

    Args:
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them (``preprocessed``: how a float tensor is taken; see :mod:`vit_einops.inputs`).
        target: None (the predicted class), an int, (b,) or (b, k) class indices, or a backbone target (see
            :func:`attention_gradients`).
        start_layer: the first layer that enters R (:func:`relevance_from_gradients`); 0, every layer, by default.

    Shapes: images (b, C, H, W) -> R (b, n, n), or (b, k, n, n) for a (b, k) target, the tokens in the order of
    ``layout = model.patch_embed.layout(images.shape[-2:])`` (the prefix tokens, then the patches);
    ``class_attention_grid(R, layout)`` lays the class token's relevance over the patches on the grid.
    """
    images = model_inputs(model, images, preprocessed=preprocessed)
    _, maps, grads, _ = attention_gradients(model, images, target)
    relevance = relevance_from_gradients(maps, grads, start_layer)  # (k, b, n, n)
    # (b, k) class indices, checked by attention_gradients
    if target is not None and not isinstance(target, BACKBONE_TARGETS) and torch.as_tensor(target).ndim == 2:
        return relevance.transpose(0, 1)
    return relevance[0]
