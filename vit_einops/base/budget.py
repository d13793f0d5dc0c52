"""The budgets: the memory an operation is about to need, and the time a model's construction will take, each
checked before anything is allocated or built.

Sizes multiply (depth x width, batch x heads x tokens^2, a resize target's height x width), so inputs that each pass
their own range check can still ask for terabytes. Each place that is about to build or compute something estimates
its memory from the sizes alone and calls :func:`check_memory`, which refuses with one line naming the estimate and
the limit.

The limit is the memory this machine has available now (``MemAvailable`` of /proc/meminfo, else
``os.sysconf``). Raise it (or lower it) for one block of code with ``with vit_einops.max_memory("64GiB"): ...``,
for a whole process with the environment variable ``VIT_EINOPS_MAX_MEMORY=64GiB``, and on the command line with
``--max-memory 64GiB`` (every command). The innermost setting wins: the context, then the variable, then the machine.

Time has a budget where memory does not see the work: building a model costs about the same for each module
whatever its size (:data:`vit_einops.network.sizes.MODULE_SECONDS`), so a config of depth 50000 and width 8 takes over a
minute of Python while its tensors fit in a few MiB. :func:`check_build_time` refuses a construction whose
estimate is over the limit: :data:`BUILD_SECONDS` by default (the largest real ViTs build their modules in well
under a second), else ``VIT_EINOPS_MAX_BUILD_TIME``, ``with vit_einops.max_build_time("2min"): ...`` or
``--max-build-time 2min``, set as the memory limit is. The time to initialise parameters is not counted there: it
grows with their memory, which the memory budget caps.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from fractions import Fraction
from typing import Any

from .checks import MAX_SIZE, check_int, show_int

ENV_VAR = "VIT_EINOPS_MAX_MEMORY"
TIME_ENV_VAR = "VIT_EINOPS_MAX_BUILD_TIME"
# The default limit on a model's estimated construction time, in seconds: about 7,500 encoder blocks at the rate
# vit_einops.network.sizes.MODULE_SECONDS states; ViT-H/14's 32 blocks take 0.04 s.
BUILD_SECONDS = 10.0
# An image larger than this many pixels is refused: before a file is decoded (vit_einops.images.open_image), and
# when a preprocessing step would resize to more (a 1x60000 PNG whose shorter side goes to 256 would be 256x15360000).
MAX_PIXELS = 128 * 1024 * 1024
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
_SECONDS = {"": 1, "s": 1, "min": 60, "h": 3600}
_YEAR = 365 * 24 * 3600  # the largest build-time limit: a longer one is no limit
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")  # a number and its unit
_LIMIT: ContextVar[int | None] = ContextVar("vit_einops_max_memory", default=None)
_TIME_LIMIT: ContextVar[float | None] = ContextVar("vit_einops_max_build_time", default=None)
_SIZES_ACCEPTED = (
    "a size from 1 byte to 2**63 - 1 bytes (8 EiB less one byte) such as 64GiB, 500MB, 1.5G or 1000000 (bytes; "
    "k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB powers of 1024)"
)
_TIMES_ACCEPTED = "a time from 1 ms to 1 year such as 30, 30s, 2min or 1.5h (seconds unless a unit is given)"


def _quantity(
    text: Any, name: str, units: dict[str, int], accepted: str, low: Fraction, high: Fraction,
    numbers: tuple[type, ...],
) -> Fraction:
    """``text`` (one of ``numbers``, or a string of a number and one of ``units``) in the base unit, exactly (a
    float would round 2**63 - 1 up to 2**63), within [low, high]; ValueError naming ``name``, the text as given and
    what is accepted otherwise."""
    value = None
    if isinstance(text, numbers) and not isinstance(text, bool):
        with contextlib.suppress(ValueError, OverflowError):  # nan, inf
            value = Fraction(text)
    elif isinstance(text, str) and (match := _QUANTITY.fullmatch(text)) and match[2].lower() in units:
        with contextlib.suppress(ValueError):  # more digits than Python converts (4300)
            value = Fraction(match[1]) * units[match[2].lower()]
    if value is None or not low <= value <= high:
        raise ValueError(f"{name} must be {accepted}, got {show_int(text) if isinstance(text, int) else repr(text)}")
    return value


def parse_bytes(text: Any, name: str = "max_memory") -> int:
    """A memory size as a whole number of bytes (rounded down): an int, or a string such as "64GiB", "500MB", "1.5G",
    "1000000" (k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB powers of 1024), at most 2**63 - 1. ValueError naming
    ``name`` and the text as given otherwise, a size under one byte ("0.5") included."""
    return int(_quantity(text, name, _UNITS, _SIZES_ACCEPTED, Fraction(1), Fraction(MAX_SIZE), (int,)))


def parse_seconds(text: Any, name: str = "max_build_time") -> float:
    """A time in seconds: a number, or a string such as "30", "30s", "2min", "1.5h". ValueError naming ``name`` and
    the text as given otherwise."""
    return float(_quantity(text, name, _SECONDS, _TIMES_ACCEPTED, Fraction(1, 1000), Fraction(_YEAR), (int, float)))


def format_bytes(size: float) -> str:
    """``size`` bytes for a message: "41.2 GiB", "512.0 MiB", "3.1 PiB", "2.0e+12 EiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if unit == "EiB" and size >= 1024:
            return f"{size:.1e} EiB"
        if size < 1024 or unit == "EiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def available_memory() -> int:
    """Bytes this machine can give a process now without swapping: MemAvailable (Linux), else the free physical
    pages (os.sysconf), else the physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            continue
    return 2**63 - 1  # no way to know: the estimate alone cannot be judged


def max_memory(limit: int | str | None) -> contextlib.AbstractContextManager[None]:
    """Within the block, :func:`check_memory` judges estimates against ``limit`` (bytes, or a size such as "64GiB")
    instead of the machine's available memory; None keeps the limit that applies outside."""
    return _within(_LIMIT, parse_bytes(limit) if limit is not None else _LIMIT.get())


