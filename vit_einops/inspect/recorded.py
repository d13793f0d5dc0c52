"""One recorded forward pass, read by every study view: the attention of every layer, the token norms after every
block, the final tokens and the output, all from the same run of the model.

The explorer and ``inspect`` draw attention maps, token norms, the patch PCA and the patch-similarity map of the
same images; each of them once ran the model again for its own part. Here the pass runs once:
``forward_head(forward_features(x))``, which is ``model(x)``, with the attention recorder
(:class:`~vit_einops.inspect.record.AttentionRecorder`) and the token-norm hooks
(:func:`~vit_einops.inspect.stats.recording_token_norms`) attached, and ``forward_features``' tokens kept.

Axes: l layers, b images, h heads, n tokens, D the token width.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..network.config import ViTConfig
from ..network.patch_embed import TokenLayout
from ..network.sizes import forward_bytes
from .decompose import decompose_memory, decomposition_bytes
from .record import AttentionRecorder
from .stats import recording_token_norms


class RecordedPass(NamedTuple):
    """What :func:`record_pass` returns: ``output`` (b, ...) the model's (logits, or pooled features for a model
    without a classifier); ``tokens`` (b, n, D), :meth:`~vit_einops.network.model.ViT.forward_features`' (the
    final normed tokens, prefix tokens first); ``maps`` (l, b, h, n, n), A of every encoder layer; ``norms``
    (l, b, n), ``||z_l||`` after each block as :func:`~vit_einops.inspect.token_norms` gives them; ``layout``, the
    input's token layout."""

    output: torch.Tensor
    tokens: torch.Tensor
    maps: torch.Tensor
    norms: torch.Tensor
    layout: TokenLayout


@torch.no_grad()
def record_pass(model: nn.Module, images: torch.Tensor) -> RecordedPass:
    """Run ``model`` (a ViT, in the mode the caller set) once on its batch ``images`` (b, C, H, W) and record
    everything the study views read (:class:`RecordedPass`); no hook remains after."""
    recorder = AttentionRecorder(model)
    with recorder, recording_token_norms(model) as norms:
        tokens = model.forward_features(images)
        output = model.forward_head(tokens)
    return RecordedPass(output, tokens, recorder.maps, torch.stack(norms), recorder.layout)


def study_memory(
    config: ViTConfig, b: int, *, target: bool, beside_maps: int = 0, classes: int = 0, after: int = 0
) -> int:
    """The memory a study of ``b`` images of ``config``'s size works in, from the sizes alone: with the renderer's
    arguments 0, :func:`~vit_einops.inspect.run_study`'s own, phase by phase from what it holds:

    - the explanation methods (:func:`~vit_einops.inspect.explain_all`, run after the decomposition, whose numbers
      give the "decomposition" method's map): the rollout's own recorded pass
      (:func:`~vit_einops.network.sizes.forward_bytes` keeping every layer's float32 maps, l b h n^2, and their
      copy) with its float64 matrices (three of l b n^2), and where there is something to explain (a classifier,
      or a ``target``) a gradient method's differentiable pass with its gradients (three float32 copies of the
      maps); a ``target``'s relevance is one such pass, run before the other methods (it gives the "relevance"
      method's map), its float32 (b, n, n) kept beside every later phase;
    - where there is something to explain, the study's decomposition
      (:func:`~vit_einops.inspect.decompose.decompose_memory`), run before every other pass, and its numbers kept
      beside every later phase (:func:`~vit_einops.inspect.decompose.decomposition_bytes`);
    - the recorded pass (:func:`record_pass`), then its rollout's float64 matrices beside its maps; DINO's view and
      the PCA are a few (b, h, gh, gw) and (b, n, D) arrays beside them.

    A renderer adds what it works in beside the study's held maps (``write_report``'s
    :func:`~vit_einops.inspect.report.report_memory`, the explorer's
    :func:`~vit_einops.explore.payload.pane_memory`): ``beside_maps`` bytes of its own float64 work (one layer's
    copies, the heads' mean), relevance for ``classes`` classes from one more differentiable pass (three copies of
    the maps per class), and ``after``, what it holds once the maps are gone (its written arrays, its figures);
    so a renderer's estimate is never below the study's own."""
    n, depth = config.num_tokens, config.depth
    maps = depth * b * config.heads * n * n * 4
    record = forward_bytes(config, b, kept=depth) + maps
    grad_pass = maps + forward_bytes(config, b, kept=depth, grad=True)
    explain = config.has_classifier or target
    phases = [record, record + 3 * depth * b * n * n * 8, maps + beside_maps, after]
    phases += [grad_pass + 3 * maps] * explain
    phases += [maps + grad_pass + 3 * classes * maps] * bool(classes)
    if explain:
        kept = decomposition_bytes(config, b) + b * n * n * 4 * bool(target)
        phases = [decompose_memory(config, b), *(phase + kept for phase in phases)]
    return max(phases)
