"""How a run ends, with one owner: :class:`RunControl` takes the signals (Ctrl-C, a scheduler's preemption), the
stops that early stopping and callbacks request, and answers the loop at an optimizer-step or epoch boundary
with one :class:`Stop` (why the run ends there, and whether to save a checkpoint first). Under several
processes every answer is agreed: a requested stop through the strategy at the epoch's end (rank 0 decides), a
preemption through the window's count all-reduce (:class:`AgreedFlag`, no collective of its own).

    >>> control = RunControl(counters, preempt=("SIGTERM",), agree=strategy.agree, distributed=strategy.enabled)
    >>> control.share(accumulator)                       # several processes: a preemption rides the count
    >>> with control:                                    # the signal handlers, put back on exit
    ...     for epoch in epochs:
    ...         with control.training():                 # a Ctrl-C here waits for the window's step
    ...             for batch in loader:
    ...                 if train_step(batch) and control.asked and (stop := control.at_step()):
    ...                     break                         # stop.save: checkpoint this step first
    ...         control.agree()                          # a requested stop, agreed before the checkpoint
    ...         save_checkpoint()
    ...         stop = control.at_epoch(epoch)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch

from trainwise.interrupts import Preempted, StepBoundaryInterrupt

ANOTHER_PROCESS = "a signal to another process"  # the signal's name where only another process received one


@dataclasses.dataclass(frozen=True)
class Stop:
    """The control's answer at a boundary: the run ends there, for ``reason``; ``save``: write a checkpoint of
    this step first (an interrupt or a preemption between two epochs' checkpoints)."""

    reason: Literal["interrupted", "preempted", "stopped_early"]
    save: bool = False
    signal: str | None = None  # preempted: the signal's name
    message: str | None = None  # stopped_early: the sentence the run says (None: said already, at the resume)

    def error(self, message: str) -> BaseException | None:
        """What ``fit`` raises for this end: ``KeyboardInterrupt``, :class:`Preempted`; None for an early stop."""
        if self.reason == "interrupted":
            return KeyboardInterrupt()
        if self.reason == "preempted":
            return Preempted(message, signal_name=self.signal or ANOTHER_PROCESS)
        return None


@dataclasses.dataclass
class Outcome:
    """How one fit ended, as one record: written at the loop's one end, read by the end record, the callbacks'
    ``state.status`` and the :class:`~trainwise.results.FitResult`."""

    stopped: Literal["completed", "interrupted", "preempted", "nonfinite"] = "completed"
    stopped_early: bool = False
    saved: bool = False  # a checkpoint of the last step is on disk: resuming it continues the run
    message: str = ""
    status: str | None = None  # the end state the callbacks and trackers were told; None until then

    def end_state(self) -> str:
        """``finished``, ``stopped_early``, ``interrupted``, ``preempted`` or ``failed`` (a non-finite loss)."""
        if self.stopped == "completed":
            return "stopped_early" if self.stopped_early else "finished"
        return "failed" if self.stopped == "nonfinite" else self.stopped


class AgreedFlag:
    """A flag any process may raise, agreed through a count all-reduce the loop runs anyway (the accumulator's
    ``shared`` slot): each window carries every process's ``value``, and the sum is read at the next window's
    step, when its copy to the host has long finished, so no step waits for the device and every process sees
    the flag turn True after the same step."""

    def __init__(self, on_agreed: Callable[[], None] | None = None) -> None:
        self.value = 0.0  # this process's vote, carried by the next window's all-reduce
        self.agreed = False
        self._on_agreed = on_agreed
        self._pending: tuple[torch.Tensor, Any] | None = None  # the last window's sum, read a window later

    def raise_flag(self) -> None:
        self.value = 1.0

    def reduced(self, total: torch.Tensor) -> None:
        """The window's sum over the processes (on the device): the previous window's is read, this one's copy
        to the host started (in the background on CUDA, an event marking its end)."""
        if self._pending is not None and not self.agreed:
            flag, event = self._pending
            if event is not None:
                event.synchronize()
            if flag.item() > 0:
                self.agreed = True
                if self._on_agreed is not None:
                    self._on_agreed()
        if total.device.type == "cuda":
            host = total.to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (host, event)
        else:
            self._pending = (total, None)


class RunControl:
    """The one owner of how a run ends; see the module's docstring for the loop around it.

    ``asked`` is a plain attribute the loop reads after each window (no call a step): True once a held Ctrl-C,
    a preemption (one process) or an agreed preemption (several) waits for :meth:`at_step`. ``counters`` are the
    checkpointed loop counters, whose ``stopped_early`` this object alone writes (:meth:`agree`) and reads.
    Ctrl-C is held only with one process; several processes agree on a step through the strategy instead.
    """

    def __init__(self, counters: Any, *, preempt: Iterable[str] = (), agree: Callable[[bool], bool] = bool,
                 distributed: bool = False) -> None:
        self.counters = counters
        self.distributed = distributed
        self.asked = False
        self.request: tuple[str, str] | None = None  # (reason, message) of the stop a callback requested
        self.signals = StepBoundaryInterrupt(enabled=not distributed, preempt=preempt, on_signal=self._signalled)
        self.flag = AgreedFlag(on_agreed=self._agreed)
        self._agree = agree

    # -- the signals ------------------------------------------------------------------------------------

    def __enter__(self) -> RunControl:
        self.signals.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.signals.__exit__(kind, *exc)

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """The batches of an epoch: a first Ctrl-C is held until the window has stepped (:meth:`at_step`)."""
        self.signals.armed = True
        try:
            yield
        finally:
            self.signals.armed = False

    def held(self) -> contextlib.AbstractContextManager[None]:
        """Hold a Ctrl-C for the duration (a checkpoint being written), as during training."""
        return self.signals.held()

    def share(self, accumulator: Any) -> None:
        """Under several processes, a preemption rides ``accumulator``'s count all-reduce (on every process)."""
        if self.distributed:
            accumulator.shared = self.flag

    def _signalled(self) -> None:
        """A held signal: the loop answers it at its next boundary; under several processes a preemption first
        rides the next window's count all-reduce, so that every process stops after the same step."""
        if self.signals.requested or not self.distributed:
            self.asked = True
        else:
            self.flag.raise_flag()

    def _agreed(self) -> None:
        self.asked = True

    # -- the requests ------------------------------------------------------------------------------------

    def request_stop(self, reason: str, message: str) -> None:
        """End the run after the current epoch (early stopping, a callback); rank 0's request decides."""
        self.request = (reason, message)

    @property
    def stopped_early(self) -> bool:
        """The run stopped early (before a resume too: the checkpoint's counters keep it), so it trains no more."""
        return bool(self.counters.stopped_early)

    def agree(self) -> bool:
        """At an epoch's end, on every process (a collective under several): whether a requested stop ends the
        run after this epoch, rank 0's request deciding; recorded in the counters the epoch's checkpoint saves."""
        self.counters.stopped_early = self._agree(self.request is not None)
        return self.counters.stopped_early

    # -- the answers ------------------------------------------------------------------------------------

    def at_step(self) -> Stop | None:
        """After a window that stepped, once ``asked``: the held Ctrl-C or the (agreed) preemption, to be saved
        at this step first."""
        return self._signal_stop(save=True)

    def at_epoch(self, epoch: int) -> Stop | None:
        """After the epoch's checkpoint: a held signal, else the agreed stop; a run that ends here anyway ends as
        preempted when this process holds a preemption not yet agreed."""
        stop = self._signal_stop(save=False)
        if stop is None and self.counters.stopped_early:
            stop = self.at_end() or Stop("stopped_early", message=(
                self.request[1] if self.request is not None else f"stopped after epoch {epoch}: rank 0 asked to stop."))
        return stop

    def at_end(self) -> Stop | None:
        """After the last epoch (or none, for a run that had stopped early): a preemption this process holds
        that no boundary answered (it came after the last agreement) ends the run as preempted."""
        preempted = self.signals.preempted
        return None if preempted is None else Stop("preempted", signal=preempted)

    def _signal_stop(self, *, save: bool) -> Stop | None:
        if self.signals.requested:
            return Stop("interrupted", save=save)
        if self.flag.agreed or (self.signals.preempted is not None and not self.distributed):
            return Stop("preempted", save=save, signal=self.signals.preempted or ANOTHER_PROCESS)
        return None


__all__ = ["AgreedFlag", "Outcome", "RunControl", "Stop"]
