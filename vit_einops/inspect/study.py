"""One study of some images, computed once for both of its renderers: ``write_report`` draws it as figures and
arrays, the explorer as a page (:func:`~vit_einops.explore.payload.build_payload`). Every array both of them show
is the study's, computed here once: neither renderer computes a rollout, a DINO view or a target's relevance of
its own.

A study first decomposes the score the gradient methods explain (:func:`study_decomposition`, so that its working
copies of every layer's pattern are gone before any other pass; its numbers give the "decomposition" method's map),
then takes a backbone target's relevance (its differentiable pass; it gives the "relevance" method's map), then runs
the other explanation methods of :data:`~vit_einops.inspect.METHODS` (:func:`explain_all`: their own passes never
hold their maps beside the recorded pass's), then the one recorded pass (:func:`record_pass`) that every other array
reads: its rollout (:func:`recorded_rollout`), DINO's view of its ``layer`` (:func:`dino_view`) and the patch PCA of
its final tokens (:func:`fit_patch_pca`, jointly over the images). Its memory is
:func:`~vit_einops.inspect.recorded.study_memory` (a renderer adds its own work there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from ..base.checks import check_index
from ..inputs import model_inputs
from ..prediction import check_finite_logits, check_finite_outputs
from .decompose import Decomposition, decompose, logit_lens
from .dino import DinoView, dino_view
from .methods import METHODS, explain_all, recorded_rollout, token_grid, unexplained
from .pca import PatchPCA, fit_patch_pca
from .recorded import RecordedPass, record_pass
from .relevance import attention_gradients, relevance_from_gradients
from .targets import check_study_target
from .tokens import CLASS_TOKEN

OVERFLOW = "the model's weights are the likely cause (non-finite or huge values that overflow float32)"


class TargetRelevance(NamedTuple):
    """A backbone target's relevance in a :class:`Study`: ``relevance`` (b, n, n), R of Chefer et al. for the
    target's score from the "relevance" method's ``start_layer`` (:func:`~vit_einops.inspect.relevance_from_gradients`;
    its class token's row on the grid is the "relevance" method's map), and ``scores`` (b,), the target's score s of
    each image."""

    relevance: torch.Tensor
    scores: torch.Tensor


class StudyDecomposition(NamedTuple):
    """:func:`study_decomposition`'s result: ``decomposition`` the score split into heads, MLPs and the rest, each
    head's share by source token (:meth:`Decomposition.numbers`), and ``lens`` (b, L + 1) the logit lens of the
    same score (:func:`logit_lens`)."""

    decomposition: Decomposition
    lens: torch.Tensor


class Study(NamedTuple):
    """:func:`run_study`'s result.

    - ``methods``: {name: (b, gh, gw)}, the explanation methods' maps (:func:`~vit_einops.inspect.explain_all`);
    - ``run``: the recorded pass (:class:`~vit_einops.inspect.RecordedPass`: output, final tokens, every layer's
      maps (l, b, h, n, n), token norms, the token layout);
    - ``rollout``: (b, n, n), the rollout of the recorded maps with the "rollout" method's parameters;
    - ``pca``: the patch PCA of the final tokens, jointly over the images;
    - ``layer``: the layer DINO's view reads, from 0;
    - ``dino``: DINO's view of that layer (:class:`~vit_einops.inspect.DinoView`, (b, h, gh, gw) each), None for a
      model without a class token;
    - ``target``: the target's relevance (:class:`TargetRelevance`), None without a target;
    - ``decomposition``: the score the gradient methods explain, decomposed (:func:`study_decomposition`), None
      where there is nothing to explain.
    """

    methods: dict[str, torch.Tensor]
    run: RecordedPass
    rollout: torch.Tensor
    pca: PatchPCA
    layer: int
    dino: DinoView | None
    target: TargetRelevance | None
    decomposition: StudyDecomposition | None


def check_finite_pass(images: torch.Tensor, run: RecordedPass) -> None:
    """:func:`run_study`'s default ``check``: every array of the recorded pass finite, the output's refusal naming
    the first image and the likely cause (:func:`~vit_einops.prediction.check_finite_logits`)."""
    check_finite_logits(images, run.output)
    for name, values in (("attention maps", run.maps), ("token norms", run.norms), ("final tokens", run.tokens)):
        check_finite_outputs(name, values, OVERFLOW)


def target_relevance(model: nn.Module, images: torch.Tensor, target: Any, start_layer: int) -> TargetRelevance:
    """A backbone ``target``'s relevance of ``model`` on its batch ``images`` from ``start_layer``: one
    differentiable pass (:func:`~vit_einops.inspect.attention_gradients`), refused where it is not finite."""
    _, maps, grads, scores = attention_gradients(model, images, target)
    relevance = relevance_from_gradients(maps, grads, start_layer)[0]  # (b, n, n)
    check_finite_outputs("target's relevance maps", relevance, f"the gradients overflowed; {OVERFLOW}")
    return TargetRelevance(relevance, scores[:, 0])


def study_decomposition(model: nn.Module, images: torch.Tensor, target: Any) -> StudyDecomposition | None:
    """The decomposition of the score the study's gradient methods explain: ``target``, else each image's
    predicted class; None where the decomposition method is left out (:func:`~vit_einops.inspect.methods.unexplained`):
    a model without a classifier and no target, which has no score to decompose, or a head that is not linear."""
    if "decomposition" in unexplained(model, target):
        return None
    decomposition = decompose(model, images, target, by_source=True, preprocessed=True).numbers()
    return StudyDecomposition(decomposition, logit_lens(model, images, target, preprocessed=True))


def run_study(
    model: nn.Module,
    images: torch.Tensor,
    target: Any = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    check: Callable[[RecordedPass], None] | None = None,
    *,
    layer: int = -1,
) -> Study:
    """The study of ``model`` (in eval mode) on its preprocessed batch ``images`` (b, C, H, W), as
    :func:`~vit_einops.inspect.write_report` and the explorer draw it.

    Args:
        target: None, or a backbone target (:class:`~vit_einops.inspect.EmbeddingTarget`, ``ImageTarget``,
            ``PatchTarget``): what the gradient methods explain (else the top class), and whose relevance
            ``Study.target`` holds.
        method_params: the explanation methods' parameters by name (:data:`~vit_einops.inspect.METHODS`; the others
            take their defaults); the rollout and the target's relevance use the "rollout" and "relevance" methods'.
        check: refuses a recorded pass whose numbers the caller cannot draw (raising); it runs before anything is
            computed from the pass, and where a method or the target's relevance met non-finite numbers, on a pass
            recorded to name the cause where it is the model's own. Default :func:`check_finite_pass`.
        layer: the block DINO's view reads (0 is the first, -1 the last, as DINO draws): ``write_report``'s
            ``layer``; the explorer's DINO view is the last layer's.

    Example::

        >>> import torch
        >>> from vit_einops import ViT
        >>> from vit_einops.inspect import run_study
        >>> model = ViT(image_size=16, patch_size=4, num_classes=3, dim=32, depth=2, heads=2, mlp_dim=64).eval()
        >>> study = run_study(model, torch.rand(2, 3, 16, 16))
        >>> study.run.maps.shape, study.rollout.shape, study.dino.mask.shape, study.layer
        (torch.Size([2, 2, 2, 17, 17]), torch.Size([2, 17, 17]), torch.Size([2, 2, 4, 4]), 1)
    """
    if not hasattr(model, "probe_sites") or not isinstance(getattr(model, "blocks", None), nn.Module):
        raise TypeError(f"run_study needs a vit-einops ViT, got {type(model).__name__}")
    depth = len(model.blocks)
    layer = check_index("layer", layer, depth, f"a ViT of depth {depth}")
    check_study_target("run_study", target)
    images = model_inputs(model, images, preprocessed=True)
    method_params = dict(method_params or {})
    check = check or (lambda run: check_finite_pass(images, run))
    try:
        # Decomposed and the target's relevance taken first, so that the "decomposition" and "relevance" methods'
        # maps are the study's: one decompose and one differentiable pass for the target, not two of each.
        decomposition = study_decomposition(model, images, target)
        given = {} if decomposition is None else {"decomposition": decomposition.decomposition.source_map()}
        chosen = None
        if target is not None:
            start_layer = METHODS["relevance"].resolve(method_params.get("relevance", {}))["start_layer"]
            chosen = target_relevance(model, images, target, start_layer)
            given["relevance"] = token_grid(chosen.relevance, model.patch_embed.layout(images.shape[-2:]))
        methods = explain_all(model, images, target, method_params, preprocessed=True, given=given)
    except ValueError:
        check(record_pass(model, images))
        raise
    run = record_pass(model, images)
    check(run)
    rollout = recorded_rollout(run.maps, run.layout, method_params)
    dino = dino_view(run.maps, run.layout, layer=layer) if CLASS_TOKEN in run.layout.prefix else None
    b, d = len(images), run.tokens.shape[-1]
    pca = fit_patch_pca(run.tokens, run.layout, min(3, d, b * run.layout.num_patches))
    return Study(methods, run, rollout, pca, layer, dino, chosen, decomposition)
