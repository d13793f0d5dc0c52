"""Named probe sites: the one way to read or change an activation of a running ViT.

Each site is a :class:`HookPoint` at one line of the forward pass (``x = self.hook_resid_mid(x)``), named as
TransformerLens and ViT-Prisma name it (``blocks.3.attn.hook_pattern``). A site nobody probes is one check of an
empty list: the forward pass computes nothing for it (no per-head result, no attention matrix on a kernel that
never forms it). :meth:`vit_einops.ViT.probe_sites` lists them; :meth:`~vit_einops.ViT.run_with_hooks` and
:meth:`~vit_einops.ViT.run_with_cache` probe them for one call and leave no hook behind, also after an exception.
docs/probes.md has the table of sites and their shapes.

A hook is TransformerLens's ``fn(value, hook) -> None | tensor``: None keeps the value, a tensor of the same shape
replaces it for the rest of the pass. ``hook`` is the HookPoint, whose ``name`` is the site's.

Axes: b batch, n tokens, h heads, d head size D_h, D width.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

Hook = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | None"]
# torch's forward hook fn(module, inputs, output) -> None | output, and forward pre-hook fn(module, inputs) -> None |
# inputs (module_hooks).
ModuleHook = Callable[..., Any]


class HookPoint:
    """One probe site: identity while no hook is attached, else each hook in turn reads or replaces the value.

    Not a module: it holds no parameter, adds no state-dict key and no child to ``print(model)``. ``name`` is the
    model's name for the site (set by :meth:`vit_einops.ViT.probe_sites`); ``shape`` the axes a hook sees.
    ``heads_second``: the forward pass holds the value as (b, h, n, d) and hooks see it as (b, n, h, d), as
    TransformerLens's q, k, v and z; a replacement is laid back.
    """

    __slots__ = ("name", "shape", "hooks", "heads_second")

    def __init__(self, shape: str, *, heads_second: bool = False) -> None:
        self.name = ""
        self.shape = shape
        self.hooks: list[Hook] = []
        self.heads_second = heads_second

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x) if self.hooks else x

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The value after every hook: each sees the previous one's result."""
        value = x.transpose(1, 2) if self.heads_second else x
        for hook in self.hooks:
            out = hook(value, self)
            if out is not None:
                if not isinstance(out, torch.Tensor) or out.shape != value.shape:
                    got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
                    raise ValueError(
                        f"the hook on {self.name or 'a site'} returned {got}; a hook returns None (keep the value) "
                        f"or a tensor of the value's shape {tuple(value.shape)} {self.shape}"
                    )
                value = out
        return value.transpose(1, 2) if self.heads_second else value

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r}, {self.shape}, hooks={len(self.hooks)})"


# TransformerLens's short names (utils.get_act_name) -> where the site sits under blocks.{l}.
BLOCK_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
ATTENTION_SITES = ("q", "k", "v", "attn_scores", "pattern", "z", "result")
MLP_SITES = ("pre", "post")
ALIASES = {"attn": "pattern", "scores": "attn_scores", "mlp_pre": "pre", "mlp_post": "post"}


def site_name(key: Any, depth: int) -> str:
    """The full name of a site given as TransformerLens's ActivationCache takes it: a full name
    ("blocks.3.attn.hook_pattern"), or (short name, layer) such as ("pattern", 3) or ("resid_post", -1); the
    embedding sites by short name alone ("image", "embed", "pos_embed")."""
    if isinstance(key, str):
        if key in ("image", "embed", "pos_embed", "pooled"):
            return f"hook_{key}"
        return "ln_final.hook_normalized" if key == "normalized" else key
    if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int)):
        raise KeyError(f"a site is a name or a (short name, layer) pair such as ('pattern', 3), got {key!r}")
    short, layer = ALIASES.get(key[0], key[0]), key[1]
    if not -depth <= layer < depth:
        raise KeyError(f"layer {layer} of {key!r} is not a block of this model (depth {depth})")
    layer %= depth
    if short in BLOCK_SITES:
        return f"blocks.{layer}.hook_{short}"
    if short in ATTENTION_SITES:
        return f"blocks.{layer}.attn.hook_{short}"
    if short in MLP_SITES:
        return f"blocks.{layer}.mlp.hook_{short}"
    shorts = ", ".join(BLOCK_SITES + ATTENTION_SITES + MLP_SITES)
    raise KeyError(f"unknown short name {key[0]!r} in {key!r}; expected one of {shorts}")


