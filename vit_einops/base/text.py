"""Strings from files, made safe to print: every class name, file name and metadata string that reaches the
terminal goes through :func:`printable` first.

A class name is data, not output: "\\x1b[2J" in a model file must not clear the user's screen, and "cat\\n  99.00%  dog"
must not print a result line of its own. Escaped are the C0 controls (U+0000-U+001F: newline, carriage return, ESC...),
DEL and the C1 controls (U+007F-U+009F), and the bidi embeddings, overrides and isolates (U+202A-U+202E,
U+2066-U+2069), which reorder what follows them on the line. Each becomes its Python escape (``\\n``, ``\\x1b``,
``\\u202e``); everything else, other non-ASCII letters included, is kept as it is.
"""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any) -> str:
    """``str(text)`` with control characters and bidi overrides escaped (see the module docstring)."""
    return _UNSAFE.sub(_escape, str(text))


def printable_lines(text: Any) -> str:
    """:func:`printable` on each line of ``text``, keeping its line breaks: for a message of several lines of our own
    (a state dict's missing keys) that quotes strings from files; a "\\r" or ESC inside a line is still escaped."""
    return "\n".join(printable(line) for line in str(text).split("\n"))