def memory_limit() -> tuple[int, str]:
    """(limit in bytes, where it comes from, for the message): the innermost of :func:`max_memory`, the variable
    VIT_EINOPS_MAX_MEMORY, and the machine's available memory."""
    return _in_force(_LIMIT, "max-memory", ENV_VAR, parse_bytes, available_memory, "this machine has available")


def max_build_time(limit: int | str | None) -> contextlib.AbstractContextManager[None]:
    """Within the block, :func:`check_build_time` judges estimates against ``limit`` (seconds, or a time such as
    "2min") instead of :data:`BUILD_SECONDS`; None keeps the limit that applies outside."""
    return _within(_TIME_LIMIT, parse_seconds(limit) if limit is not None else _TIME_LIMIT.get())


@contextlib.contextmanager
def _within(limit: ContextVar[Any], value: Any) -> Iterator[None]:
    """``limit`` set to ``value`` for the block (and for nothing outside it, threads and tasks included)."""
    token = limit.set(value)
    try:
        yield
    finally:
        limit.reset(token)


def build_time_limit() -> tuple[float, str]:
    """(limit in seconds, where it comes from, for the message): the innermost of :func:`max_build_time`, the
    variable VIT_EINOPS_MAX_BUILD_TIME, and :data:`BUILD_SECONDS`."""
    default = "the default build-time limit"
    return _in_force(_TIME_LIMIT, "max-build-time", TIME_ENV_VAR, parse_seconds, lambda: BUILD_SECONDS, default)


def _in_force(
    limit: ContextVar[Any],
    flag: str,
    env_var: str,
    parse: Callable[[str, str], Any],
    default: Callable[[], Any],
    default_source: str,
) -> tuple[Any, str]:
    """(the limit in force, where it comes from): the block's (``limit``), else the variable ``env_var``'s, else
    ``default()`` (called only then: the machine's available memory is read from /proc)."""
    value = limit.get()
    if value is not None:
        return value, f"the {flag} limit"
    env = os.environ.get(env_var)
    if env:
        return parse(env, env_var), f"the {env_var} limit"
    return default(), default_source


