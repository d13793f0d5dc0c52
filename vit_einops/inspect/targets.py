"""Targets for a model without a classifier (DINO, DINOv2, CLIP and SigLIP towers: ``num_classes`` 0, the output
is pooled features; or a head that projects them into an embedding, as CLIP's image tower with its projection:
``ViTConfig.embedding``): what the relevance functions differentiate when there is no class logit.

Each target gives one scalar per image, s_b, built from what the model computes on the image:

- :class:`EmbeddingTarget` (e (D_out,), or one per image (b, D_out)): ``s_b = cos(y_b, e_b)``, y = ``model(x)``,
  the pooled features or the projection (a CLIP or SigLIP image embedding, or a text embedding of that size);
- :class:`ImageTarget` (another image): the same, with e the other image's ``model(x')``, computed by the same
  model beforehand;
- :class:`PatchTarget` (row, col of the input's patch grid): ``s_b = mean_j cos(z_bj, z_bp)``, z the final normed
  patch tokens (:meth:`~vit_einops.network.model.ViT.forward_features`, prefix tokens dropped), p the chosen patch,
  j every patch (p included; its term is 1). The map ``cos(z_bj, z_bp)`` over j is DINO's correspondence picture
  (:func:`patch_similarity`); relevance differentiates its mean, through both z_j and z_p.

A class index (an int, or integer tensors) names a class of a classifier's logits; a model without a classifier
(:func:`has_classifier`) refuses one, and refuses no target where a tool needs one (:func:`no_classifier_error`).
"""

from __future__ import annotations

import io
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..base.checks import check_dense_tensor, check_nonnegative_int
from ..base.io import read_regular_file
from ..inputs import model_inputs
from ..network.patch_embed import TokenLayout
from ..network.sizes import check_model_forward

MAX_EMBEDDING_BYTES = 64 << 20  # an embedding file: a few vectors of a few thousand floats, far below this
TARGET_KINDS = (
    "EmbeddingTarget(vector) (--target-embedding FILE), ImageTarget(image) (--target-image PATH) or "
    "PatchTarget(row, col) (--target-patch ROW,COL)"
)


def has_classifier(model: torch.nn.Module) -> bool:
    """Whether ``model``'s outputs are class logits: a ViT's :attr:`~vit_einops.ViT.has_classifier` (not pooled
    features, not an embedding projection such as CLIP's), else whether its ``num_classes`` is not 0."""
    return getattr(model, "has_classifier", getattr(model, "num_classes", None) != 0)


def no_classifier_error(what: str, model: torch.nn.Module | None = None) -> ValueError:
    """The refusal of a class target (or of none) by a ``model`` whose outputs are no class logits."""
    width = getattr(model, "num_classes", 0)
    output = (
        f"its head is an embedding projection: its output is a {width}-wide embedding, not class logits"
        if width
        else "num_classes 0: its output is pooled features"
    )
    return ValueError(
        f"this model has no classifier ({output}), so {what}; give a target that fits a backbone: {TARGET_KINDS}"
    )


class EmbeddingTarget:
    """The cosine similarity between the model's output and ``vector``: (D_out,) for every image, or (b, D_out),
    one per image. Float, finite and of non-zero norm."""

    def __init__(self, vector: Any) -> None:
        if isinstance(vector, np.ndarray):
            vector = torch.from_numpy(vector)
        check_dense_tensor("the target embedding", vector)
        if not vector.is_floating_point() or vector.ndim not in (1, 2) or 0 in vector.shape:
            raise ValueError(
                f"the target embedding must be a float vector (D,) or one per image (b, D), got {vector.dtype} "
                f"shape {tuple(vector.shape)}"
            )
        vector = vector.detach()
        if not torch.isfinite(vector).all():
            raise ValueError("the target embedding holds non-finite values (nan or inf)")
        if (vector.norm(dim=-1) == 0).any():
            raise ValueError("the target embedding has norm 0: its cosine similarity is undefined")
        self.vector = vector

    def __repr__(self) -> str:
        return f"EmbeddingTarget(shape {tuple(self.vector.shape)})"

    def check_count(self, images: int, *, of_images: bool = False) -> None:
        """ValueError unless this target serves ``images`` images: one vector for all of them, or one per image.
        ``of_images``: the vectors are an :class:`ImageTarget`'s outputs, and its images are counted instead."""
        rows = len(self.vector) if self.vector.ndim == 2 else 1
        if rows not in (1, images):
            d = self.vector.shape[-1]
            given, expected = (
                (f"the target image holds {rows} images", f"1 or {images}") if of_images
                else (f"the target embedding holds {rows} vectors", f"({d},) or ({images}, {d})")
            )
            raise ValueError(f"{given} for {images} images; expected {expected}: one for every image, or one per image")

    def scores(self, output: torch.Tensor) -> torch.Tensor:
        """``output`` (b, D_out), the model's -> s (b,)."""
        b, dim = output.shape
        self.check_count(b)
        e = self.vector.to(output.device, output.dtype)
        if e.shape[-1] != dim:
            raise ValueError(
                f"the target embedding has shape {tuple(e.shape)}; this model's output is {dim} wide, so expected "
                f"({dim},) or ({b}, {dim}) for {b} images"
            )
        return F.cosine_similarity(output, e.expand(b, dim), dim=-1)


