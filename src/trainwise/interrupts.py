"""Ctrl-C at an optimizer-step boundary: the first interrupt during training is held until the current
accumulation window has stepped, so the state a checkpoint saves is exact; a second one stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any


class StepBoundaryInterrupt:
    """Hold a Ctrl-C (SIGINT) that arrives while ``armed`` until the loop checks ``requested``.

    >>> with StepBoundaryInterrupt() as interrupt:
    ...     for batch in loader:
    ...         interrupt.armed = True
    ...         train_step(batch)          # a Ctrl-C here only sets interrupt.requested
    ...         interrupt.armed = False
    ...         if interrupt.requested:
    ...             save_checkpoint(); raise KeyboardInterrupt

    While not armed (validation, set-up) and on a second Ctrl-C, ``KeyboardInterrupt`` is raised at once as
    usual. Only the main thread can handle signals, and a handler the program installed itself is left in
    place: in both cases nothing changes (``active`` is False).
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.armed = False
        self.requested = False
        self.active = False
        self._previous: Any = None

    def __enter__(self) -> StepBoundaryInterrupt:
        if (self.enabled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self._previous)
            self.active = False

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
            self.requested = True  # the loop raises once the current window has stepped
            return
        raise KeyboardInterrupt
