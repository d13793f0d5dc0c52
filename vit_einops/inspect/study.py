"""One study of some images, computed once for both of its renderers: ``write_report`` draws it as figures and
arrays, the explorer as a page (:func:`~vit_einops.explore.payload.build_payload`).

A study runs the explanation methods of :data:`~vit_einops.inspect.METHODS` first (:func:`explain_all`: their own
passes never hold their maps beside the recorded pass's), then the one recorded pass (:func:`record_pass`) that
every other array reads, its rollout (:func:`recorded_rollout`) and the patch PCA of its final tokens
(:func:`fit_patch_pca`, jointly over the images). Its memory is :func:`~vit_einops.inspect.recorded.study_memory`.

Between the methods and the recorded pass it decomposes the score the gradient methods explain
(:func:`study_decomposition`), so that its working copies of every layer's pattern are gone before the recorded
maps are held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from .decompose import Decomposition, decompose, logit_lens
from .methods import explain_all, recorded_rollout, unexplained
from .pca import PatchPCA, fit_patch_pca
from .recorded import RecordedPass, record_pass


class StudyDecomposition(NamedTuple):
    """:func:`study_decomposition`'s result: ``decomposition`` the score split into heads, MLPs and the rest, each
    head's share by source token (:meth:`Decomposition.numbers`), and ``lens`` (b, L + 1) the logit lens of the
    same score (:func:`logit_lens`)."""

    decomposition: Decomposition
    lens: torch.Tensor


class Study(NamedTuple):
    """:func:`run_study`'s result: ``methods`` {name: (b, gh, gw)} the explanation methods' maps, ``run`` the
    recorded pass, ``rollout`` (b, n, n), ``pca`` the patch PCA of the final tokens and ``decomposition`` the
    score decomposed (:func:`study_decomposition`; None where there is nothing to explain)."""

    methods: dict[str, torch.Tensor]
    run: RecordedPass
    rollout: torch.Tensor
    pca: PatchPCA
    decomposition: StudyDecomposition | None


def study_decomposition(model: nn.Module, images: torch.Tensor, target: Any) -> StudyDecomposition | None:
    """The decomposition of the score the study's gradient methods explain: ``target``, else each image's
    predicted class; None for a model without a classifier and no target, which has no score to decompose (the
    gradient methods are left out then too: :func:`~vit_einops.inspect.methods.unexplained`)."""
    if unexplained(model, target):
        return None
    decomposition = decompose(model, images, target, by_source=True, preprocessed=True).numbers()
    return StudyDecomposition(decomposition, logit_lens(model, images, target, preprocessed=True))


def run_study(
    model: nn.Module,
    images: torch.Tensor,
    target: Any,
    method_params: Mapping[str, Mapping[str, Any]],
    check: Callable[[RecordedPass], None],
) -> Study:
    """The study of ``model`` (in eval mode) on preprocessed ``images`` (b, C, H, W): the methods explain
    ``target`` (else the top class) with ``method_params``; ``check`` refuses a recorded pass whose numbers the
    renderer cannot draw (raising), and runs before anything is computed from it, and where a method met
    non-finite numbers, on a pass recorded to name the cause where it is the model's own."""
    try:
        methods = explain_all(model, images, target, method_params, preprocessed=True)
    except ValueError:
        check(record_pass(model, images))
        raise
    decomposition = study_decomposition(model, images, target)
    run = record_pass(model, images)
    check(run)
    rollout = recorded_rollout(run.maps, run.layout, method_params)
    b, d = len(images), run.tokens.shape[-1]
    pca = fit_patch_pca(run.tokens, run.layout, min(3, d, b * run.layout.num_patches))
    return Study(methods, run, rollout, pca, decomposition)
