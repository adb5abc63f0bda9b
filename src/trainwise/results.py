"""What ``Trainer.fit`` returns."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from trainwise.diagnosis import OverfittingReport


@dataclasses.dataclass
class FitResult:
    """What ``fit`` returns: one record per epoch, where the log is, and why training stopped."""

    history: list[dict[str, float]]
    run_dir: Path
    steps: int  # optimizer steps taken
    seconds: float
    stopped: Literal["completed", "interrupted", "preempted", "nonfinite"]
    device: str
    precision: str
    message: str = ""
    best_epoch: int | None = None  # by ``monitor``; with early stopping, the epoch whose weights the model has
    best_value: float | None = None
    stopped_early: bool = False
    overfitting: OverfittingReport | None = None
    plot: Path | None = None
    model: Any = None  # the trained torch.nn.Module (the one passed in, or the one the factory built)

    @property
    def last(self) -> dict[str, float]:
        """The last epoch's record (empty if no epoch finished)."""
        return self.history[-1] if self.history else {}
