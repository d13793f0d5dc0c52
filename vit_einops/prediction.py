"""Classify images with any ViT: files, PIL images and pixel tensors go through the model's own preprocessing.

from vit_einops import load_model, predict
model = load_model("vit_b_16.safetensors")
for top in predict(model, ["photo.jpg"], top_k=5):
    print([(p.label, round(p.probability, 3)) for p in top])

:func:`class_name` is how every command and tool names a class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .base.checks import check_positive_int
from .inputs import model_inputs
from .network.model import ViT
from .network.sizes import check_model_forward


class Prediction(NamedTuple):
    index: int  # the logit's index
    label: str  # its class name: class_name(index, model.class_names)
    probability: float  # softmax over all logits


def class_name(index: int, class_names: Sequence[str] | None) -> str:
    """The name of output ``index``: ``class_names[index]``, or "class 3" where none is known (no names, or fewer
    names than outputs: a 1000-way preset trained on the ten digits)."""
    if class_names is not None and 0 <= index < len(class_names):
        return str(class_names[index])
    return f"class {index}"


def check_finite_outputs(name: str, values: torch.Tensor, cause: str) -> None:
    """The one refusal of a model's outputs that are not finite (nan or inf: a ranking, a figure or a page of them
    means nothing), naming what holds them (``name``) and the likely ``cause``."""
    bad = ~torch.isfinite(values.detach())
    if bad.any():
        count = f"{int(bad.sum())} non-finite values (nan or inf) of {values.numel()}"
        raise ValueError(f"the {name} hold {count}: {cause}")


def check_finite_logits(inputs: torch.Tensor, logits: torch.Tensor, name: str = "model's outputs") -> None:
    """:func:`check_finite_outputs` of a batch's logits (or another of the model's per-image results, ``name``: an
    explanation method's maps), naming the first image whose values are not finite and the likely cause: its inputs
    when they are already non-finite (the preprocessing's mean and std), else the weights."""
    bad = (~torch.isfinite(logits.reshape(len(logits), -1))).any(-1).nonzero().flatten().tolist()
    if not bad:
        return
    which = f"image {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
    pixels = (
        "already nan or inf: the preprocessing's mean or std scales them out of range (a std near 0, a huge mean)"
        if not torch.isfinite(inputs[bad[0]]).all()
        else "finite, so the model's weights are the likely cause: huge values that overflow (float32 ends near "
        "3.4e38), or a model that is not a trained ViT"
    )
    check_finite_outputs(name, logits, f"in {which}, whose preprocessed pixels are {pixels}")


@torch.no_grad()
def predict(
    model: ViT, images: Any, top_k: int = 5, batch_size: int = 64, *, preprocessed: bool | None = None
) -> list[list[Prediction]]:
    """The ``top_k`` most probable classes of each image, most probable first.

    ``images``: paths, PIL images, uint8 or float tensors, or a list of them; ``preprocessed`` says how a float
    tensor is taken (False: raw pixels in [0, 1], True: the model's input); see :mod:`vit_einops.inputs`. The
    model is run in eval mode (and put back in the mode it had).
    """
    if not isinstance(model, ViT):
        raise TypeError(f"predict expects a vit_einops.ViT, got {type(model).__name__}")
    check_positive_int("top_k", top_k)
    check_positive_int("batch_size", batch_size)
    config = model.config
    if config.num_classes == 0:
        raise ValueError("this model has no classifier (num_classes 0): it returns features, not classes")
    if config.embedding:
        raise ValueError(
            f"this model outputs a {config.num_classes}-wide embedding (its head is an embedding projection, as "
            f"CLIP's image tower's), not class logits: it has no classes to predict. Compare model(x) with other "
            f"embeddings, or study it as a backbone: vit-einops inspect or explore with --target-embedding FILE or "
            f"--target-image PATH (vit_einops.inspect's EmbeddingTarget, ImageTarget)"
        )
    names = model.class_names
    if names is not None and len(names) != model.num_classes:
        raise ValueError(
            f"model.class_names has {len(names)} names but the classifier has {model.num_classes} outputs (was "
            f"head.fc replaced?); set model.class_names to {model.num_classes} names, or None for indices"
        )
    top_k = min(top_k, model.config.num_classes)
    batch = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, batch[:batch_size])
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        logits = torch.cat([model(chunk.to(device, dtype)).float().cpu() for chunk in batch.split(batch_size)])
    finally:
        model.train(was_training)
    check_finite_logits(batch, logits)
    probs = logits.softmax(-1)
    values, indices = probs.topk(top_k, dim=-1)
    return [
        [Prediction(i, class_name(i, names), p) for i, p in zip(row_i.tolist(), row_v.tolist())]
        for row_v, row_i in zip(values, indices)
    ]
