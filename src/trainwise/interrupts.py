"""Ctrl-C and preemption at an optimizer-step boundary: the first interrupt during training is held until the
current accumulation window has stepped, so the state a checkpoint saves is exact; a second Ctrl-C stops at
once. A preemption signal (SIGTERM from a scheduler, or the signals ``preempt_signals`` names) is always held:
the loop checkpoints at the next step and raises :class:`Preempted`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

from trainwise.errors import TrainwiseError, show

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: what a process SIGTERM ends exits with, whichever signal preempted it
DEFAULT_PREEMPT_SIGNALS = ("SIGTERM",)


class Preempted(SystemExit):
    """``fit`` was stopped by a preemption signal after its current optimizer step was checkpointed and logged.

    ``result`` holds the :class:`~trainwise.results.FitResult`, ``signal`` the signal's name (``"SIGTERM"``).
    Not an ``Exception``, so ``except Exception`` in a script does not swallow it; uncaught, the process exits
    with code 143 as SIGTERM itself would end it, but with nothing lost (``resume="auto"`` continues).
    """

    def __init__(self, message: str = "", *, signal_name: str = "SIGTERM", result: Any = None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.message = message
        self.signal = signal_name
        self.result = result

    def __str__(self) -> str:
        return self.message or f"preempted by {self.signal}"


def preempt_signal_names(names: Iterable[Any]) -> list[str]:
    """The signal names of ``preempt_signals`` checked and spelt as ``signal`` does (``"USR1"`` -> ``"SIGUSR1"``)."""
    checked: list[str] = []
    for name in names:
        text = str(name).strip().upper()
        text = text if text.startswith("SIG") else f"SIG{text}"
        if text == "SIGINT":
            raise TrainwiseError("preempt_signals cannot hold SIGINT: Ctrl-C already stops at an optimizer step "
                                 "(and raises KeyboardInterrupt); remove it.")
        if text in ("SIGKILL", "SIGSTOP"):
            raise TrainwiseError(f"preempt_signals cannot hold {text}, which no process can catch; use SIGTERM or "
                                 "SIGUSR1.")
        if not isinstance(getattr(signal, text, None), signal.Signals):
            raise TrainwiseError(f"preempt_signals holds {show(name, 40)}, which is no signal here; use names "
                                 "such as SIGTERM or SIGUSR1.")
        if text not in checked:
            checked.append(text)
    return checked


class StepBoundaryInterrupt:
    """Hold a Ctrl-C (SIGINT) that arrives while ``armed`` until the loop checks ``requested``, and any of the
    ``preempt`` signals until it checks ``preempted``; ``on_signal`` is called when either is set (the Trainer's
    :class:`~trainwise.run_control.RunControl` learns of it there, so its loop reads one flag a step).

    >>> with StepBoundaryInterrupt(preempt=("SIGTERM",)) as interrupt:
    ...     for batch in loader:
    ...         interrupt.armed = True
    ...         train_step(batch)          # a Ctrl-C here only sets interrupt.requested
    ...         interrupt.armed = False
    ...         if interrupt.requested:
    ...             save_checkpoint(); raise KeyboardInterrupt
    ...         if interrupt.preempted:    # "SIGTERM": held wherever it arrived
    ...             save_checkpoint(); raise Preempted(signal_name=interrupt.preempted)

    While not armed (validation, set-up) and on a second Ctrl-C, ``KeyboardInterrupt`` is raised at once as
    usual. A preemption signal is held armed or not, and repeats of it are ignored (a scheduler's SIGKILL ends
    the process at the end of its grace period). Only the main thread can handle signals, and a handler the
    program installed itself is left in place: in both cases nothing changes for that signal (``active`` is
    False for SIGINT). Every handler is put back on exit; a preemption signal the block did not end in
    :class:`Preempted` for (it arrived after the loop's last look, while the run was closing) is then sent
    again, so it is delayed until the block is done, never lost.
    """

    def __init__(self, *, enabled: bool = True, preempt: Iterable[str] = (),
                 on_signal: Callable[[], None] | None = None) -> None:
        self.enabled = enabled
        self.on_signal = on_signal  # called once a signal is held (requested or preempted just set)
        self.armed = False
        self.requested = False
        self.active = False
        self.preempt = preempt_signal_names(preempt)
        self.preempted: str | None = None  # the name of the first preemption signal received
        self.preempt_active: list[str] = []  # the preemption signals this object handles
        self._previous: Any = None
        self._previous_preempt: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StepBoundaryInterrupt:
        if threading.current_thread() is not threading.main_thread():
            return self
        if self.enabled and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self.active = True
        for name in self.preempt:
            number = signal.Signals[name]
            if signal.getsignal(number) is signal.SIG_DFL:  # the program's own handler (or SIG_IGN) stays
                self._previous_preempt[number] = signal.signal(number, self._preempt)
                self.preempt_active.append(name)
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self._previous)
            self.active = False
        for number, previous in self._previous_preempt.items():
            signal.signal(number, previous)
        self._previous_preempt.clear()
        self.preempt_active = []
        if self.preempted is not None and not (kind is not None and issubclass(kind, Preempted)):
            # it came after the loop's last look (while the run was closing): not lost, delivered now that
            # the run is closed, to the handler that was there before (the default one ends the process)
            signal.raise_signal(signal.Signals[self.preempted])

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold a Ctrl-C for the duration (a checkpoint being written), as during training."""
        armed, self.armed = self.armed, True
        try:
            yield
        finally:
            self.armed = armed

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.armed and not self.requested:
            self.requested = True  # the loop stops once the current window has stepped
            if self.on_signal is not None:
                self.on_signal()
            return
        raise KeyboardInterrupt

    def _preempt(self, signum: int, frame: FrameType | None) -> None:
        if self.preempted is None:
            self.preempted = signal.Signals(signum).name  # the loop stops at its next optimizer step
            if self.on_signal is not None:
                self.on_signal()
