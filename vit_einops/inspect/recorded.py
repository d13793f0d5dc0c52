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

from ..network.patch_embed import TokenLayout
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
