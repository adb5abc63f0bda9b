"""Progress output: a rich progress bar on a terminal, plain lines otherwise (logs, CI, pipes).

What both print, in the same words: learning rates in scientific notation (``lr 3.0e-05``), other floats to four
decimals, durations as ``1.7 s``, ``2 min 3 s`` or ``1 h 2 min`` (:func:`format_duration`), and, while an epoch
runs, the running metrics of the latest :meth:`PlainProgress.show` and the epoch's ETA (from the time per batch
and the epoch's length; none while the length is unknown).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Any, TextIO

_clock = time.monotonic  # one name, so that tests can drive the clock


def format_duration(seconds: float) -> str:
    """``40 ms``, ``1.7 s``, ``2 min 3 s``, ``1 h 2 min``: the two largest units, rounded."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    seconds = max(float(seconds), 0.0)
    if seconds < 0.0995:
        return f"{seconds * 1000:.0f} ms"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min"


_PLURALS = {"epoch": "epochs"}  # a hard "ch"
# how often the bar is redrawn: each drawing takes the interpreter for about 2.5 ms (a 2-core CPU machine), on a
# thread beside the training steps: rich's default, 10, took 2.2% of every second, 4 takes 0.9%
REFRESHES_PER_SECOND = 4


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``1 epoch``, ``2 epochs``, ``1 batch``, ``3 batches``."""
    if count == 1:
        return f"{count} {noun}"
    if plural_form is None:
        plural_form = _PLURALS.get(noun) or noun + ("es" if noun.endswith(("s", "x", "z", "ch", "sh")) else "s")
    return f"{count} {plural_form}"


def _is_learning_rate(key: str) -> bool:
    return key == "lr" or key.startswith(("lr_", "lr/")) or key.endswith(("_lr", "/lr")) or "learning_rate" in key


def _duration_label(key: str) -> str | None:
    """The label a duration is printed under (``seconds`` -> ``time``), or None when ``key`` is no duration."""
    if key in ("seconds", "time", "elapsed"):
        return "time"
    if key.endswith("_seconds"):
        return key[: -len("_seconds")]
    return None


def format_value(key: str, value: Any) -> str:
    """``key value`` as progress prints it: ``lr 3.0e-05``, ``time 1.7 s``, ``loss 0.2500``, ``step 3``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} {value}"
    label = _duration_label(key)
    if label is not None:
        return f"{label} {format_duration(value)}"
    if _is_learning_rate(key):
        return f"{key} {value:.1e}"
    if isinstance(value, float):
        return f"{key} {value:.4f}" if abs(value) < 1e4 else f"{key} {value:.4g}"
    return f"{key} {value}"


def _format(values: dict[str, Any]) -> str:
    return "  ".join(format_value(key, value) for key, value in values.items())


class _EpochClock:
    """Batches done in the epoch and the time per batch, for the ETA.

    The time per batch is measured from the epoch's first :meth:`advance` on: that one is either the batches a
    resumed epoch skips (no time spent) or the first batch (which also pays for warm-up: loader workers, lazy
    initialisation). Until two advances of an epoch are seen, the previous epoch's time per batch is used.
    """

    def __init__(self) -> None:
        self.total: int | None = None
        self.done = 0
        self.started = _clock()
        self.per_batch: float | None = None
        self._ref: tuple[float, int] | None = None

    def start(self, total: int | None) -> None:
        self.total, self.done, self.started, self._ref = total, 0, _clock(), None

    def advance(self, steps: int) -> None:
        now = _clock()
        self.done += steps
        if self._ref is None:
            self._ref = (now, self.done)
        elif self.done > self._ref[1]:
            self.per_batch = (now - self._ref[0]) / (self.done - self._ref[1])

    def elapsed(self) -> float:
        return _clock() - self.started

    def remaining(self) -> float | None:
        """Seconds left in the epoch's batches, or None (length unknown, no batch timed yet, or all done)."""
        if self.total is None or self.per_batch is None or self.done >= self.total:
            return None
        return (self.total - self.done) * self.per_batch

    def position(self) -> str:
        """``batch 10/23, ETA 12.3 s``, ``batch 10`` (length unknown), or ``batch 0/23`` (no batch timed)."""
        text = f"batch {self.done}" if self.total is None else f"batch {self.done}/{self.total}"
        remaining = self.remaining()
        return text if remaining is None else f"{text}, ETA {format_duration(remaining)}"


class PlainProgress:
    """One line per epoch, plus the running metrics at most every ``interval`` seconds within an epoch."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, interval: float = 30.0) -> None:
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.interval = interval
        self._epoch = "epoch"
        self._timer = _EpochClock()
        self._last_line = _clock()

    def start_epoch(self, epoch: int, epochs: int, total: int | None) -> None:
        self._epoch = f"epoch {epoch}/{epochs}"
        self._timer.start(total)

    def advance(self, steps: int = 1) -> None:
        if self.enabled:
            self._timer.advance(steps)

    def show(self, values: dict[str, Any]) -> None:
        """The running metrics: printed when ``interval`` seconds have passed since the last line."""
        if _clock() - self._last_line >= self.interval:
            self.message(f"{self._epoch} (running: {self._timer.position()})  {_format(values)}".rstrip())

    def message(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)
        self._last_line = _clock()

    def end_epoch(self, epoch: int, epochs: int, values: dict[str, Any]) -> None:
        self.message(f"epoch {epoch}/{epochs}  {_format(values)}")

    def close(self) -> None:
        pass


class BarProgress(PlainProgress):
    """A rich progress bar per epoch: batches done, time spent, ETA, and the latest running metrics beside it
    from the first :meth:`show` on."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
        from rich.table import Column
        from rich.text import Text

        timer = self._timer

        class TimeColumn(ProgressColumn):
            """``3.1 s  ETA 2.8 s``: the epoch's time so far and, once known, the time left."""

            def render(self, task: Any) -> Text:
                remaining = timer.remaining()
                text = format_duration(timer.elapsed())
                return Text(text if remaining is None else f"{text}  ETA {format_duration(remaining)}")

        bar = self
        self._task: Any = None

        class EpochProgress(Progress):
            """Batches done are read from the epoch's clock when the bar is drawn (a few times a second), so that
            a training step makes no call into rich: each would take its lock and record a speed sample."""

            def get_renderables(self) -> Any:
                task = bar._task  # None while an epoch's task is replaced (add_task draws the bar too)
                if task is not None:
                    with contextlib.suppress(KeyError):  # removed by the next epoch's start since it was read
                        self.update(task, completed=timer.done)
                yield from super().get_renderables()

        self.console = Console(file=self.stream)
        self._progress = EpochProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeColumn(),
            TextColumn("{task.fields[metrics]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=self.console,
            transient=True,
            refresh_per_second=REFRESHES_PER_SECOND,
        )
        self._progress.start()

    def start_epoch(self, epoch: int, epochs: int, total: int | None) -> None:
        super().start_epoch(epoch, epochs, total)
        task, self._task = self._task, None
        if task is not None:
            self._progress.remove_task(task)
        self._task = self._progress.add_task(f"epoch {epoch}/{epochs}", total=total, metrics="")

    def show(self, values: dict[str, Any]) -> None:
        """The running metrics, beside the bar at once (the next refresh, a quarter of a second at most)."""
        if self._task is not None:
            self._progress.update(self._task, metrics=_format(values))

    def message(self, text: str) -> None:
        self._progress.console.print(text, highlight=False, markup=False, soft_wrap=True)  # the terminal wraps

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
