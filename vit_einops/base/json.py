"""The one JSON reader: every JSON document the package reads (a file, or a string of a safetensors header's
metadata) goes through :func:`loads`, which caps its size and its nesting before the decoder sees it.

Python's decoder recurses once per nesting level: a few kilobytes of ``[[[[...`` raise RecursionError (or worse,
exhaust the C stack), and a value nested a thousand deep breaks every ``repr`` and walk after it. No file we read
nests deeper than a handful of levels (a config, a class list, a checkpoint's optimizer state), so a document
deeper than :data:`MAX_DEPTH` is refused with a ValueError before it is parsed.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from itertools import accumulate
from pathlib import Path
from typing import Any

from .io import check_regular_file, read_regular_file

MAX_BYTES = 16 << 20  # 16 MiB: a config.json with the 21k ImageNet labels is ~1 MB, a checkpoint.json kilobytes
MAX_DEPTH = 32  # objects and arrays inside each other; our own files nest at most 6 deep (an optimizer's state)

# A JSON string ("...", escapes included): its brackets are text, not nesting. Unrolled so long strings stay linear.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 for an opening bracket, -1 (signed) for a closing


def nesting_depth(text: str) -> int:
    """How deep the objects and arrays of JSON ``text`` nest (0 for a bare number or string), counted without
    parsing, in time linear in its length. Meaningful for valid JSON; for other text, a number the decoder's own
    error will overrule."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    steps = array("b", brackets.encode("ascii").translate(_DEPTH_STEP))
    return max(accumulate(steps), default=0)


def loads(
    text: str | bytes, what: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """The value of the JSON document ``text`` (UTF-8 when bytes); ValueError naming ``what`` (e.g. "model.json",
    "metadata 'class_names' of m.safetensors") when it is larger than ``max_bytes``, nests deeper than
    ``max_depth``, is not UTF-8, or is not JSON. NaN and Infinity literals are read as floats, as Python writes
    them; the reader of each field checks its values."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ValueError(f"{what} is {size:,} bytes of JSON, over the {max_bytes:,} this reader accepts")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{what} is not valid JSON (not UTF-8: {err})") from err
    depth = nesting_depth(text)
    if depth > max_depth:
        raise ValueError(f"{what} nests JSON {depth} levels deep, over the {max_depth} this reader accepts")
    try:
        return json.loads(text)
    except ValueError as err:  # JSONDecodeError, and ints past Python's digit limit
        raise ValueError(f"{what} is not valid JSON: {err}") from err


def read_json(path: str | os.PathLike, what: str = "JSON file", *, max_bytes: int = MAX_BYTES) -> Any:
    """The value of the JSON file ``path``: FileNotFoundError if it is missing, ValueError for anything but a
    regular file (a FIFO is refused, not waited on), a file over ``max_bytes``, or a document :func:`loads`
    refuses. Messages name the file."""
    path = check_regular_file(path, what)
    return loads(read_regular_file(path, max_bytes=max_bytes), str(Path(path)), max_bytes=max_bytes)
