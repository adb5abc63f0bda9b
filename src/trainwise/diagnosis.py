"""Overfitting diagnosis from the per-epoch history: validation loss rising while training loss falls."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class OverfittingReport:
    """Where overfitting began and how wide the train/validation gap has grown."""

    onset_epoch: int  # the first epoch whose validation loss rose above the best
    best_epoch: int  # the epoch with the lowest validation loss before the onset
    best_val_loss: float
    val_loss: float  # at the last epoch examined
    train_loss: float  # at the last epoch examined
    epoch: int  # the last epoch examined

    @property
    def gap(self) -> float:
        return self.val_loss - self.train_loss

    def message(self) -> str:
        return (
            f"overfitting from epoch {self.onset_epoch}: validation loss rose from {self.best_val_loss:.4g} "
            f"(epoch {self.best_epoch}) to {self.val_loss:.4g} (epoch {self.epoch}) while training loss fell to "
            f"{self.train_loss:.4g}; gap {self.gap:.4g}. Validation ran in eval mode with autograd off, so this "
            "is not dropout or BatchNorm noise. Try weight decay, more dropout, data augmentation, a smaller "
            "model, or early stopping (patience=...)."
        )


def detect_overfitting(
    history: Sequence[dict[str, Any]],
    *,
    window: int = 3,
    min_rise: float = 0.10,
    min_train_drop: float = 0.05,
    val_key: str = "val_loss",
    train_key: str = "train_loss",
) -> OverfittingReport | None:
    """The first onset of overfitting in ``history``, or None.

    Onset: after the epoch with the lowest validation loss so far, the validation loss stays above that
    best in each of the next ``window`` epochs and ends at least ``min_rise`` (relative) above it, while the
    training loss falls by at least ``min_train_drop`` (relative) over the same epochs. Requiring all
    three keeps a healthy run silent: one noisy epoch, a plateau, or both losses rising (a learning rate
    too high) do not count.
    """
    epochs = [
        (int(r.get("epoch", i + 1)), float(r[val_key]), float(r[train_key]))
        for i, r in enumerate(history)
        if val_key in r and train_key in r and _finite(r[val_key]) and _finite(r[train_key])
    ]
    for b in range(len(epochs) - window):
        best_epoch, best_val, best_train = epochs[b]
        if any(v < best_val for _, v, _ in epochs[:b]):
            continue  # not the best so far
        after = epochs[b + 1 : b + 1 + window]
        end_epoch, end_val, end_train = after[-1]
        if not all(v > best_val for _, v, _ in after):
            continue
        if end_val < best_val * (1 + min_rise) + 1e-12:
            continue
        if not end_train <= best_train * (1 - min_train_drop):
            continue
        return OverfittingReport(
            onset_epoch=after[0][0],
            best_epoch=best_epoch,
            best_val_loss=best_val,
            val_loss=end_val,
            train_loss=end_train,
            epoch=end_epoch,
        )
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
