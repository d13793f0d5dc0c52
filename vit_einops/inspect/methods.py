"""The explanation methods, one registry: each turns a model's batch into one map per image on the patch grid,
(b, gh, gw), where a larger value says "this patch matters more". Figures, the explorer and the faithfulness
scores read this registry, so a method added here is drawn and scored without further code.

Every method reads the tokens by the input's :class:`~vit_einops.network.patch_embed.TokenLayout`: a model with a
class token is explained by the class token's row, a model without one (SigLIP, mean pooling) by the mean over the
patch rows (:func:`~vit_einops.inspect.patch_attention_grid`). Prefix tokens (registers, distillation) never
appear on the grid.

Axes: b images, gh gw the patch grid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from ..base.checks import (
    check_choice,
    check_int,
    check_nonnegative_float,
    check_positive_float,
    check_probability,
    check_real_in_range,
)
from ..base.threads import follow_free_cores
from ..inputs import model_inputs
from ..network.patch_embed import TokenLayout
from ..network.sizes import check_model_forward
from ..prediction import check_finite_logits
from .decompose import decompose, not_decomposable
from .gradcam import grad_cam
from .integrated_gradients import MAX_STEPS, PATH_BASELINES, QUADRATURES, integrated_gradients, patch_sums
from .lrp import LINEAR_GAMMA, PATCH_GAMMA, STABILIZER, lrp
from .record import AttentionRecorder
from .relevance import attention_gradients, relevance_from_gradients
from .rollout import HEAD_FUSIONS, attention_rollout, class_attention_grid, gradient_rollout, patch_attention_grid
from .targets import has_classifier, one_class_each
from .tokens import CLASS_TOKEN


def token_grid(matrix: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The map a token-to-token matrix (..., n, n) gives on the patch grid (..., gh, gw): the class token's row
    where the model has one, else the mean of the patch rows."""
    read = class_attention_grid if CLASS_TOKEN in layout.prefix else patch_attention_grid
    return read(matrix, layout)


def _last_attention(model: nn.Module, images: torch.Tensor, target: Any) -> torch.Tensor:
    with torch.no_grad(), AttentionRecorder(model, layers=[-1]) as recorder:
        model(images)
    return token_grid(recorder.maps[0].mean(dim=1), recorder.layout)  # heads averaged: (b, gh, gw)


def class_index(layout: TokenLayout) -> int | None:
    """The class token's position in ``layout``, None where the model has none: the entry discarding spares."""
    return layout.index(CLASS_TOKEN) if CLASS_TOKEN in layout.prefix else None


def recorded_rollout(
    maps: torch.Tensor, layout: TokenLayout, method_params: Mapping[str, Mapping[str, Any]] | None = None
) -> torch.Tensor:
    """The rollout every study view shows (:func:`~vit_einops.inspect.write_report`'s figure and arrays, the
    explorer's pane): :func:`attention_rollout` of recorded maps (l, b, h, n, n) with the "rollout" method's
    parameters from ``method_params`` (the others' defaults), the class token's entry spared from discarding
    -> (b, n, n)."""
    params = METHODS["rollout"].resolve(dict(method_params or {}).get("rollout", {}))
    return attention_rollout(maps, **params, kept=class_index(layout))


def _rollout(
    model: nn.Module, images: torch.Tensor, target: Any, *, residual: float, head_fusion: str, discard_ratio: float
) -> torch.Tensor:
    with torch.no_grad(), AttentionRecorder(model) as recorder:
        model(images)
    layout = recorder.layout
    rollout = attention_rollout(recorder.maps, residual, head_fusion, discard_ratio, class_index(layout))
    return token_grid(rollout, layout)


def _gradient_rollout(model: nn.Module, images: torch.Tensor, target: Any, *, discard_ratio: float) -> torch.Tensor:
    _, maps, grads, targets = attention_gradients(model, images, target)
    one_class_each(targets, "gradient rollout")
    layout = model.patch_embed.layout(images.shape[-2:])
    return token_grid(gradient_rollout(maps, grads[0], discard_ratio, class_index(layout)), layout)