def unknown_site(name: Any, sites: Sequence[str]) -> ValueError:
    """The error for a name that is no site: it names the name and the closest sites."""
    close = difflib.get_close_matches(str(name), sites, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    layer0 = [s for s in sites if not re.match(r"blocks\.[1-9]", s)]
    return ValueError(
        f"no probe site {name!r}{hint} The sites are {', '.join(layer0)} (blocks.0 shown; one set per block): "
        f"model.probe_sites() lists them"
    )


def chosen_sites(names_filter: Any, sites: Mapping[str, HookPoint]) -> list[str]:
    """TransformerLens's names_filter: None (every site), a name, a list of names, or a callable name -> bool."""
    if names_filter is None:
        return list(sites)
    if callable(names_filter):
        return [name for name in sites if names_filter(name)]
    names = [names_filter] if isinstance(names_filter, str) else names_filter
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names_filter is None, a site name, a list of them or a callable, got {names_filter!r}")
    for name in names:
        if name not in sites:
            raise unknown_site(name, list(sites))
    return list(dict.fromkeys(names))


class ActivationCache(Mapping[str, torch.Tensor]):
    """The activations one :meth:`~vit_einops.ViT.run_with_cache` call recorded, by site name, in the order the
    forward pass reached them. As TransformerLens's ActivationCache, ``cache["pattern", 3]`` is
    ``cache["blocks.3.attn.hook_pattern"]`` and ``cache["resid_post", -1]`` the last block's output."""

    def __init__(self, values: dict[str, torch.Tensor], depth: int) -> None:
        self._values, self._depth = values, depth

    def __getitem__(self, key: Any) -> torch.Tensor:
        name = site_name(key, self._depth)
        if name not in self._values:
            raise KeyError(
                f"{name!r} is not in this cache; it holds {', '.join(self._values) or 'nothing'} "
                f"(names_filter chose the sites)"
            )
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} sites: {', '.join(list(self._values)[:4])}{', ...' * (len(self) > 4)})"


@contextmanager
def attached(hooks: Sequence[tuple[HookPoint, Hook]]) -> Iterator[None]:
    """Within the block, each (site, fn) of ``hooks`` is attached; on leaving, also after an exception, every hook
    attached here is detached again (the sites' lists are as they were)."""
    for site, fn in hooks:
        site.hooks.append(fn)
    try:
        yield
    finally:
        for site, fn in reversed(hooks):
            site.hooks.remove(fn)


@contextmanager
def module_hooks(
    forward: Sequence[tuple[nn.Module, ModuleHook]] = (), pre: Sequence[tuple[nn.Module, ModuleHook]] = ()
) -> Iterator[None]:
    """Within the block, each (module, fn) of ``forward`` has fn as a torch forward hook (``fn(module, inputs,
    output)`` returns None to keep the output or a replacement) and each of ``pre`` as a forward pre-hook
    (``fn(module, inputs)`` returns None or the replaced positional inputs); on leaving, also after an exception,
    every hook registered here is removed.

    The sites hold one value each. A rule that needs a layer's input and output together, as LRP's rules do
    (:mod:`vit_einops.inspect.lrp` swaps each layer's output for the same values with another backward pass), hooks
    the layer's module here: the one place outside the forward pass where a torch hook is registered."""
    handles = []
    try:
        for module, fn in forward:
            handles.append(module.register_forward_hook(fn))
        for module, fn in pre:
            handles.append(module.register_forward_pre_hook(fn))
        yield
    finally:
        for handle in reversed(handles):
            handle.remove()
