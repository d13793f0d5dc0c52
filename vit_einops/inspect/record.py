"""Record the attention matrices A (Eq. 6) of a running model, on every attention implementation.

Each chosen :class:`~vit_einops.network.attention.Attend`'s probe site ``hook_pattern`` (docs/probes.md) is read:
``A = softmax(q k^T / sqrt(D_h))`` of the q and k the layer really used, masked as the layer was. While it is
probed, a layer whose kernel never forms A (sdpa, chunked) forms it with the einsum kernel's arithmetic and attends
with it, so the output is the kernel's within float rounding (exactly the einsum kernel's), and the fused paths are
recorded as faithfully as the einsum path. Attention dropout is not applied to the record: A is the distribution
the layer attends with in eval.

Of a ViT only the encoder's layers (``model.blocks``) are recorded: an attention-pooling head (pool "map") is an
Attend too, recorded with ``AttentionRecorder(model.head)``. Rows and columns of A are the tokens of
``recorder.layout`` (:class:`~vit_einops.network.patch_embed.TokenLayout`): the prefix tokens, then the patches of the input's
grid in row-major order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from ..base.checks import check_index
from ..network.attention import Attend, attention_scores
from ..inputs import model_inputs
from ..network.patch_embed import TokenLayout
from ..network.probes import HookPoint, attached
from ..network.sizes import check_model_forward


def attention_matrix(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 6 from the layer's q, k: (b, h, n, d) each -> A (b, h, n, n), rows summing to 1.

    The same logits as Attend's einsum path (:func:`~vit_einops.network.attention.attention_scores`), so that path is
    reproduced exactly.
    """
    return attention_scores(q, k, scale, mask).softmax(dim=-1)


def encoder_attends(model: nn.Module) -> list[Attend]:
    """The Attend layers of a ViT's encoder (``model.blocks``) in block order, or of any module holding some."""
    blocks = getattr(model, "blocks", None)
    layers = [m for m in (blocks if isinstance(blocks, nn.Module) else model).modules() if isinstance(m, Attend)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Attend module to record")
    return layers


class AttentionRecorder:
    """Records A of the chosen attention layers while the model runs; a context manager.

    Args:
        model: a ViT (its encoder's layers, ``model.blocks``, in block order), or any other module containing
            :class:`Attend` layers (all of them, in ``model.modules()`` order).
        layers: indices of the layers to record (negative counts from the end); None records all.

    Inside ``with AttentionRecorder(model) as rec:`` every forward appends to the record (read at each layer's
    ``hook_pattern`` probe site, and the input's grid at ``hook_image``); on exit, also after an exception, every
    probe is detached. ``rec.maps`` is (layers, b, h, n, n), b being all images seen, in order.
    ``rec.layout`` is the :class:`~vit_einops.network.patch_embed.TokenLayout` of the recorded inputs, which names the rows
    and columns (None for a module without a patch embedding, such as ``model.blocks``).
    """

    def __init__(self, model: nn.Module, layers: Sequence[int] | None = None) -> None:
        attends = encoder_attends(model)
        if layers is None:
            layers = range(len(attends))
        elif isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
            raise TypeError(f"layers must be a sequence of layer indices, or None for all, got {layers!r}")
        chosen = [check_index("layer", i, len(attends), f"the model's {len(attends)} attention layers") for i in layers]
        if not chosen:
            raise ValueError(
                f"layers is empty: name at least one of the model's {len(attends)} attention layers, or pass None "
                "for all"
            )
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"layers {list(layers)} name a layer twice")
        self.layers = chosen
        self._attends = [attends[i] for i in chosen]
        self._patch_embed = getattr(model, "patch_embed", None)
        self._records: list[list[torch.Tensor]] = [[] for _ in chosen]
        self._layouts: list[TokenLayout] = []
        self._probes: ExitStack | None = None

    def __enter__(self) -> "AttentionRecorder":
        if self._probes is not None:
            raise RuntimeError("this AttentionRecorder is already recording")
        hooks = [(attend.hook_pattern, self._keep(kept)) for kept, attend in zip(self._records, self._attends)]
        if hasattr(self._patch_embed, "layout"):
            hooks.append((self._patch_embed.hook_image, self._layout_hook))
        self._probes = ExitStack()
        self._probes.enter_context(attached(hooks))
        return self

    def __exit__(self, *exc: Any) -> None:
        probes, self._probes = self._probes, None
        if probes is not None:
            probes.close()

    @staticmethod
    def _keep(records: list[torch.Tensor]):
        def keep(attn: torch.Tensor, hook: HookPoint) -> None:
            records.append(attn.detach())

        return keep

    def _layout_hook(self, images: torch.Tensor, hook: HookPoint) -> None:
        self._layouts.append(self._patch_embed.layout(images.shape[-2:]))

    @property
    def layout(self) -> TokenLayout | None:
        """The token layout of the inputs recorded so far (the model's ``patch_embed.layout``); None for a module
        without a patch embedding."""
        if not hasattr(self._patch_embed, "layout"):
            return None
        if not self._layouts:
            raise RuntimeError("nothing recorded yet: run the model inside the `with` block first")
        grids = {layout.grid for layout in self._layouts}
        if len(grids) > 1:
            raise ValueError(f"the recorded inputs have different patch grids: {sorted(grids)}")
        return self._layouts[0]

    @property
    def maps(self) -> torch.Tensor:
        """(layers, b, h, n, n): the recorded attention matrices of every forward so far, batches concatenated."""
        if not self._records[0]:
            raise RuntimeError("nothing recorded yet: run the model inside the `with` block first")
        # Each layer's batches are copied straight into their place: one copy of the maps beside the record, never
        # a stack of concatenated copies (at 1,374 tokens a ViT-S/14's maps of one image are 544 MB).
        first = self._records[0][0]
        out = first.new_empty(len(self._records), sum(len(m) for m in self._records[0]), *first.shape[1:])
        for layer, records in zip(out, self._records, strict=True):
            torch.cat(records, out=layer)
        return out

    def clear(self) -> None:
        """Forget what was recorded (the hooks stay while inside the `with` block)."""
        for r in self._records:
            r.clear()
        self._layouts.clear()


@torch.no_grad()
def record_attention(
    model: nn.Module, images: Any, layers: Sequence[int] | None = None, *, preprocessed: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, TokenLayout | None]:
    """Run ``model`` on ``images`` once and return (output, maps (layers, b, h, n, n), the input's token layout
    (:attr:`AttentionRecorder.layout`)); no hook remains after.

    ``images``: paths, PIL images, uint8 or float tensors, or a list of them, as :func:`vit_einops.predict`
    takes them (``preprocessed``: how a float tensor is taken; see :mod:`vit_einops.inputs`). The model's
    train/eval mode is left as the caller set it; call ``model.eval()`` first to inspect a trained model without
    dropout.
    """
    recorder = AttentionRecorder(model, layers)
    images = model_inputs(model, images, preprocessed=preprocessed)
    check_model_forward(model, images, kept=len(recorder.layers))
    with recorder:
        output = model(images)
    return output, recorder.maps, recorder.layout
