"""matplotlib for files only (Agg backend, no display) and crash-safe PNG writes; shared by train, inspect and bench."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ._io import atomic_write_bytes


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use (matplotlib is an optional extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Render ``fig`` to PNG in memory, write it atomically to ``path``, and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