class ImageTarget:
    """The cosine similarity between the model's output and its output for ``image`` (one image as
    :func:`vit_einops.predict` takes it, or one per image; ``preprocessed`` as there)."""

    def __init__(self, image: Any, *, preprocessed: bool | None = None) -> None:
        self.image, self.preprocessed = image, preprocessed

    def __repr__(self) -> str:
        return f"ImageTarget({self.image!r:.60})"

    @torch.no_grad()
    def embedding(self, model: torch.nn.Module) -> EmbeddingTarget:
        """The other image's output through ``model``, as an :class:`EmbeddingTarget`."""
        image = model_inputs(model, self.image, preprocessed=self.preprocessed, name="the target image")
        check_model_forward(model, image)
        output = model(image)
        return EmbeddingTarget(output[0] if len(output) == 1 else output)


class PatchTarget:
    """The mean cosine similarity of every patch token to patch (``row``, ``col``)'s (see the module docstring)."""

    def __init__(self, row: Any, col: Any) -> None:
        self.row = check_nonnegative_int("target patch row", row)
        self.col = check_nonnegative_int("target patch col", col)

    def __repr__(self) -> str:
        return f"PatchTarget({self.row}, {self.col})"

    def similarity(self, tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """``tokens`` (b, n, D), the final normed tokens of inputs of ``layout`` -> cos(z_j, z_p) (b, gh, gw)."""
        gh, gw = layout.grid
        if self.row >= gh or self.col >= gw:
            raise ValueError(
                f"target patch ({self.row}, {self.col}) is outside the {gh} x {gw} patch grid (rows 0..{gh - 1}, "
                f"cols 0..{gw - 1})"
            )
        patches = tokens[:, layout.num_prefix :]
        chosen = patches[:, self.row * gw + self.col]
        return F.cosine_similarity(patches, chosen[:, None], dim=-1).unflatten(-1, (gh, gw))


BACKBONE_TARGETS = (EmbeddingTarget, ImageTarget, PatchTarget)


def check_study_target(who: str, target: Any) -> None:
    """Refuse a study's ``target`` that is neither None nor a backbone target (:data:`BACKBONE_TARGETS`): a study
    explains its classes itself; ``who`` names the function that took it."""
    if target is not None and not isinstance(target, BACKBONE_TARGETS):
        raise TypeError(f"{who}'s target is a backbone target ({TARGET_KINDS}), got {target!r:.60}")


def target_name(target: EmbeddingTarget | ImageTarget | PatchTarget) -> str:
    """What a target's score is, in words, for figures and the explorer."""
    if isinstance(target, PatchTarget):
        return f"mean cosine similarity of the patches to patch ({target.row}, {target.col})"
    what = "the target image's output" if isinstance(target, ImageTarget) else "the target embedding"
    return f"cosine similarity of the output to {what}"


def class_targets(target: Any, logits: torch.Tensor) -> torch.Tensor:
    """target None | a class index | (b,) | (b, k) -> a (b, k) long tensor of class indices, checked against the
    logits. A class index is an int, numpy's integer scalars and 0-d integer tensors included; bools and floats are
    refused, as in a list or tensor."""
    b, classes = logits.shape
    if target is None:
        return logits.argmax(dim=-1, keepdim=True)
    if isinstance(target, BACKBONE_TARGETS):
        raise TypeError(f"{target!r} is a backbone target, not class indices")
    expected = "None, an integer class index, or integer class indices (b,) or (b, k)"
    if isinstance(target, numbers.Integral) and not isinstance(target, bool):
        if not 0 <= target < classes:  # before torch holds it: an int past int64's range is out of range too
            raise ValueError(f"target classes must be in 0..{classes - 1}, got [{int(target)}]")
        t = torch.tensor(int(target))
    else:
        try:
            t = torch.as_tensor(target)
        except (TypeError, ValueError, RuntimeError) as err:  # a string, ragged lists, ints past int64
            raise TypeError(f"target must be {expected}, got {type(target).__name__} {target!r:.60} ({err})") from None
        check_dense_tensor("target", t)
        if t.numel() == 0:  # before its dtype: torch.as_tensor([]) is float
            raise ValueError(f"target names no class: shape {tuple(t.shape)}; expected at least one per image")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            got = f"{target!r}" if t.ndim == 0 else f"dtype {t.dtype}"
            raise TypeError(f"target must be {expected}, got {got}")
    if t.ndim == 0:
        t = t.expand(b, 1)
    elif t.ndim == 1:
        t = t[:, None]
    if t.ndim != 2 or t.shape[0] != b:
        raise ValueError(f"target must be an int, (b,) or (b, k) with b = {b} images, got shape {tuple(t.shape)}")
    if t.min() < 0 or t.max() >= classes:
        raise ValueError(f"target classes must be in 0..{classes - 1}, got {t.unique().tolist()}")
    return t.long().to(logits.device)


def one_class_each(targets: torch.Tensor, who: str) -> torch.Tensor:
    """(b, k) targets (class indices from :func:`class_targets`, or a backbone target's scores) -> (b,), for a tool
    that explains one class per image; a ValueError naming ``who`` for k above 1."""
    if targets.shape[1] != 1:
        raise ValueError(f"{who} explains one class per image: an int or (b,), got {targets.shape[1]}")
    return targets[:, 0]


def resolve_target(model: torch.nn.Module, target: Any, images: int) -> Any:
    """``target`` as a gradient method differentiates it on ``images`` images: a backbone target (an
    :class:`ImageTarget` resolved to its image's :class:`EmbeddingTarget` through ``model``; an embedding checked to
    serve every image or one each, :meth:`EmbeddingTarget.check_count`), or class indices unchanged; a model without
    a classifier (pooled features, or an embedding projection such as CLIP's) refuses class indices and None
    (:func:`no_classifier_error`)."""
    if not isinstance(target, BACKBONE_TARGETS) and not has_classifier(model):
        what = "there is no predicted class" if target is None else f"target {target!r:.60} names no class"
        raise no_classifier_error(what, model)
    if isinstance(target, ImageTarget):
        resolved = target.embedding(model)
        resolved.check_count(images, of_images=True)
        return resolved
    if isinstance(target, EmbeddingTarget):
        target.check_count(images)
    return target


def target_scores(
    model: torch.nn.Module, images: torch.Tensor, target: EmbeddingTarget | PatchTarget
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the model's output (b, D_out), s (b,) of ``target``) for the model's batch ``images``, differentiable: one
    forward, :meth:`forward_features` then :meth:`forward_head` (an :class:`ImageTarget` is resolved first by
    :meth:`ImageTarget.embedding`)."""
    tokens = model.forward_features(images)
    output = model.forward_head(tokens)
    if isinstance(target, PatchTarget):
        layout = model.patch_embed.layout(images.shape[-2:])
        return output, target.similarity(tokens, layout).flatten(1).mean(dim=-1)
    return output, target.scores(output)


@torch.no_grad()
def patch_similarity(model: torch.nn.Module, images: Any, target: PatchTarget, *, preprocessed: bool | None = None):
    """DINO's correspondence map: cos(z_j, z_p) of every patch j to the chosen patch p, (b, gh, gw) on the
    input's grid; ``images`` as :func:`vit_einops.predict` takes them."""
    if not isinstance(target, PatchTarget):
        raise TypeError(f"patch_similarity takes a PatchTarget, got {type(target).__name__}")
    images = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, images)
    return target.similarity(model.forward_features(images), model.patch_embed.layout(images.shape[-2:]))


def load_embedding(path: str | Path) -> torch.Tensor:
    """A target embedding from a file: ``.pt`` (one tensor, read with ``torch.load(weights_only=True)``), ``.npy``
    (no pickled objects) or ``.safetensors`` (exactly one tensor). A regular file of at most 64 MiB; the vector is
    checked by :class:`EmbeddingTarget`."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".pt", ".npy", ".safetensors"):
        raise ValueError(f"target embedding {str(path)!r}: expected a .pt, .npy or .safetensors file")
    data = read_regular_file(path, MAX_EMBEDDING_BYTES)
    where = f"target embedding {str(path)!r}"
    try:
        if suffix == ".npy":
            vector = torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))
        elif suffix == ".pt":
            vector = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        else:
            from safetensors.torch import load as load_safetensors

            tensors = load_safetensors(data)
            if len(tensors) != 1:
                raise ValueError(f"{where} holds {len(tensors)} tensors ({', '.join(sorted(tensors))}); expected one")
            [vector] = tensors.values()
    except ValueError as err:
        if str(err).startswith(where):
            raise
        raise ValueError(f"{where} cannot be read as {suffix[1:]}: {str(err).splitlines()[0]}") from None
    except Exception as err:  # noqa: BLE001 -- each reader's own error for a malformed file (pickle, header, zip)
        raise ValueError(f"{where} cannot be read as {suffix[1:]}: {type(err).__name__}") from None
    if not isinstance(vector, torch.Tensor):
        raise ValueError(f"{where} holds a {type(vector).__name__}; expected one tensor")
    try:
        return EmbeddingTarget(vector).vector
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def parse_patch(text: str) -> PatchTarget:
    """ "ROW,COL" -> :class:`PatchTarget`."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and p.strip().isascii() for p in parts):
        raise ValueError(f"--target-patch expects ROW,COL (two non-negative integers, e.g. 3,5), got {text!r}")
    return PatchTarget(int(parts[0]), int(parts[1]))

