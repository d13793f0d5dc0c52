"""Faithfulness of explanation maps: remove the patches a map ranks first, and see how fast the model's answer goes.

Every method of :data:`~vit_einops.inspect.METHODS` is scored on the same images, beside the random map, by four
curves, each summed into an area under the curve (AUC):

- **deletion** (Petsiuk, Das and Saenko 2018, RISE): remove the patches most relevant first; y is the softmax
  probability of the target class t. A faithful map makes it fall fast: lower is better.
- **insertion** (RISE): start from an image with every patch removed, put the patches back most relevant first;
  y as for deletion. Higher is better.
- **positive perturbation** (Chefer, Gur and Wolf 2021, ``baselines/ViT/pertubation_eval_from_hdf5.py``): remove
  0%, 10%, ..., 90% of the patches, most relevant first; y is 1 where the model's top-1 class is still t, else 0
  (its mean over the images is their top-1 accuracy against t). Lower is better.
- **negative perturbation** (the same): remove the least relevant first. Higher is better.

The convention, in full:

- t is the model's predicted class on the unperturbed image (or the class ``target`` names). For a model without a
  classifier (``num_classes`` 0) y is a backbone target's score s (:mod:`~vit_einops.inspect.targets`: a cosine
  similarity) in all four curves, since there is no class to keep; such a model without a target is refused.
- The unit removed is a patch of the input's grid (the maps live there). A removed patch takes the baseline colour
  in every pixel, in the model's input space (after its normalisation): by default (``baseline="mean"``) each
  channel's mean over the scored images, the colour that says least about any one of them; ``"zero"`` is 0 there,
  RISE's deletion substrate, the same colour where the normalisation's mean is the data's (ImageNet's models on
  ImageNet photos) but the background itself for a model fed raw pixels, such as the digits model, where removing a
  blank patch then changes nothing and a map that ranks blank patches high (evidence that ink is absent) scores as
  unfaithful. Insertion starts from the all-baseline image (RISE blurs the image instead; with one baseline,
  deletion's last point is insertion's first, and its first is insertion's last).
- Patches are ordered by their map value; equal values in a random order drawn from ``seed``.
- Point k of S removes (or, for insertion, keeps) floor(k P / S) of the P patches, at x = k / S, the fraction of
  the way: for deletion and insertion k = 0..S (``steps`` S, by default P: one patch a step, from the whole image
  to none of it); for positive and negative perturbation S = 10 and k = 0..9 (0% to 90%, as Chefer et al.).
- The 0% point enters every curve: deletion, positive and negative start at the whole image, insertion ends there
  (Chefer et al. add it too, in their words on their issue 31; their script's steps start at 10%).
- AUC = the trapezoid rule over those points, x in [0, 1]: deletion and insertion span [0, 1] (RISE's normalised
  AUC); positive and negative span [0, 0.9], so their AUC is at most 0.9: Chefer et al.'s table entries are 100
  times it (their ``np.trapz(y, x) * 100``; they remove pixels of the upsampled map, here whole patches).
- Each method's AUC is the mean over the images, with a 95% percentile-bootstrap interval over the images
  (:mod:`vit_einops.base.bootstrap`, seeded).

Axes: b images, P patches (gh gw the grid), K points of a curve, J perturbed copies.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from einops import repeat
from torch import nn

from ..base.bootstrap import bootstrap_interval
from ..base.checks import INT64_MIN, check_choice, check_int, check_positive_int
from ..base.plot import new_figure
from ..base.threads import follow_free_cores
from ..inputs import model_inputs
from ..prediction import check_finite_outputs
from ..network.sizes import check_forward_memory
from .methods import METHODS, explain
from .targets import BACKBONE_TARGETS, EmbeddingTarget, class_targets, one_class_each, resolve_target, target_scores

PERTURBATION_STEPS = 10  # Chefer et al.'s 0%, 10%, ..., 90%
RANDOM = "random"  # the method every other is read against, scored whether asked for or not
BASELINES = ("mean", "zero")


@dataclass(frozen=True)
class Metric:
    """One curve: patches ordered ``first`` ("most" or "least" relevant first), removed (``insert`` False) or put
    back onto the all-baseline input (True), at 0%, 10%, ..., 90% (``tenths``) or in the caller's steps; y the
    target's ``score`` ("probability" or "top-1"); ``better`` "lower" or "higher" AUC."""

    name: str
    first: str
    insert: bool
    tenths: bool
    score: str
    better: str
    reference: str


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("deletion", "most", False, False, "probability", "lower", "Petsiuk, Das and Saenko 2018 (RISE)"),
        Metric("insertion", "most", True, False, "probability", "higher", "Petsiuk, Das and Saenko 2018 (RISE)"),
        Metric("positive", "most", False, True, "top-1", "lower", "Chefer, Gur and Wolf 2021, positive perturbation"),
        Metric("negative", "least", False, True, "top-1", "higher", "Chefer, Gur and Wolf 2021, negative perturbation"),
    )
}


