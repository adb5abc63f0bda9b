"""Early stopping on any logged metric, with the best epoch's weights restored at the end."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from trainwise.checkpoint.io import atomic_torch_save
from trainwise.errors import TrainwiseError
from trainwise.wrappers import unwrap_model as _unwrap


def metric_mode(name: str) -> Literal["min", "max"]:
    """``max`` for accuracy-like names (accuracy, f1, auc, precision, recall, score), ``min`` otherwise."""
    lowered = name.lower()
    return "max" if any(k in lowered for k in ("acc", "f1", "auc", "precision", "recall", "score", "iou")) else "min"


def best_epoch(
    history: list[dict[str, Any]], monitor: str, mode: Literal["auto", "min", "max"] = "auto"
) -> tuple[int | None, float | None]:
    """``(epoch, value)`` of the best ``monitor`` value in per-epoch records (None, None if it never appears)."""
    scored = [(r[monitor], r["epoch"]) for r in history if isinstance(r.get(monitor), (int, float))]
    if not scored:
        return None, None
    direction = metric_mode(monitor) if mode == "auto" else mode
    value, epoch = (min if direction == "min" else max)(scored, key=lambda pair: pair[0])
    return epoch, value


class EarlyStopping:
    """Stop when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs; keep the best weights.

    In a hand-written loop::

        stopper = EarlyStopping("val_loss", patience=3)
        for epoch in range(1, 101):
            ...
            if stopper.update(epoch, {"val_loss": val_loss}, model):
                break
        stopper.restore(model)   # the best epoch's weights; stopper.best_epoch says which

    ``keep="memory"`` keeps a CPU copy of the best state dict; ``keep="disk"`` writes it atomically to
    ``path`` (for models too large to copy in memory).
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        *,
        mode: Literal["auto", "min", "max"] = "auto",
        patience: int = 5,
        min_delta: float = 0.0,
        restore_best: bool = True,
        keep: Literal["memory", "disk"] = "memory",
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        if mode not in ("auto", "min", "max"):
            raise TrainwiseError(f"mode must be 'auto', 'min' or 'max', got {mode!r}.")
        if not isinstance(patience, int) or patience < 0:
            raise TrainwiseError(f"patience must be a non-negative integer, got {patience!r}.")
        if min_delta < 0:
            raise TrainwiseError(f"min_delta must be 0 or more (the direction comes from mode), got {min_delta}.")
        if keep not in ("memory", "disk"):
            raise TrainwiseError(f"keep must be 'memory' or 'disk', got {keep!r}.")
        if keep == "disk" and path is None:
            raise TrainwiseError("keep='disk' needs path= for the best weights file.")
        self.monitor = monitor
        self.mode: Literal["min", "max"] = metric_mode(monitor) if mode == "auto" else mode
        self.patience = patience
        self.min_delta = min_delta
        self.restore_best = restore_best
        self.keep = keep
        self.path = Path(path) if path is not None else None
        self.best_value: float | None = None
        self.best_epoch: int | None = None
        self.bad_epochs = 0
        self.stopped_epoch: int | None = None
        self._best_state: dict[str, torch.Tensor] | None = None

    def improved(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best_value is None:
            return True
        if self.mode == "min":
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def value_from(self, metrics: dict[str, Any]) -> float:
        """The monitored value; a metric that was never logged is an error naming those that exist."""
        if self.monitor not in metrics:
            available = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))) or "none"
            raise TrainwiseError(
                f"early stopping monitors {self.monitor!r}, which is not logged; use one of: {available}."
            )
        return float(metrics[self.monitor])

    def update(self, epoch: int, metrics: dict[str, Any], model: nn.Module | None = None) -> bool:
        """Record one epoch's metrics; keep the weights if they are the best; return True to stop."""
        value = self.value_from(metrics)
        if self.improved(value):
            self.best_value, self.best_epoch, self.bad_epochs = value, epoch, 0
            if model is not None and self.restore_best:
                self._keep(model)
            return False
        self.bad_epochs += 1
        if self.bad_epochs >= self.patience:  # as in Keras and Lightning: stop on the patience-th bad epoch
            self.stopped_epoch = epoch
            return True
        return False

    def stop_message(self, epoch: int) -> str:
        """Why training stops at ``epoch``, for the log."""
        return (
            f"early stopping at epoch {epoch}: {self.monitor} has not improved for {self.bad_epochs} epochs "
            f"(best {self.best_value:.6g} at epoch {self.best_epoch})."
        )

    def _keep(self, model: nn.Module) -> None:
        state = {k: v.detach().to("cpu", copy=True) for k, v in _unwrap(model).state_dict().items()}
        if self.keep == "memory":
            self._best_state = state
            return
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(state, self.path)

    def restore(self, model: nn.Module) -> int | None:
        """Load the best epoch's weights into ``model``; returns that epoch (None if nothing was kept)."""
        if self.best_epoch is None or not self.restore_best:
            return None
        if self.keep == "memory":
            state = self._best_state
        else:
            assert self.path is not None
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        if state is None:
            return None
        _unwrap(model).load_state_dict(state)
        return self.best_epoch

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "stopped_epoch": self.stopped_epoch,
            "best_state": self._best_state if self.keep == "memory" else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_value = state["best_value"]
        self.best_epoch = state["best_epoch"]
        self.bad_epochs = state["bad_epochs"]
        self.stopped_epoch = state["stopped_epoch"]
        if state.get("best_state") is not None:
            self._best_state = state["best_state"]


__all__ = ["EarlyStopping", "metric_mode"]
