"""Parameter counts without allocating the parameters, and torchsummary's layer table beside them."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import torch
from torch import nn

from .network.model import ViT
from .presets import create_architecture
from .network.sizes import check_forward_memory, check_model_memory


def count_parameters(model: nn.Module) -> int:
    """Every parameter's element count, summed; works on the meta device (shapes only)."""
    return sum(p.numel() for p in model.parameters())


def meta_vit(name: str, **overrides: Any) -> ViT:
    """Preset ``name`` on the meta device: every shape and no memory, and no random init to wait for (ViT-H's
    632M parameters count in well under a second)."""
    with torch.device("meta"):
        return create_architecture(name, **overrides)


def zeroed_vit(name: str, **overrides: Any) -> ViT:
    """Preset ``name`` with real, zero weights on the CPU and no random initialisation: enough for a layer
    table, which needs shapes and one forward, not trained values."""
    model = meta_vit(name, **overrides)
    # The table's weights, and its forward (torchsummary runs a batch of two), within the memory budget.
    check_model_memory(model.config)
    check_forward_memory(model.config, 2)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def summarize(model: nn.Module, input_size: tuple[int, ...], batch_size: int = -1) -> str:
    """Return torchsummary's table for ``model`` on a (C, H, W) ``input_size`` as text (it runs one forward), with
    every parameter counted once: its "Total params" is ``sum(p.numel() for p in model.parameters())``.

    torchsummary counts the ``weight`` and ``bias`` of each module whose forward runs, so it misses a parameter by
    another name (LayerScale's ``gamma``, the attention pool's ``latent``) and one held by a module it gives no row
    (a Sequential, the model itself). Here each row counts the parameters its module holds itself, each parameter in
    the first row of its module; a row named by its path follows the table for each parameter no row holds, and the
    totals and sizes below the table are those of the rows.
    """
    import torchsummary  # imports numpy; only the table needs it

    rows: dict[str, nn.Module] = {}  # torchsummary's row names ("LayerScale-12") -> the module of that row

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        rows[f"{type(module).__name__}-{len(rows) + 1}"] = module  # torchsummary's name: class, then firing number

    # The modules torchsummary hooks, hooked before it: every firing numbers a row of both in the same order.
    hooks = [
        m.register_forward_hook(record)
        for m in model.modules()
        if m is not model and not isinstance(m, (nn.Sequential, nn.ModuleList))
    ]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            torchsummary.summary(model, input_size, batch_size=batch_size, device="cpu")
    finally:
        for hook in hooks:
            hook.remove()
    return _count_every_parameter(buf.getvalue(), rows, model)


def _count_every_parameter(table: str, rows: dict[str, nn.Module], model: nn.Module) -> str:
    """torchsummary's ``table`` with each row's count replaced by the parameters its module holds (see summarize)."""
    lines = table.splitlines()
    top, bottom = (i for i, line in enumerate(lines) if line.startswith("="))  # the rules around the rows
    seen: dict[int, nn.Parameter] = {}
    for i in range(top + 1, bottom):
        held = [p for p in rows[lines[i].split()[0]].parameters(recurse=False) if id(p) not in seen]
        seen.update((id(p), p) for p in held)
        # The row is "{name:>20}  {output shape:>25} {count:>15}"; the count is its last field.
        lines[i] = f"{lines[i].rsplit(' ', 1)[0].rstrip()} {sum(p.numel() for p in held):>15,}"
    missed = [(name, p) for name, p in model.named_parameters() if id(p) not in seen]
    lines[bottom:bottom] = [f"{name:>20}  {str(list(p.shape)):>25} {p.numel():>15,}" for name, p in missed]
    counted = [*seen.values(), *(p for _, p in missed)]
    total = sum(p.numel() for p in counted)
    trainable = sum(p.numel() for p in counted if p.requires_grad)
    printed = dict(line.split(": ", 1) for line in lines if ": " in line)  # "Total params: 5,717,416", ...
    mb = 4 / 1024**2  # torchsummary's size of a parameter (float32), in MB
    added = (total - int(printed["Total params"].replace(",", ""))) * mb
    values = {
        "Total params": f"{total:,}",
        "Trainable params": f"{trainable:,}",
        "Non-trainable params": f"{total - trainable:,}",
        "Params size (MB)": f"{total * mb:0.2f}",
        "Estimated Total Size (MB)": f"{float(printed['Estimated Total Size (MB)']) + added:0.2f}",
    }
    for i, line in enumerate(lines):
        label = line.split(": ", 1)[0]
        if label in values:
            lines[i] = f"{label}: {values[label]}"
    return "\n".join(lines) + "\n"