def curve_points(metric: str, patches: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (K,) float64, patches removed or kept at each point (K,) long) of ``metric`` on a grid of ``patches``:
    floor(k P / S) at x = k / S (module docstring)."""
    if METRICS[metric].tenths:
        k, total = torch.arange(PERTURBATION_STEPS), PERTURBATION_STEPS
    else:
        k, total = torch.arange(steps + 1), steps
    return k.double() / total, k * patches // total


def patch_ranks(maps: torch.Tensor, seed: int) -> torch.Tensor:
    """maps (b, gh, gw) -> ranks (2, b, P): each patch's place (0 first) most relevant first, then least relevant
    first; patches of equal value in an order drawn from ``seed``."""
    flat = maps.flatten(1)
    b, p = flat.shape
    generator = torch.Generator().manual_seed(seed)
    shuffle = torch.rand(b, p, generator=generator, dtype=torch.float64).argsort(dim=1)
    shuffled = flat.gather(1, shuffle)
    ranks = []
    for descending in (True, False):
        order = shuffle.gather(1, shuffled.argsort(dim=1, descending=descending, stable=True))
        ranks.append(torch.empty_like(order).scatter_(1, order, torch.arange(p).expand(b, p)))
    return torch.stack(ranks)


@dataclass(frozen=True)
class Faithfulness:
    """Scores of explanation methods on the same images (module docstring).

    ``methods``: label -> (method name, its parameters); ``x``: metric -> the curve's points (K,); ``curves``:
    label -> metric -> y (b, K); ``aucs``: label -> metric -> (b,); ``score``: what y is, in words; ``patches``,
    ``steps``, ``seed`` as given; ``baseline`` and ``colour`` (C,): what a removed patch became; ``backbone``: y is
    a backbone target's score in every curve."""

    methods: dict[str, tuple[str, dict[str, Any]]]
    x: dict[str, torch.Tensor]
    curves: dict[str, dict[str, torch.Tensor]]
    aucs: dict[str, dict[str, torch.Tensor]]
    score: str
    patches: int
    steps: int
    seed: int
    baseline: str
    colour: tuple[float, ...]
    backbone: bool

    @property
    def images(self) -> int:
        return len(next(iter(self.curves.values()))["deletion"])

    @cached_property
    def summary(self) -> dict[str, dict[str, tuple[float, float | None, float | None]]]:
        """label -> metric -> (mean AUC over the images, the 95% bootstrap interval's low and high; None for one
        image)."""
        result = {}
        for label, per_metric in self.aucs.items():
            result[label] = {}
            for metric, values in per_metric.items():
                values = values.tolist()
                low, high = (None, None) if len(values) < 2 else bootstrap_interval(values, statistics.fmean,
                                                                                    seed=self.seed)
                result[label][metric] = (statistics.fmean(values), low, high)
        return result

    def table(self) -> str:
        """A text table: one row per method, one column per metric, the mean AUC and its 95% interval."""
        summary = self.summary
        heads = [f"{m} ({METRICS[m].better} better)" for m in METRICS]
        cells = [[_cell(*summary[label][m]) for m in METRICS] for label in summary]
        first = max(len("method"), *(len(label) for label in summary))
        widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]
        lines = ["  ".join(["method".ljust(first), *(h.ljust(w) for h, w in zip(heads, widths, strict=True))])]
        for label, row in zip(summary, cells, strict=True):
            lines.append("  ".join([label.ljust(first), *(c.ljust(w) for c, w in zip(row, widths, strict=True))]))
        lines += [
            f"mean AUC over {self.images} image{'s' * (self.images != 1)} [95% bootstrap interval]",
            f"{self.patches} patches: deletion and insertion in {self.steps} steps, positive and negative at 0%, 10%,"
            " ..., 90%; the 0% point included",
            f"a removed patch: {self._baseline()}",
            f"y: {self.score}",
        ]
        return "\n".join(line.rstrip() for line in lines)

    def _baseline(self) -> str:
        colour = ", ".join(f"{c:.3g}" for c in self.colour)
        what = "each channel's mean over the images" if self.baseline == "mean" else "0"
        return f"baseline {self.baseline} ({what}: {colour} in the model's input)"

    def to_json(self) -> dict[str, Any]:
        """Everything, as JSON-ready values: the convention, each method's per-image AUCs, mean and interval, and
        its mean curves."""
        summary = self.summary
        return {
            "convention": {
                "score": self.score,
                "removed_patch": self._baseline(),
                "baseline": self.baseline,
                "baseline_colour": list(self.colour),
                "insertion_start": "every patch removed",
                "order": "by map value, ties in an order drawn from the seed",
                "zero_point_included": True,
                "auc": "trapezoid over x, the fraction of the steps: [0, 1] for deletion and insertion, [0, 0.9] "
                "for positive and negative",
                "interval": "95% percentile bootstrap over the images",
                "metrics": {m.name: {"better": m.better, "score": m.score, "first": m.first, "reference": m.reference}
                            for m in METRICS.values()},
            },
            "images": self.images,
            "patches": self.patches,
            "steps": self.steps,
            "seed": self.seed,
            "x": {metric: x.tolist() for metric, x in self.x.items()},
            "methods": {
                label: {
                    "name": name,
                    "params": params,
                    "auc": {
                        metric: dict(zip(("mean", "low", "high"), summary[label][metric], strict=True),
                                     per_image=self.aucs[label][metric].tolist())
                        for metric in METRICS
                    },
                    "mean_curve": {metric: self.curves[label][metric].mean(0).tolist() for metric in METRICS},
                }
                for label, (name, params) in self.methods.items()
            },
        }

    def plot(self):
        """A Figure: each metric's mean curve per method, labelled with its AUC and interval."""
        summary = self.summary
        fig = new_figure(figsize=(10, 7.5))
        for ax, metric in zip(fig.subplots(2, 2).flat, METRICS.values(), strict=True):
            for label in self.methods:
                mean, low, high = summary[label][metric.name]
                style = dict(color="grey", linestyle="--") if label == RANDOM else {}
                ax.plot(self.x[metric.name], self.curves[label][metric.name].mean(0),
                        label=f"{label}: {_cell(mean, low, high)}", **style)
            what = "kept" if metric.insert else "removed"
            ax.set(xlabel=f"fraction of the patches {what} ({metric.first} relevant first)",
                   ylabel="the target's score" if self.backbone else metric.score,
                   title=f"{metric.name} ({metric.better} AUC is better)")
            ax.legend(fontsize=7)
        fig.suptitle(f"faithfulness over {self.images} images: mean curves, AUC [95% interval]")
        return fig