def _relevance(model: nn.Module, images: torch.Tensor, target: Any, *, start_layer: int) -> torch.Tensor:
    _, maps, grads, targets = attention_gradients(model, images, target)
    one_class_each(targets, "relevance")
    layout = model.patch_embed.layout(images.shape[-2:])
    return token_grid(relevance_from_gradients(maps, grads[:1], start_layer)[0], layout)


def _grad_cam(model: nn.Module, images: torch.Tensor, target: Any, *, layer: int) -> torch.Tensor:
    return grad_cam(model, images, target, layer=layer, preprocessed=True)


def _integrated_gradients(
    model: nn.Module, images: torch.Tensor, target: Any, *, baseline: str, steps: int, quadrature: str
) -> torch.Tensor:
    attributions = integrated_gradients(
        model, images, target, baseline=baseline, steps=steps, quadrature=quadrature, preprocessed=True
    ).attributions
    return patch_sums(model, attributions)


def _lrp(
    rule: str, model: nn.Module, images: torch.Tensor, target: Any, *, patch_gamma: float, linear_gamma: float,
    stabilizer: float,
) -> torch.Tensor:
    relevance = lrp(
        model, images, target, rule=rule, patch_gamma=patch_gamma, linear_gamma=linear_gamma, stabilizer=stabilizer,
        preprocessed=True,
    )
    return patch_sums(model, relevance)


# The Gamma rule's parameters, as zennit's Gamma and lxt's ViT explanation take them (vit_einops.inspect.lrp).
LRP_PARAMS = {"patch_gamma": PATCH_GAMMA, "linear_gamma": LINEAR_GAMMA, "stabilizer": STABILIZER}
LRP_CHECKS = {
    "patch_gamma": lambda v: check_nonnegative_float("patch_gamma", v),
    "linear_gamma": lambda v: check_nonnegative_float("linear_gamma", v),
    "stabilizer": lambda v: check_positive_float("stabilizer", v),
}


def _decomposition(model: nn.Module, images: torch.Tensor, target: Any) -> torch.Tensor:
    return decompose(model, images, target, by_source=True, preprocessed=True).source_map()


def _random(model: nn.Module, images: torch.Tensor, target: Any, *, seed: int) -> torch.Tensor:
    grid = model.patch_embed.layout(images.shape[-2:]).grid
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(len(images), *grid, generator=generator, dtype=torch.float64)


