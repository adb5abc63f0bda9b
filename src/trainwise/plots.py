"""Learning-curve plots (matplotlib is optional: without it, one line says how to get plots)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOT_HINT = "learning-curve plots need matplotlib: pip install 'trainwise[plot]'"


def matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot_learning_curves(
    history: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    monitor: str | None = None,
    best_epoch: int | None = None,
    overfitting_epoch: int | None = None,
) -> Path:
    """Write a PNG of training and validation loss (and ``monitor``) per epoch, marking the best epoch and
    the overfitting onset. Raises ImportError with :data:`PLOT_HINT` when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    except ImportError as exc:
        raise ImportError(PLOT_HINT) from exc

    epochs = [r["epoch"] for r in history]
    if monitor in (None, "train_loss", "val_loss"):  # already on the loss panel: show accuracy beside it
        monitor = "val_accuracy" if any("val_accuracy" in r for r in history) else None
    show_monitor = monitor is not None and any(monitor in r for r in history)
    figure = Figure(figsize=(9 if show_monitor else 6, 4), dpi=100)
    axes = figure.subplots(1, 2 if show_monitor else 1, squeeze=False)[0]
    loss_axis = axes[0]
    for key, label in (("train_loss", "training loss"), ("val_loss", "validation loss")):
        points = [(r["epoch"], r[key]) for r in history if isinstance(r.get(key), (int, float))]
        if points:
            loss_axis.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
    loss_axis.set_xlabel("epoch")
    loss_axis.set_ylabel("loss")
    loss_axis.set_title("loss")
    if show_monitor:
        points = [(r["epoch"], r[monitor]) for r in history if isinstance(r.get(monitor), (int, float))]
        axes[1].plot(*zip(*points, strict=True), marker="o", markersize=3, color="tab:green", label=monitor)
        axes[1].set_xlabel("epoch")
        axes[1].set_title(monitor)
    for axis in axes:
        if best_epoch is not None:
            axis.axvline(best_epoch, color="tab:green", linestyle="--", linewidth=1, label=f"best epoch {best_epoch}")
        if overfitting_epoch is not None:
            axis.axvline(
                overfitting_epoch, color="tab:red", linestyle=":", linewidth=1.5,
                label=f"overfitting from {overfitting_epoch}",
            )
        if epochs:
            axis.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    from trainwise.checkpoint.io import atomic_write

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, lambda file: figure.savefig(file, format="png"))