def _cell(mean: float, low: float | None, high: float | None) -> str:
    return f"{mean:.3f}" if low is None else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def chosen_methods(methods: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """``methods`` (None: all; a name; names or (name, params) pairs; a mapping name -> params) -> label -> (name,
    checked params); the random map always among them, with its default seed unless ``methods`` gives its own."""
    if methods is None:
        methods = list(METHODS)
    elif isinstance(methods, str):
        methods = [methods]
    elif isinstance(methods, Mapping):
        methods = list(methods.items())
    elif not isinstance(methods, Iterable):
        raise TypeError(f"methods must be None, a method name, a list of names or (name, params) pairs, or a mapping "
                        f"name -> params, got {type(methods).__name__}")
    pairs = [_method_pair(item) for item in methods]
    chosen: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, params in [*pairs, *([] if any(name == RANDOM for name, _ in pairs) else [(RANDOM, {})])]:
        label = METHODS[name].label(params)
        if label in chosen:
            raise ValueError(f"method {label!r} is given twice")
        chosen[label] = (name, METHODS[name].resolve(params))
    return chosen


def _method_pair(item: Any) -> tuple[str, Mapping[str, Any]]:
    """A name or a (name, params) pair -> (a method's name, its parameters), each checked."""
    if isinstance(item, str):
        name, params = item, {}
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        name, params = item
    else:
        raise TypeError(f"each method must be a name or a (name, params) pair, got {type(item).__name__} {item!r:.60}")
    check_choice("method", name, METHODS)
    if not isinstance(params, Mapping):
        raise TypeError(f"the parameters of method {name!r} must be a mapping, got {type(params).__name__}")
    return name, params


class _Scorer:
    """y of perturbed copies: the target class's probability and top-1 hit for a classifier, a backbone target's
    score s for both otherwise."""

    def __init__(self, model: nn.Module, images: torch.Tensor, target: Any, batch_size: int) -> None:
        self.model = model
        self.backbone = isinstance(target, BACKBONE_TARGETS)
        target = resolve_target(model, target, len(images))
        if self.backbone:
            self.target, self.description = target, "the backbone target's score"
        else:
            with torch.no_grad():
                logits = torch.cat([model(chunk) for chunk in images.split(batch_size)])
            self.target = one_class_each(class_targets(target, logits), "faithfulness")
            self.description = "softmax probability of the class (positive and negative: top-1 hit)"

    def for_images(self, index: torch.Tensor) -> Any:
        """The target of the images ``index``: class indices (len(index),) or a backbone target."""
        if not self.backbone:
            return self.target[index]
        if isinstance(self.target, EmbeddingTarget) and self.target.vector.ndim == 2 and len(self.target.vector) > 1:
            return EmbeddingTarget(self.target.vector[index])
        return self.target

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies x of the images ``index`` -> (probability or s, top-1 hit or s), each (len(x),) float64."""
        target = self.for_images(index)
        if self.backbone:
            s = target_scores(self.model, x, target)[1].double()
            return s, s
        logits = self.model(x).double()
        probability = F.softmax(logits, dim=-1).gather(1, target[:, None])[:, 0]
        return probability, (logits.argmax(dim=-1) == target).double()


def _maps(model: nn.Module, images: torch.Tensor, name: str, params: dict[str, Any], scorer: _Scorer,
          batch_size: int, seed: int) -> torch.Tensor:
    """Method ``name``'s maps (b, gh, gw), in chunks of ``batch_size`` images. A method that takes a seed (the random
    map) gets seed + i for image i, one image at a time, so that no image's map depends on the batching."""
    seeded = "seed" in METHODS[name].params
    size = 1 if seeded else batch_size
    maps = []
    for start in range(0, len(images), size):
        follow_free_cores()  # a command's thread policy, between chunks (nothing without one)
        index = torch.arange(start, min(start + size, len(images)))
        chunk_params = params
        if seeded:  # the sum wrapped into int64, the seeds' range: two valid seeds make one, whatever their values
            chunk_params = {**params, "seed": (params["seed"] + seed + start - INT64_MIN) % 2**64 + INT64_MIN}
        maps.append(explain(model, images[index], name, scorer.for_images(index), preprocessed=True, **chunk_params))
    return torch.cat(maps)  # finite: explain refuses maps that are not


