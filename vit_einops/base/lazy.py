"""Lazy package exports (PEP 562): a name's module is imported on first use, so ``import vit_einops`` and the
command line's ``--help`` do not pay for torch, safetensors or scikit-learn until something needs them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` map a name to the submodule defining it;
    a loaded name is cached in ``namespace`` (the package's globals) so later lookups skip ``__getattr__``."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{exports[name]}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
