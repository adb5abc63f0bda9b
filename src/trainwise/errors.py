"""The one exception type for user mistakes: its message is a single sentence that names the fix."""

from __future__ import annotations


class TrainwiseError(ValueError):
    """A user mistake (bad input, bad configuration). The CLI prints it without a traceback and exits 2."""


class NonFiniteLossError(TrainwiseError):
    """The training loss became NaN or infinite; carries the global step where it first happened."""

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step