def faithfulness(
    model: nn.Module,
    images: Any,
    methods: Any = None,
    target: Any = None,
    *,
    preprocessed: bool | None = None,
    steps: int | None = None,
    baseline: str = "mean",
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> Faithfulness:
    """Deletion, insertion, positive and negative perturbation AUCs of each method on ``images`` (module docstring).

    Args:
        images: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict` takes
            them (``preprocessed``: how a float tensor is taken).
        methods: None (every method of :data:`METHODS` that reads ``model``: ``Method.refuses``), a name, a list of names and (name, params) pairs, e.g.
            ``["relevance", ("rollout", {"head_fusion": "max"})]``, or a mapping name -> params, e.g.
            ``{"relevance": {}, "rollout": {"head_fusion": "max"}}``. The random map is always scored beside them.
        target: None (each image's predicted class), a class index or one per image (b,), or a backbone target
            (:class:`EmbeddingTarget`, :class:`ImageTarget`, :class:`PatchTarget`), which a model with
            ``num_classes`` 0 needs.
        steps: deletion's and insertion's steps S, 1 to the P patches (default P: one patch a step).
        baseline: what a removed patch becomes, in the model's input space: "mean" (each channel's mean over
            ``images``) or "zero" (module docstring).
        batch_size: images per explanation chunk and perturbed copies per forward pass (each is checked against
            the memory budget before it runs).
        seed: the order of patches of equal value, the random map's seed (added to its own), the intervals.
        progress: a tqdm bar on stderr.
    """
    chosen = chosen_methods(methods)
    for label, (name, _) in list(chosen.items()):  # a method that cannot read this model: left out, or refused if asked
        why = METHODS[name].refuses(model) if METHODS[name].refuses else ""
        if why and methods is not None:
            raise ValueError(f"method {name!r} {why}")
        if why:
            del chosen[label]
    batch_size = check_positive_int("batch_size", batch_size)
    seed = check_int("seed", seed)
    images = model_inputs(model, images, preprocessed=preprocessed)
    check_choice("baseline", baseline, BASELINES)
    colour = images.mean(dim=(0, 2, 3)) if baseline == "mean" else images.new_zeros(images.shape[1])
    layout = model.patch_embed.layout(images.shape[-2:])
    (gh, gw), (height, width) = layout.grid, images.shape[-2:]
    patches = gh * gw
    steps = patches if steps is None else check_int("steps", steps, 1, patches)
    points = {m: curve_points(m, patches, steps) for m in METRICS}
    check_forward_memory(model.config, min(batch_size, len(images) * sum(len(k) for _, k in points.values())))
    was_training = model.training
    model.eval()
    try:
        scorer = _Scorer(model, images, target, batch_size)
        curves, aucs = {}, {}
        jobs = _jobs(len(images), points)
        bar = _bar(progress, len(chosen) * -(-len(jobs[0]) // batch_size))
        try:
            for label, (name, params) in chosen.items():
                if bar is not None:
                    bar.set_description(f"faithfulness: {label}")
                ranks = patch_ranks(_maps(model, images, name, params, scorer, batch_size, seed), seed)
                y = _perturbed_scores(scorer, images, colour, ranks, jobs, batch_size, (height // gh, width // gw), bar)
                curves[label], aucs[label] = {}, {}
                for metric, part in zip(METRICS, y.split([len(images) * len(k) for _, k in points.values()]),
                                        strict=True):
                    curves[label][metric] = part.view(len(images), -1)
                    aucs[label][metric] = torch.trapezoid(curves[label][metric], points[metric][0], dim=-1)
        finally:
            if bar is not None:
                bar.close()
    finally:
        model.train(was_training)
    x = {metric: xs for metric, (xs, _) in points.items()}
    return Faithfulness(chosen, x, curves, aucs, scorer.description, patches, steps, seed, baseline,
                        tuple(colour.tolist()), scorer.backbone)


def _jobs(b: int, points: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Every perturbed copy of every metric, in metric, image, point order: image (J,); order (J,): 0 most relevant
    first, 1 least; count (J,): patches removed or kept; insert (J,): whether count is what is kept; top1 (J,):
    whether y is the top-1 hit rather than the probability."""
    image, order, count, insert, top1 = [], [], [], [], []
    for metric, (_, counts) in points.items():
        spec, copies = METRICS[metric], b * len(counts)
        image.append(torch.arange(b).repeat_interleave(len(counts)))
        count.append(counts.repeat(b))
        order.append(torch.full((copies,), 0 if spec.first == "most" else 1))
        insert.append(torch.full((copies,), spec.insert))
        top1.append(torch.full((copies,), spec.score == "top-1"))
    return tuple(torch.cat(parts) for parts in (image, order, count, insert, top1))


def _perturbed_scores(
    scorer: _Scorer, images: torch.Tensor, colour: torch.Tensor, ranks: torch.Tensor, jobs: tuple[torch.Tensor, ...],
    batch_size: int, patch: tuple[int, int], bar: Any,
) -> torch.Tensor:
    """y (J,) of every copy: image ``image`` with the patches of rank < count kept (insert) or removed (else), a
    removed patch's pixels set to ``colour`` (C,)."""
    image, order, count, insert, top1 = jobs
    gh = images.shape[-2] // patch[0]
    y = torch.empty(len(image), dtype=torch.float64)
    for start in range(0, len(image), batch_size):
        follow_free_cores()
        part = slice(start, start + batch_size)
        rank = ranks[order[part], image[part]]  # (B, P)
        keep = torch.where(insert[part, None], rank < count[part, None], rank >= count[part, None])
        mask = repeat(keep, "B (gh gw) -> B 1 (gh p1) (gw p2)", gh=gh, p1=patch[0], p2=patch[1])
        copies = torch.where(mask, images[image[part]], colour[:, None, None])
        probability, hit = scorer(copies, image[part])
        values = torch.where(top1[part], hit, probability)
        check_finite_outputs("model's scores of perturbed copies", values,
                             f"among copies of images {image[part].unique().tolist()} with patches removed")
        y[part] = values
        if bar is not None:
            bar.update()
    return y


def _bar(progress: bool, total: int) -> Any:
    """A tqdm bar of ``total`` forward batches on stderr, or None without ``progress`` (tqdm is then not needed)."""
    if not progress:
        return None
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc="faithfulness", unit="batch", file=sys.stderr, dynamic_ncols=True)