def check_build_time(estimate: float, what: str) -> None:
    """Refuse (ValueError, one line) when ``estimate`` seconds of construction is over the build-time limit. ``what``
    completes "<what> takes about <estimate>", and the message names the limit and a --max-build-time that would
    allow it."""
    limit, source = build_time_limit()
    if estimate <= limit:
        return
    over = f"{what} takes about {format_seconds(estimate)}, over {source} of {format_seconds(limit)}"
    if estimate * 1.1 > _YEAR:
        raise ValueError(f"{over}; no limit allows it (--max-build-time takes at most 1 year)")
    allow = _round_up_seconds(estimate * 1.1)
    raise ValueError(
        f"{over}; pass --max-build-time {allow} to allow it (in Python: {TIME_ENV_VAR}={allow}, or with "
        f"vit_einops.max_build_time({allow!r}))"
    )


def format_seconds(seconds: float) -> str:
    """``seconds`` for a message: "0.4 s", "66 s", "18 min", "5.2 h"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 600:
        return f"{seconds:.0f} s"
    if seconds < 36000:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _round_up_seconds(seconds: float) -> str:
    """A round time at or above ``seconds`` to suggest as a limit: whole seconds below 10 min, else whole minutes."""
    if seconds < 600:
        return f"{max(1, math.ceil(seconds))}s"
    return f"{math.ceil(seconds / 60)}min"


def limit_text() -> str:
    """The memory limit in words, for a message: "the 12.0 GiB this machine has available", "the max-memory limit of
    64.0 GiB"."""
    limit, source = memory_limit()
    shown = format_bytes(limit)
    return f"the {shown} {source}" if source.startswith("this") else f"{source} of {shown}"


def check_memory(estimate: float, what: str) -> None:
    """Refuse (ValueError, one line) when ``estimate`` bytes is over the memory limit. ``what`` completes
    "... needs about <estimate> for ...", e.g. "this model needs" / "its weights"; the message names the estimate,
    the limit and a --max-memory that would allow it."""
    limit, source = memory_limit()
    if estimate <= limit:
        return
    need = format_bytes(estimate)
    over = limit_text()
    if estimate * 1.1 >= 2**63:
        raise ValueError(
            f"{what} needs about {need}, over {over}; no limit allows it (--max-memory takes at most 2**63 - 1 bytes)"
        )
    allow = _round_up(estimate * 1.1)
    raise ValueError(
        f"{what} needs about {need}, over {over}; pass --max-memory {allow} to allow it "
        f"(in Python: {ENV_VAR}={allow}, or with vit_einops.max_memory({allow!r}))"
    )


def resident_bytes() -> int:
    """The memory this process holds now (its resident set, from /proc/self/statm on Linux); 0 where that cannot be
    read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def check_peak_memory(work: float, what: str) -> float:
    """Refuse (as :func:`check_memory`) a run whose process would peak over the memory limit: what it holds now
    (:func:`resident_bytes`: the interpreter, the libraries, the models loaded) plus ``work`` bytes more. Against
    the machine's available memory, which already leaves out what the process holds, ``work`` alone is judged.
    Returns the estimated peak."""
    held = resident_bytes()
    peak = held + work
    if memory_limit()[1].startswith("this"):
        check_memory(work, what)
    else:
        check_memory(peak, f"{what}, with the {format_bytes(held)} this process holds now,")
    return peak


def _round_up(size: float) -> str:
    """A round size at or above ``size`` to suggest as a limit: whole MiB below 1 GiB, whole GiB below 1 TiB, else
    whole TiB."""
    if size < 2**30:
        return f"{max(1, math.ceil(size / 2**20))}MiB"
    if size < 2**40:
        return f"{math.ceil(size / 2**30)}GiB"
    return f"{math.ceil(size / 2**40)}TiB"
