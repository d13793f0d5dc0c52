"""Figures without global state, and crash-safe PNG writes; shared by train, inspect and bench.

Nothing here chooses a matplotlib backend: :func:`new_figure` builds a bare ``matplotlib.figure.Figure``, which
needs none (it renders with Agg when saved), is not registered with pyplot (so a notebook shows the returned
figure once, and a script leaks nothing), and draws inline in Jupyter when returned from a cell.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from .io import atomic_write_bytes

MIN_PNG_WIDTH = 600  # pixels: narrower, a figure's 8 pt labels shrink below what a screen or a page shows legibly
PNG_DPI = 120


def new_figure(**kwargs: Any):
    """A ``matplotlib.figure.Figure(**kwargs)`` (constrained layout unless ``layout`` is given); matplotlib is
    imported here, on first use, since it is an optional extra."""
    from matplotlib.figure import Figure

    kwargs.setdefault("layout", "constrained")
    return Figure(**kwargs)


def pyplot():
    """matplotlib.pyplot, imported on first use, with whatever backend the user's environment chose."""
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int | None = None, *, replace: bool = True) -> Path:
    """Render ``fig`` to PNG in memory and write it atomically to ``path``; returns the path. ``dpi=None`` is 120,
    or more for a figure under 5 inches wide, so that the picture is at least 600 px wide. ``replace=False``
    refuses (FileExistsError) a file that is there at the commit; ``True`` replaces only a regular file.

    A figure that pyplot manages (made with ``plt.subplots``) is closed after, so a script that saves many does
    not pile them up; a bare Figure needs no closing and stays usable.
    """
    atomic_write_bytes(path, figure_png(fig, dpi), replace=replace)
    return Path(path)


def figure_png(fig: Any, dpi: int | None = None) -> bytes:
    """``fig`` rendered as PNG bytes at ``dpi`` (chosen as :func:`save_figure` says), closed after if pyplot
    manages it."""
    if dpi is None:
        dpi = max(PNG_DPI, math.ceil(MIN_PNG_WIDTH / fig.get_figwidth()))
    buf = io.BytesIO()
    # A figure under a layout engine (ours are constrained) already fits its canvas; "tight" would draw it a second
    # time only to measure it. A figure without one (plt.subplots' default) is cropped to what it draws.
    fits = fig.get_layout_engine() is not None
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches=None if fits else "tight")
    if getattr(fig.canvas, "manager", None) is not None:  # made by pyplot, which keeps it until closed
        pyplot().close(fig)
    return buf.getvalue()
