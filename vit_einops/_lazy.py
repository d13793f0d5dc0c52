"""Lazy package exports (PEP 562): a name's module is imported on first use, so ``import vit_einops`` and the
command line's ``--help`` do not pay for torch, safetensors or scikit-learn until something needs them."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def warn_deprecated(name: str, instead: str, stacklevel: int = 2) -> None:
    """The one wording of a deprecated public name's warning: what goes, when, and what to use instead.
    ``stacklevel`` counts from the caller of this function, as warnings.warn's counts from its own caller."""
    warnings.warn(
        f"{name} is deprecated and will be removed in the next release; use {instead}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def lazy_exports(
    package: str,
    exports: dict[str, str],
    namespace: dict[str, Any],
    deprecated: Mapping[str, tuple[str, str, str]] | None = None,
) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` map a name to the submodule defining it;
    a loaded name is cached in ``namespace`` (the package's globals) so later lookups skip ``__getattr__``.

    ``deprecated`` maps an old name to (submodule, new name, what to use instead): the old name still works, with a
    DeprecationWarning at every lookup (it is never cached, so each use is told), for one release.
    """
    deprecated = dict(deprecated or {})

    def __getattr__(name: str) -> Any:
        if name in deprecated:
            module, new, instead = deprecated[name]
            warn_deprecated(f"{package}.{name}", instead, stacklevel=2)
            return getattr(importlib.import_module(f".{module}", package), new)
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{exports[name]}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
