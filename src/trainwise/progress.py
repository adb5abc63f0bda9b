"""Progress output: a rich progress bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _format(values: dict[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        if isinstance(value, float):
            parts.append(f"{key} {value:.4f}" if abs(value) < 1e4 else f"{key} {value:.4g}")
        else:
            parts.append(f"{key} {value}")
    return "  ".join(parts)


class PlainProgress:
    """One line per epoch, plus the running metrics at most every ``interval`` seconds within an epoch."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, interval: float = 30.0) -> None:
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.interval = interval
        self._epoch = "epoch"
        self._last_line = time.monotonic()

    def start_epoch(self, epoch: int, epochs: int, total: int | None) -> None:
        self._epoch = f"epoch {epoch}/{epochs}"

    def advance(self, steps: int = 1) -> None:
        pass

    def show(self, values: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last_line >= self.interval:
            self.message(f"{self._epoch} (running)  {_format(values)}")

    def message(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)
        self._last_line = time.monotonic()

    def end_epoch(self, epoch: int, epochs: int, values: dict[str, Any]) -> None:
        self.message(f"epoch {epoch}/{epochs}  {_format(values)}")

    def close(self) -> None:
        pass


class BarProgress(PlainProgress):
    """A rich progress bar per epoch, with the running metrics beside it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=self.stream)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
            transient=True,
        )
        self._task: Any = None
        self._progress.start()

    def start_epoch(self, epoch: int, epochs: int, total: int | None) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(f"epoch {epoch}/{epochs}", total=total, metrics="")

    def advance(self, steps: int = 1) -> None:
        self._progress.advance(self._task, steps)

    def show(self, values: dict[str, Any]) -> None:
        self._progress.update(self._task, metrics=_format(values))

    def message(self, text: str) -> None:
        self._progress.console.print(text, highlight=False, markup=False)

    def close(self) -> None:
        self._progress.stop()


def make_progress(mode: str, stream: TextIO | None = None) -> PlainProgress:
    """``auto`` gives a bar on a terminal and plain lines otherwise; ``off`` prints nothing."""
    stream = stream or sys.stdout
    if mode == "off":
        return PlainProgress(stream, enabled=False)
    if mode == "bar" or (mode == "auto" and stream.isatty()):
        return BarProgress(stream)
    return PlainProgress(stream)
