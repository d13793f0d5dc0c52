"""The reader of a bench run's results.json (the writer is :mod:`.report`): one check of what every reader relies on.

A results file is data from disk: it may be another program's JSON, hand-edited, truncated or hostile. What a reader
(benchmarks/compare.py) takes from it is checked here once, so that each problem is one line naming the file and the
field, never a traceback from deep inside the reader, and never a NaN ranked as a number. Free of torch: a script
that only reads results starts at once.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..base.json import read_json

# What names one row of each section: the same row of two runs has the same key (the reference paths included).
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "attention": ("section", "mode", "path", "batch", "heads", "tokens", "head_dim"),
    "model": ("model", "mode", "path"),
}
_INT_KEYS = {"batch", "heads", "tokens", "head_dim"}
RATIO_FIELDS = ("time_ratio", "time_ratio_low", "time_ratio_high")
# A time ratio is one path's time over the reference's on the same shape: a million either way is no measurement,
# and within it the change of one run's ratio over another's stays a finite number.
RATIO_LIMIT = 1e6


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """The results of the bench run in the file ``path``, checked (:func:`check_results`).

    FileNotFoundError if it is missing; ValueError naming the file for anything but a regular file (a FIFO or a
    directory is refused from its stat, never opened to be read), a file too large or nested too deep to read as
    JSON, or JSON that is not a bench run's results (what is wrong, and where)."""
    data = read_json(path, "bench results file")
    try:
        check_results(data)
    except ValueError as err:
        raise ValueError(f"{os.fspath(path)}: {err}") from None
    return data


def check_results(results: Any) -> None:
    """ValueError naming the field and its value unless ``results`` has what a bench run writes and its readers
    read: an object with ``meta`` (``threads`` a positive int, ``wall_s`` a finite number >= 0, ``others_cores`` and
    ``others_cores_end`` null or finite numbers >= 0) and the ``attention`` and ``model`` lists of rows, each an
    object with its key fields (:data:`ROW_KEYS`: names are strings, sizes positive ints) and time ratios that are
    null (no reference) or finite numbers in [1/:data:`RATIO_LIMIT`, :data:`RATIO_LIMIT`]."""
    if not isinstance(results, dict):
        raise ValueError(f"the file holds {_kind(results)}; expected a bench run's results (a JSON object)")
    meta = _field(results, "meta", "results", dict, "an object")
    threads = _field(meta, "threads", "meta", int, "a positive int")
    if threads < 1:
        raise ValueError(f"meta.threads is {threads}; expected a positive int")
    _number(meta, "wall_s", "meta", none=False)
    for name in ("others_cores", "others_cores_end"):
        _number(meta, name, "meta", none=True)
    for section, keys in ROW_KEYS.items():
        rows = _field(results, section, "results", list, "a list of rows")
        for i, row in enumerate(rows):
            where = f"{section}[{i}]"
            if not isinstance(row, dict):
                raise ValueError(f"{where} is {_kind(row)}; expected a row (a JSON object)")
            for key in keys:
                if key in _INT_KEYS:
                    if _field(row, key, where, int, "a positive int") < 1:
                        raise ValueError(f"{where}.{key} is {row[key]}; expected a positive int")
                else:
                    _field(row, key, where, str, "a string")
            for name in RATIO_FIELDS:
                ratio = row.get(name)
                if ratio is not None and not (_is_number(ratio) and 1 / RATIO_LIMIT <= ratio <= RATIO_LIMIT):
                    raise ValueError(
                        f"{where}.{name} is {_show(ratio)}; expected a time ratio: a finite number from "
                        f"{1 / RATIO_LIMIT:g} to {RATIO_LIMIT:g}, or null"
                    )


def _field(container: dict, name: str, where: str, kind: type, expected: str) -> Any:
    """``container[name]`` if it is a ``kind`` (a bool is no int); else ValueError naming ``where.name``."""
    if name not in container:
        raise ValueError(f"{_path(where, name)} is missing; expected {expected}")
    value = container[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{_path(where, name)} is {_kind(value)}; expected {expected}")
    return value


def _number(container: dict, name: str, where: str, *, none: bool) -> None:
    """ValueError unless ``container[name]`` is a finite number >= 0 (or null, when ``none``)."""
    value = container.get(name)
    if (value is None and none) or (_is_number(value) and value >= 0):
        return
    missing = name not in container
    raise ValueError(
        f"{_path(where, name)} is {'missing' if missing else _show(value)}; expected a finite number >= 0"
        + (", or null" if none else "")
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _path(where: str, name: str) -> str:
    return name if where == "results" else f"{where}.{name}"


def _show(value: Any) -> str:
    """A value for a message: a number as JSON writes it (NaN, Infinity), anything else by its kind."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return _kind(value)


def _kind(value: Any) -> str:
    """What JSON value ``value`` is, in JSON's words, for messages (the value itself may be huge or hostile)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"a number ({_show(value)})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r}{'...' if len(value) > 40 else ''})"
    return "a list" if isinstance(value, list) else "an object"
