"""The training curves as a Figure (shown inline in a notebook; ``save_figure`` writes it as a PNG)."""

from __future__ import annotations

from typing import Any

from .._plot import new_figure


def plot_curves(records: list[dict[str, Any]]):
    """Train loss (left) and train/test accuracy (right) per epoch, from metrics.jsonl records; returns the Figure."""
    epochs = [r["epoch"] for r in records]
    fig = new_figure(figsize=(9, 3.5))
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r["train_loss"] for r in records], label="train loss")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", yscale="log", title="loss")
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
        ax.grid(alpha=0.3)
        ax.legend()
    return fig
