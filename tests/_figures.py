"""What a reader of a figure sees, measured on the drawn figure: every piece of text inside the picture, and no two
titles on top of each other. Shared by the figure tests and the docs' tests."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _shown(bbox) -> str:
    return f"({bbox.x0:.0f}, {bbox.y0:.0f})..({bbox.x1:.0f}, {bbox.y1:.0f}) px"


def unreadable(fig: Figure) -> list[str]:
    """What is wrong with ``fig`` drawn at its own size and dpi, as ``fig.savefig`` draws it (bbox_inches=None):
    each axes (its tick labels, axis labels, title; a colour bar's label), figure or subfigure text that reaches
    outside the figure, and each pair of overlapping titles (axes titles and subfigure titles). [] for a figure
    whose text is whole and apart."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    inside = fig.bbox.padded(1.0)  # one pixel of rounding
    figures = [fig, *fig.subfigs]
    texts = [t for f in figures for t in f.texts if t.get_visible() and t.get_text()]
    problems = []
    drawn = [(repr(ax), ax.get_tightbbox(renderer)) for ax in fig.get_axes() if ax.get_visible()]
    drawn += [(f"text {t.get_text()!r}", t.get_window_extent(renderer)) for t in texts]
    for name, box in drawn:
        if not (inside.contains(*box.p0) and inside.contains(*box.p1)):
            problems.append(f"{name} reaches outside the figure ({fig.bbox.width:.0f}x{fig.bbox.height:.0f} px): "
                            f"{_shown(box)}")
    titles = [ax.title for ax in fig.get_axes() if ax.get_visible() and ax.get_title()] + texts
    boxes = [t.get_window_extent(renderer) for t in titles]
    for i in range(len(titles)):
        for j in range(i + 1, len(titles)):
            if boxes[i].overlaps(boxes[j]):
                problems.append(f"titles {titles[i].get_text()!r} and {titles[j].get_text()!r} overlap")
    return problems