@dataclass(frozen=True)
class Method:
    """One explanation method: ``compute(model, images, target, **params)`` on the model's batch -> (b, gh, gw).

    ``gradient``: whether it differentiates a target (a class logit or a backbone target's score); the others
    read the attention alone and ignore ``target``. ``params`` are its keyword parameters and their defaults,
    ``checks`` each parameter's check (value -> checked value), ``reference`` the paper or code it follows.
    ``refuses(model)`` says why it cannot read ``model`` (a clause after "it"), "" where it can; None: it reads any
    model of the package."""

    name: str
    compute: Callable[..., torch.Tensor]
    gradient: bool
    reference: str
    params: Mapping[str, Any] = field(default_factory=dict)
    checks: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    refuses: Callable[[nn.Module], str] | None = None

    def resolve(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Its parameters with ``params`` over the defaults, each checked; an unknown name is a TypeError."""
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            raise TypeError(f"method {self.name!r} takes no parameter {', '.join(unknown)} (its parameters: {known})")
        return {k: self.checks[k](v) if k in self.checks else v for k, v in {**self.params, **params}.items()}

    def label(self, params: Mapping[str, Any] | None = None, *, every: bool = False) -> str:
        """Its name with the parameters that differ from the defaults, for titles: ``rollout (head_fusion max)``;
        with ``every``, all of its parameters: ``rollout (residual 0.5, head_fusion max, discard_ratio 0)``."""
        resolved = self.resolve(params or {})
        shown = [f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in resolved.items()
                 if every or v != self.params[k]]
        return f"{self.name} ({', '.join(shown)})" if shown else self.name


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("attention", _last_attention, False, "the last layer's attention, heads averaged (a baseline)"),
        Method(
            "rollout", _rollout, False,
            "Abnar and Zuidema 2020, attention rollout; head_fusion and discard_ratio as jacobgil/vit-explain",
            params={"residual": 0.5, "head_fusion": "mean", "discard_ratio": 0.0},
            checks={
                "residual": lambda v: check_real_in_range("residual", v, 0.0, 1.0),
                "head_fusion": lambda v: check_choice("head_fusion", v, HEAD_FUSIONS),
                "discard_ratio": lambda v: check_probability("discard_ratio", v),
            },
        ),
        Method(
            "gradient-rollout", _gradient_rollout, True, "jacobgil/vit-explain, gradient attention rollout",
            params={"discard_ratio": 0.9}, checks={"discard_ratio": lambda v: check_probability("discard_ratio", v)},
        ),
        Method(
            "relevance", _relevance, True, "Chefer, Gur and Wolf 2021, gradient-weighted relevance",
            params={"start_layer": 0}, checks={"start_layer": lambda v: check_int("start_layer", v)},
        ),
        Method(
            "grad-cam", _grad_cam, True, "Selvaraju et al. 2017, Grad-CAM on the last block's first LayerNorm",
            params={"layer": -1}, checks={"layer": lambda v: check_int("layer", v)},
        ),
        Method(
            "integrated-gradients", _integrated_gradients, True,
            "Sundararajan, Taly and Yan 2017, Integrated Gradients in the input space as captum's, summed per patch",
            params={"baseline": "black", "steps": 50, "quadrature": "gausslegendre"},
            checks={
                "baseline": lambda v: check_choice("baseline", v, PATH_BASELINES),
                "steps": lambda v: check_int("steps", v, 1, MAX_STEPS),
                "quadrature": lambda v: check_choice("quadrature", v, QUADRATURES),
            },
        ),
        Method(
            "attnlrp", partial(_lrp, "attnlrp"), True,
            "Achtibat et al. 2024, AttnLRP as lxt 2.1 computes it: identity rule on LayerNorm and GELU, uniform rule "
            "on attention's matmuls, zennit's Gamma on the patch embedding and the MLP and head Linears; summed per patch",
            params=LRP_PARAMS, checks=LRP_CHECKS,
        ),
        Method(
            "cp-lrp", partial(_lrp, "cp-lrp"), True,
            "Ali et al. 2022, CP-LRP as lxt 2.1 explains torchvision's ViT: AttnLRP's rules with q and k held "
            "constant in attention; summed per patch",
            params=LRP_PARAMS, checks=LRP_CHECKS,
        ),
        Method(
            "decomposition", _decomposition, True,
            "Gandelsman et al. 2024, every head's direct share of the score from each patch, summed (exact, the "
            "final norm's scale observed)",
            refuses=not_decomposable,
        ),
        Method(
            "random", _random, False, "uniform noise on the grid, seeded (the baseline every method must beat)",
            params={"seed": 0}, checks={"seed": lambda v: check_int("seed", v)},
        ),
    )
}


def explain(
    model: nn.Module, images: Any, method: str = "relevance", target: Any = None, *,
    preprocessed: bool | None = None, **params: Any,
) -> torch.Tensor:
    """Method ``method`` of :data:`METHODS` on ``images`` -> (b, gh, gw), float, on the input's patch grid.

    Args:
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them (``preprocessed``: how a float tensor is taken).
        target: for a gradient method, what it explains: None (the predicted class), a class index or one per
            image (b,), or a backbone target (see :func:`~vit_einops.inspect.attention_gradients`).
        params: the method's own parameters (``METHODS[method].params``).

    Maps that are not finite (nan or inf: from the model's weights, where its activations or gradients overflow) are
    refused with a ValueError naming the method, the first such image and the likely cause.
    """
    check_choice("method", method, METHODS)
    chosen = METHODS[method]
    if isinstance(target, torch.Tensor) and target.ndim > 1:
        raise ValueError(f"explain takes one target per image: an int, (b,) or a backbone target, got shape "
                         f"{tuple(target.shape)}")
    resolved = chosen.resolve(params)
    batch = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, batch, kept=len(model.blocks), grad=chosen.gradient)
    was_training = model.training
    model.eval()
    try:
        maps = chosen.compute(model, batch, target, **resolved)
    finally:
        model.train(was_training)
    # Every method's maps leave through here: nan or inf would rank, draw and score as if they meant something.
    check_finite_logits(batch, maps, f"maps of method {method!r}")
    return maps


# Why explain_all leaves the gradient methods out, for the figure and the page that would have drawn them; the
# flags are the study commands' (inspect, explore, faithfulness), the keyword the Python functions'.
TARGET_NEEDED = (
    "need a target: this model has no classifier; pass --target-embedding FILE, --target-image PATH or "
    "--target-patch ROW,COL (target= in Python)"
)


def unexplained(model: nn.Module, target: Any) -> dict[str, str]:
    """The methods of :data:`METHODS` :func:`explain_all` leaves out for ``model`` and ``target``, each with why (a
    clause after "they" or "it"): every gradient method for a model without a classifier (pooled features or an
    embedding head) and no target, which gives them nothing to differentiate (:data:`TARGET_NEEDED`); a method that
    cannot read this model, for its own reason (``Method.refuses``)."""
    no_score = target is None and not has_classifier(model)
    left_out = {}
    for name, method in METHODS.items():
        why = TARGET_NEEDED if method.gradient and no_score else method.refuses(model) if method.refuses else ""
        if why:
            left_out[name] = why
    return left_out


def left_out_clauses(left_out: Mapping[str, str]) -> list[tuple[str, str]]:
    """:func:`unexplained`'s methods grouped by their reason: ("grad-cam, relevance", "they need a target: ...")
    pairs, the pronoun agreeing with the count, for the figures, the page and the commands to say."""
    groups: dict[str, list[str]] = {}
    for name, why in left_out.items():
        groups.setdefault(why, []).append(name)
    return [(", ".join(names), f"{'they' if len(names) > 1 else 'it'} {why}") for why, names in groups.items()]


def explain_all(
    model: nn.Module, images: Any, target: Any = None, params: Mapping[str, Mapping[str, Any]] | None = None, *,
    preprocessed: bool | None = None, given: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Every method of :data:`METHODS` that applies, by name -> (b, gh, gw), as :func:`explain` gives them.

    ``params`` maps a method's name to its parameters (the others take their defaults); ``target`` is what the
    gradient methods explain. A model without a classifier has nothing for them to explain unless ``target`` is a
    backbone target: they are left out then (:func:`unexplained` names them, :data:`TARGET_NEEDED` says
    why). Label a map with ``METHODS[name].label(params[name], every=True)``. ``given`` maps a method's name to its
    map already computed for these images with its parameters (a study's decomposition, a target's relevance): taken
    as it is where the method applies, refused as :func:`explain` refuses a map that is not finite.
    """
    params, given = dict(params or {}), dict(given or {})
    for what, names in (("params", params), ("given", given)):
        unknown = sorted(set(names) - set(METHODS))
        if unknown:
            known = ", ".join(map(repr, METHODS))
            raise ValueError(f"unknown method {', '.join(map(repr, unknown))} in {what}; expected some of {known}")
    batch = model_inputs(model, images, preprocessed=preprocessed)
    left_out = unexplained(model, target)
    maps = {}
    for name in METHODS:
        if name in given and name not in left_out:
            check_finite_logits(batch, given[name], f"maps of method {name!r}")
            maps[name] = given[name]
        elif name not in left_out:
            follow_free_cores()  # a command's thread policy, between methods (nothing without one)
            maps[name] = explain(model, batch, name, target, preprocessed=True, **params.get(name, {}))
    return maps
