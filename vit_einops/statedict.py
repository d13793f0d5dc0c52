"""Our state-dict layout and the checks every reader of weights shares: :func:`load_weights`, the one ending of
every loader (the file's size and the memory budget before reading, tensor types, the cast, finiteness), keys and
shapes against a config, the patch projection's two forms, and safetensors files read and written.

Model files (:mod:`vit_einops.modelfile`), the converters (:mod:`vit_einops.interop`) and training checkpoints
(:mod:`vit_einops.train.checkpoint`) all read weights through here, so a bad state dict gets the same error from each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .base.budget import check_memory
from .base.text import printable
from .network.config import FREE_FIELDS, ViTConfig
from .network.model import ViT
from .network.patch_embed import conv_to_linear_weight, linear_to_conv_weight
from .network.sizes import check_file_holds, check_model_memory

PATCH_WEIGHT = "patch_embed.proj.weight"


# The keys of each kind a mismatch message names before it counts the rest: a planted file can miss millions.
NAMED_KEYS = 5


def some_keys(keys: Sequence[str]) -> str:
    """The first :data:`NAMED_KEYS` of ``keys``, printable, then how many more."""
    named = ", ".join(map(printable, keys[:NAMED_KEYS]))
    return named + (f" and {len(keys) - NAMED_KEYS} more" if len(keys) > NAMED_KEYS else "")


class StateDictMismatchError(ValueError):
    """A state dict does not fit the expected layout. ``missing``, ``unexpected`` and ``mis_shaped`` hold every
    such key; the message names the first few of each kind and counts the rest."""

    def __init__(
        self,
        source: str,
        missing: list[str],
        unexpected: list[str],
        mis_shaped: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
    ) -> None:
        self.missing, self.unexpected, self.mis_shaped = missing, unexpected, mis_shaped
        # One line per kind of mismatch; the keys and source come from a file, so none may start a line of its own.
        lines = [f"{printable(source)} state dict does not match the expected layout:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {some_keys(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {some_keys(unexpected)}")
        for key, (got, want) in list(mis_shaped.items())[:NAMED_KEYS]:
            lines.append(f"  mis-shaped {printable(key)}: got {tuple(got)}, expected {tuple(want)}")
        if len(mis_shaped) > NAMED_KEYS:
            lines.append(f"  and {len(mis_shaped) - NAMED_KEYS} more mis-shaped keys")
        super().__init__("\n".join(lines))


def check_state_dict(state_dict: Any, source: str) -> dict[str, torch.Tensor]:
    """Return ``state_dict`` as a plain dict after checking it maps str keys to tensors."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{source} state dict must be a mapping of str to torch.Tensor, got {type(state_dict).__name__}"
        )
    for key, value in state_dict.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{source} state dict must map str to torch.Tensor; key {key!r} holds {type(value).__name__}"
            )
    return dict(state_dict)


def check_keys(state_dict: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], source: str) -> None:
    """Raise :class:`StateDictMismatchError` unless ``state_dict`` has exactly the keys and shapes of ``expected``."""
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mis_shaped = {
        k: (tuple(v.shape), tuple(expected[k]))
        for k, v in state_dict.items()
        if k in expected and tuple(v.shape) != tuple(expected[k])
    }
    if missing or unexpected or mis_shaped:
        raise StateDictMismatchError(source, missing, unexpected, mis_shaped)


