"""A run's figures (shown inline in a notebook; ``save_figure`` writes one as a PNG): the training curves and the
test confusion matrix. Class names come from the data (folder names), so they are drawn as literal text, never as
mathtext, with control characters escaped (:func:`~vit_einops.base.text.printable`): a font has no glyph for ESC, and
matplotlib's warning about the missing glyph would print the raw character to the terminal."""

from __future__ import annotations

from typing import Any

from ..base.plot import new_figure
from ..base.text import printable

MAX_LABELLED_CLASSES = 40  # beyond this many classes the axes are numbered, not named: the names would overlap
MAX_ANNOTATED_CLASSES = 15  # counts are written in the cells up to this many classes


def plot_curves(records: list[dict[str, Any]]):
    """Loss (left) and top-1 accuracy (right), train and test, per epoch from metrics.jsonl records, with the
    epochs on whole-number ticks; returns the Figure. Records without a test loss (older runs) draw train loss
    only."""
    from matplotlib.ticker import MaxNLocator

    epochs = [r["epoch"] for r in records]
    fig = new_figure(figsize=(9, 3.5))
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r["train_loss"] for r in records], label="train")
    if all("test_loss" in r for r in records):
        ax_loss.plot(epochs, [r["test_loss"] for r in records], label="test")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy (training's label smoothing)", yscale="log", title="loss")
    ax_acc.plot(epochs, [r["train_acc"] for r in records], label="train")
    ax_acc.plot(epochs, [r["test_acc"] for r in records], label="test")
    best = max(records, key=lambda r: r["test_acc"])
    ax_acc.set(
        xlabel="epoch",
        ylabel="top-1 accuracy",
        ylim=(0, 1.01),
        title=f"accuracy (final test {records[-1]['test_acc']:.3f}, best {best['test_acc']:.3f})",
    )
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # an epoch is a whole number
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def plot_confusion(confusion: list[list[int]], classes: list[str]):
    """The confusion matrix (rows: true class, columns: predicted class) as a heat map of each row's shares, each
    true class labelled with its accuracy; returns the Figure."""
    classes = [printable(name) for name in classes]
    n = len(classes)
    if len(confusion) != n or any(len(row) != n for row in confusion):
        raise ValueError(f"expected a {n}x{n} confusion matrix for {n} classes, got {len(confusion)} rows")
    totals = [sum(row) for row in confusion]
    shares = [[c / t if t else 0.0 for c in row] for row, t in zip(confusion, totals, strict=True)]
    correct = sum(confusion[i][i] for i in range(n))
    side = min(12.0, 3.0 + 0.45 * min(n, MAX_LABELLED_CLASSES))
    fig = new_figure(figsize=(side + 2.5, side))  # 2.5: the colour bar and the rows' labels beside a square matrix
    ax = fig.subplots()
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="share of the true class's test images")
    ax.set(
        xlabel="predicted class",
        ylabel="true class (its accuracy)",
        title=f"test confusion matrix ({correct} of {sum(totals)} correct)",
    )
    if n <= MAX_LABELLED_CLASSES:
        rows = [f"{name} ({confusion[i][i] / totals[i]:.1%})" if totals[i] else f"{name} (none)" for i, name in
                enumerate(classes)]  # fmt: skip
        ax.set_xticks(range(n), classes, rotation=90 if n > 8 else 0)
        ax.set_yticks(range(n), rows)
        for label in (*ax.get_xticklabels(), *ax.get_yticklabels()):
            label.set_parse_math(False)  # a name like "$x$" is text from the data, not mathtext
    if n <= MAX_ANNOTATED_CLASSES:
        for i, row in enumerate(confusion):
            for j, count in enumerate(row):
                if count:
                    dark = shares[i][j] > 0.5
                    ax.text(j, i, str(count), ha="center", va="center", color="white" if dark else "black")
    return fig