# The dtypes a model runs in. float8 is a storage format only (torch has no layer norm, softmax or isfinite for it):
# float8 weights are read by casting them, exactly, to one of these.
MODEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_weights(state_dict: Mapping[str, torch.Tensor], source: str, dtype: torch.dtype | None) -> None:
    """Every tensor floating point; with ``dtype`` None, all of one dtype (a model runs in one), and that one of
    :data:`MODEL_DTYPES`."""
    not_float = sorted(k for k, v in state_dict.items() if not v.is_floating_point())
    if not_float:
        k = not_float[0]
        raise ValueError(
            f"{source}: weights must be floating point; {len(not_float)} tensors are not, e.g. {k!r} "
            f"({state_dict[k].dtype})"
        )
    storage_only = sorted(k for k, v in state_dict.items() if v.dtype not in MODEL_DTYPES)
    if dtype is None and storage_only:
        k = storage_only[0]
        raise ValueError(
            f"{source}: {len(storage_only)} tensors are {state_dict[k].dtype} (e.g. {k!r}), which no model runs in; "
            "pass dtype=torch.float32 to cast them (exactly)"
        )
    dtypes = sorted({str(v.dtype) for v in state_dict.values()})
    if dtype is None and len(dtypes) > 1:
        raise ValueError(f"{source}: tensors of several dtypes {dtypes}; pass dtype=torch.float32 to cast them")


def check_finite(state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """The one check that weights are finite, on the values a model will hold: after any cast (float64's 1e300 is
    inf in float32), so of :data:`MODEL_DTYPES` only."""
    bad = [k for k, v in state_dict.items() if not torch.isfinite(v).all()]
    if bad:
        tensors = f"{len(bad)} tensor{'s' * (len(bad) != 1)}"
        raise ValueError(f"{source}: non-finite values (nan or inf) in {tensors}, e.g. {bad[0]!r}")


def declared_bytes(state_dict: Mapping[str, torch.Tensor], itemsize: int = 0) -> int:
    """The bytes of ``state_dict``'s tensors as their shapes declare them (numel x element size, at least
    ``itemsize`` each): what checking, casting or copying them makes, however little storage a file gave them (a
    stride-0 view saved by torch.save stores one row of the millions it declares)."""
    return sum(v.numel() * max(v.element_size(), itemsize) for v in state_dict.values())


def load_weights(
    config: ViTConfig,
    read: Callable[[], Mapping[str, torch.Tensor]],
    source: str,
    dtype: torch.dtype | None,
    *,
    shapes: Mapping[str, torch.Tensor] | None = None,
    file_bytes: int | None = None,
) -> dict[str, torch.Tensor]:
    """The one ending of every loader (model files, training checkpoints, torchvision, timm, Hugging Face): the
    weights ``read()`` returns for a ViT of ``config``, checked alike whatever their form. ``source`` (the file, or
    the library of a state dict in memory) starts every message.

    Before anything is read: a file of ``file_bytes`` must hold the parameters ``config`` describes
    (:func:`~vit_einops.network.sizes.check_file_holds`), and loading must fit the memory budget: the model's weights twice
    (the file's tensors and the model's copies) at ``dtype``'s size, else the largest of ``shapes``, and each tensor
    ``shapes`` declares (the file's, on the meta device) at its declared size. Then the tensors: floating point (of
    one dtype a model runs in, unless ``dtype`` casts them), cast to ``dtype`` (None keeps theirs), and finite as
    the model will hold them (:func:`check_finite`).
    """
    if dtype is not None and (not isinstance(dtype, torch.dtype) or dtype not in MODEL_DTYPES):
        raise TypeError(f"dtype must be torch.float16, bfloat16, float32, float64 or None, got {dtype!r}")
    if file_bytes is not None:
        check_file_holds(config, file_bytes, source)
    shapes = check_state_dict(shapes or {}, source)
    itemsize = dtype.itemsize if dtype is not None else max((v.element_size() for v in shapes.values()), default=4)
    check_model_memory(config, itemsize, copies=2, action="loading")
    check_memory(
        declared_bytes(shapes, itemsize),
        f"holding the {len(shapes)} tensor{'s' * (len(shapes) != 1)} from {printable(source)} at their declared "
        "sizes (numel x element size)",
    )
    state_dict = check_state_dict(read(), source)
    check_weights(state_dict, source, dtype)
    if dtype is not None:
        state_dict = {k: v.to(dtype) for k, v in state_dict.items()}
    check_finite(state_dict, source)
    return state_dict


def _meta_vit(config: ViTConfig, attn_impl: str | Sequence[str] = "einsum") -> ViT:
    """A ViT for ``config`` on the meta device. A config whose tensors could not exist (more bytes than an int64
    counts: torch's "Storage size calculation overflowed") is a ValueError naming its sizes."""
    try:
        with torch.device("meta"):
            return ViT.from_config(config, attn_impl=attn_impl)
    except RuntimeError as err:
        if "Storage size calculation overflowed" not in str(err):
            raise
        raise ValueError(
            f"config with dim {config.dim}, mlp_dim {config.mlp_dim}, depth {config.depth} and image_size "
            f"{tuple(config.image_size)} is too large: one of its weights would hold more than 2**63 bytes"
        ) from err


def expected_shapes(config: ViTConfig) -> dict[str, torch.Size]:
    """Our state-dict keys and shapes for ``config``, from a model on the meta device (no memory, no init cost)."""
    return {k: v.shape for k, v in _meta_vit(config).state_dict().items()}


def build_vit(
    config: ViTConfig, state_dict: Mapping[str, torch.Tensor], attn_impl: str | Sequence[str] = "einsum"
) -> ViT:
    """A ViT for ``config`` holding copies of ``state_dict``'s tensors, in their dtype and on their device, running
    attention ``attn_impl``.

    Built on the meta device: the random init that loading would overwrite is never computed (seconds for ViT-H).
    The copies must fit the memory budget (:mod:`vit_einops.base.budget`), checked before anything is built.
    """
    itemsize = max((v.element_size() for v in state_dict.values()), default=4)
    check_model_memory(config, itemsize, action="loading")
    model = _meta_vit(config, attn_impl)
    model.load_state_dict({k: v.detach().clone() for k, v in state_dict.items()}, assign=True)
    # assign=True put the weights on their device and dtype without a move: the kernels are checked there now
    return model.set_attn_impl(attn_impl)


def check_free_fields(overrides: Mapping[str, Any]) -> None:
    """Only fields that no tensor pins down may be overridden when a config is inferred."""
    fixed = sorted(set(overrides) - set(FREE_FIELDS))
    if fixed:
        raise ValueError(
            f"{fixed} are read from the state dict and cannot be overridden; "
            f"the fields that can are {', '.join(FREE_FIELDS)}"
        )


def convert_patchify(
    state_dict: dict[str, torch.Tensor], config: ViTConfig, source: str, target: str
) -> dict[str, torch.Tensor]:
    """Move the patch projection between its Conv2d (D, C, p1, p2) and Linear (D, p1 p2 C) forms, in place."""
    if source != target:
        w = state_dict[PATCH_WEIGHT]
        state_dict[PATCH_WEIGHT] = (
            conv_to_linear_weight(w)
            if target == "linear"
            else linear_to_conv_weight(w, config.in_channels, config.patch_size)
        )
    return state_dict


def read_safetensors(path: Path, *, values: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file on the CPU; without ``values``, on the meta device (keys, shapes and dtypes
    from its header: no value is read). A file safetensors cannot read is a ValueError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {key: f.get_tensor(key) if values else _declared(f, key) for key in f.keys()}
    except (SafetensorError, ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {err}") from err


def _declared(f: Any, key: str) -> torch.Tensor:
    """The tensor ``key`` of the open safetensors file ``f`` as its header declares it, on the meta device."""
    piece = f.get_slice(key)
    shape = piece.get_shape()
    dtype = (piece[:0] if shape else f.get_tensor(key)).dtype  # an empty slice has the dtype and no values
    return torch.empty(shape, dtype=dtype, device="meta")


def safetensors_bytes(state_dict: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """``state_dict`` as the bytes of a safetensors file (CPU, contiguous; tensors that share storage are copied)."""
    from safetensors.torch import save

    # safetensors stores each tensor once, densely: make every tensor contiguous and unshared.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    return save(tensors, metadata=metadata)
