"""Callbacks: a user's own logic at six points of ``Trainer.fit``, with a read-only view of the run
(:class:`TrainingState`: the step, the epoch, the metrics and history, the model, optimizer and run folder) that
can log a metric or ask the run to stop, and reaches nothing else of the run. docs/callbacks.md shows each event
with an example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwise.errors import TrainwiseError, first_line, show

if TYPE_CHECKING:
    import torch

    from trainwise.checkpoint.resume import LoopCounters
    from trainwise.run_control import Outcome, RunControl

EVENTS = ("on_fit_start", "on_epoch_start", "on_step_end", "on_validation_end", "on_epoch_end", "on_fit_end")
_RESERVED = ("kind", "epoch", "step")
# other libraries' names for the same points (Lightning, Keras, Hugging Face): named with the fix, never ignored
_ALIASES = {
    "on_train_start": "on_fit_start", "on_train_begin": "on_fit_start", "on_fit_begin": "on_fit_start",
    "on_train_epoch_start": "on_epoch_start", "on_epoch_begin": "on_epoch_start",
    "on_train_batch_end": "on_step_end", "on_batch_end": "on_step_end", "on_optimizer_step": "on_step_end",
    "on_validation_epoch_end": "on_validation_end", "on_evaluate": "on_validation_end",
    "on_train_epoch_end": "on_epoch_end", "on_train_end": "on_fit_end",
}


class Callback:
    """A base class whose events do nothing; any object with some of the methods in ``EVENTS`` works too.

    Each event receives a :class:`TrainingState`. Only the events a callback defines are called, so an
    unused ``on_step_end`` costs nothing per step.
    """

    def on_fit_start(self, state: TrainingState) -> None:
        """Once, after set-up and any resume, before the first epoch."""

    def on_epoch_start(self, state: TrainingState) -> None:
        """At the start of each epoch, before its first batch."""

    def on_step_end(self, state: TrainingState) -> None:
        """After each optimizer step (each accumulation window)."""

    def on_validation_end(self, state: TrainingState) -> None:
        """After each epoch's validation (only with validation data); metrics logged here join the epoch's
        record, so ``monitor`` can follow them."""

    def on_epoch_end(self, state: TrainingState) -> None:
        """After each epoch's record is logged, before its checkpoint."""

    def on_fit_end(self, state: TrainingState) -> None:
        """Once, when fit ends for any reason; ``state.status`` says which."""


class LatestMetrics:
    """The newest metric values already read from the device, which a callback's ``state.metrics`` shows. One
    owner (the run builds one, :mod:`trainwise.run`) and one way to write it, :meth:`publish`: the log cadence
    publishes each log interval's running values, the loop each epoch's record."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: Mapping[str, float] = {}

    def publish(self, values: Mapping[str, float]) -> None:
        """Show ``values`` from now on; the epoch's record is published as it is built (the callbacks' metrics,
        the learning rate and the step join it afterwards, and the view shows them too)."""
        self.values = values


class TrainingState:
    """What a callback sees of the run: read-only values, plus :meth:`log` and :meth:`request_stop`.

    Each value is read from the object that owns it (named in its docstring); the view holds nothing else of
    the run, so a callback cannot reach the loop, the run folder or the checkpoints. ``metrics`` are the latest
    values already read from the device (the last log interval during an epoch, the epoch's record after it), so
    reading them never waits for the device.
    """

    def __init__(self, *, epochs: int, counters: LoopCounters, steps: Callable[[], int], latest: LatestMetrics,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer, run_dir: str | os.PathLike[str],
                 control: RunControl, outcome: Outcome) -> None:
        self.epochs = epochs  # the epochs fit was asked for
        self._counters = counters
        self._steps = steps
        self._latest = latest
        self._model = model
        self._optimizer = optimizer
        self._run_dir = Path(run_dir)
        self._control = control
        self._outcome = outcome
        self._logged: dict[str, float] = {}

    @property
    def status(self) -> str | None:
        """At ``on_fit_end``: finished, stopped_early, interrupted, preempted or failed (None before); owned by
        the run's :class:`~trainwise.run_control.Outcome`."""
        return self._outcome.status

    @property
    def stop_reason(self) -> str | None:
        """The reason of the stop requested so far (:meth:`request_stop`), None when none was; owned by the
        :class:`~trainwise.run_control.RunControl`."""
        request = self._control.request
        return None if request is None else request[0]

    @property
    def stop_message(self) -> str | None:
        """The sentence the run says when it stops for ``stop_reason`` (the RunControl's, as ``stop_reason``)."""
        request = self._control.request
        return None if request is None else request[1]

    @property
    def epoch(self) -> int:
        """The current epoch, counted from 1 (at ``on_fit_end``, the last one trained); the loop's one epoch
        counter, :class:`~trainwise.checkpoint.resume.LoopCounters`' ``epoch``."""
        return int(self._counters.epoch)

    @property
    def step(self) -> int:
        """Optimizer steps taken so far; the count the run's :class:`~trainwise.accumulation.GradientAccumulator`
        keeps."""
        return int(self._steps())

    @property
    def metrics(self) -> Mapping[str, float]:
        """The newest values read from the device, as :class:`LatestMetrics` (the run's one) holds them."""
        return types.MappingProxyType(dict(self._latest.values))

    @property
    def history(self) -> tuple[Mapping[str, float], ...]:
        """One record per finished epoch, as ``FitResult.history`` will hold them; owned by the loop's
        :class:`~trainwise.checkpoint.resume.LoopCounters`."""
        return tuple(types.MappingProxyType(dict(r)) for r in self._counters.history)

    @property
    def model(self) -> torch.nn.Module:
        """The model being trained (the user's module, not a DDP or compiled wrapper)."""
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The run's optimizer."""
        return self._optimizer

    @property
    def run_dir(self) -> Path:
        """The run folder (its files are the run's to write: read them, write your own beside them)."""
        return self._run_dir

    def log(self, name: str, value: Any) -> None:
        """Log a metric at the current step: in ``metrics.jsonl``, every tracker, and, from
        ``on_validation_end``, the epoch's record. A tensor is read here (one device sync). A value no float
        holds (``10**400``) is refused in one sentence rather than logged as inf, which would lose it unsaid."""
        if not isinstance(name, str) or not name or name in _RESERVED:
            raise TrainwiseError(f"a callback metric needs a name other than {', '.join(_RESERVED)}, got {show(name)}.")
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            raise TrainwiseError(f"callback metric {name} must be a number or a one-element tensor, got "
                                 f"{type(value).__name__}.") from None
        except OverflowError:  # refused rather than logged as inf: the value would be silently lost
            what = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else show(value)
            raise TrainwiseError(f"callback metric {name} is {what}, too large for a float (at most about 1.8e308); "
                                 "log a scaled value, such as math.log10 of it.") from None
        self._logged[name] = number

    def request_stop(self, reason: str = "a callback asked to stop", *, message: str | None = None) -> None:
        """End the run after the current epoch (its validation, record and checkpoint included); under
        torchrun the request of rank 0 decides for every process. The run then says ``message``, by default
        "stopped after epoch N: <reason>."."""
        message = message if message is not None else f"stopped after epoch {self.epoch}: {reason}."
        self._control.request_stop(str(reason), message)

    def take_logged(self) -> dict[str, float]:
        """The metrics logged since the last call (the callback list writes them), emptied."""
        logged, self._logged = self._logged, {}
        return logged


@dataclasses.dataclass(frozen=True)
class CallbackErrors:
    """What the callbacks' end event found, for the run's end record: ``cause``, the callback whose error ended
    the run (None when no callback's did); ``others``, every other callback error as ``(callback, error)``;
    ``raised``, the error to raise once the end is recorded (None when the run was failing already, or when no
    callback raised)."""

    cause: str | None = None
    others: tuple[tuple[str, BaseException], ...] = ()
    raised: BaseException | None = None

    def record(self) -> dict[str, Any]:
        """The end record's ``callback`` and ``also_failed``, those that have something to say."""
        fields: dict[str, Any] = {} if self.cause is None else {"callback": self.cause}
        if self.others:
            fields["also_failed"] = [{"callback": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
                                     for name, exc in self.others]
        return fields


class CallbackList:
    """The run's callbacks, by event; each event calls only the callbacks that define it. ``policies`` are
    the Trainer's built-in ones (:mod:`trainwise.policies`), called before or after the user's by their ``order``.
    ``outcome`` is the run's :class:`~trainwise.run_control.Outcome`, marked failed when an ``on_fit_end`` raises."""

    def __init__(self, callbacks: Iterable[Any], state: TrainingState, *, outcome: Outcome,
                 policies: Iterable[Any] = ()) -> None:
        callbacks = list(_as_list(callbacks))
        self.state = state
        self.outcome = outcome
        self.handlers: dict[str, list[Any]] = {event: [] for event in EVENTS}  # the user's
        for callback in callbacks:
            _check_callback(callback)
            for event in EVENTS:
                method = getattr(callback, event, None)
                if callable(method) and getattr(type(callback), event, None) is not getattr(Callback, event):
                    self.handlers[event].append(method)
        self.step_end = bool(self.handlers["on_step_end"])  # the user's: whether a step has any to call
        self.before: dict[str, list[Any]] = {event: [] for event in EVENTS}
        self.after: dict[str, list[Any]] = {event: [] for event in EVENTS}
        for policy in policies:
            for event in EVENTS:
                method = getattr(policy, event, None)
                if callable(method):
                    (self.after if policy.order == "after" else self.before)[event].append(method)
        self.policies = {event: [*self.before[event], *self.after[event]] for event in EVENTS}
        # what the user's handlers run inside: the Trainer's guards watch every forward a callback runs
        self.context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def fire(self, event: str, *, users: bool = True) -> dict[str, float]:
        """Call ``event`` on the policies and the callbacks that define it (only the policies when ``users`` is
        False); returns the metrics the callbacks logged."""
        state = self.state
        if not (users and self.handlers[event]):  # the policies alone (every step, usually): the short way
            for handler in self.policies[event]:
                handler(state)
            return state.take_logged() if state._logged else {}
        for handler in self.before[event]:
            handler(state)
        handlers = self.handlers[event]
        if handlers and users:
            with self.context():
                for handler in handlers:
                    try:
                        handler(state)
                    except Exception as exc:  # it ends the run: the end record names it (see fire_naming)
                        _name(exc, handler, event)
                        raise
        for handler in self.after[event]:
            handler(state)
        return state.take_logged() if state._logged else {}

    def fire_naming(self, event: str, *, failing: BaseException | None = None) -> CallbackErrors:
        """:meth:`fire` for the run's last event, ``on_fit_end``: every handler is called even after one raised
        (each callback gets its end; the later ones see ``state.status == "failed"``), and each error names its
        callback (``trainwise_callback`` on the exception: ``"MyCallback.on_fit_end"``). ``failing`` is the error
        the run is failing with, if any. Returns what the end record says of the callbacks (:class:`CallbackErrors`):
        the error that reaches the user (``failing``, else the first raised here, which the caller raises once the
        end is recorded) gets a note for each other callback error. Ctrl-C or an exit inside a handler propagates at
        once. Nothing is logged after it."""
        state = self.state
        raised: list[BaseException] = []
        with self.context():
            for handler in [*self.before[event], *self.handlers[event], *self.after[event]]:
                try:
                    handler(state)
                except Exception as exc:
                    _name(exc, handler, event)
                    raised.append(exc)
                    self.outcome.status = "failed"
                except BaseException as exc:  # Ctrl-C or an exit: nothing more is called
                    _name(exc, handler, event)
                    raise
        state.take_logged()
        shown = failing if failing is not None else raised[0] if raised else None
        others = tuple((getattr(error, "trainwise_callback", "a callback"), error) for error in raised
                       if error is not shown)
        for name, error in others:
            _add_note(shown, f"{name} also raised {type(error).__name__}: {first_line(error)}")
        return CallbackErrors(cause=getattr(shown, "trainwise_callback", None), others=others,
                              raised=raised[0] if raised and failing is None else None)


def _name(exc: BaseException, handler: Any, event: str) -> None:
    """Set ``trainwise_callback`` on ``exc``, the name of the callback that raised it (the first one set stays)."""
    if getattr(exc, "trainwise_callback", None) is not None:
        return
    owner = getattr(handler, "__self__", None)
    name = f"{type(owner).__name__}.{event}" if owner is not None else getattr(handler, "__qualname__", "a callback")
    with contextlib.suppress(AttributeError, TypeError):  # an exception that takes no attribute
        exc.trainwise_callback = name  # type: ignore[attr-defined]


def _add_note(exc: BaseException | None, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10 the note is kept in ``__notes__`` without being printed."""
    if exc is None:
        return
    with contextlib.suppress(AttributeError, TypeError):
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:  # pragma: no cover - Python 3.10
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def callback_metrics(logged: dict[str, float], record: dict[str, float]) -> dict[str, float]:
    """Metrics logged at ``on_validation_end`` join the epoch's record; a name the record has is refused."""
    for name in logged:
        if name in record:
            raise TrainwiseError(f"a callback logged {name}, which the Trainer already logs this epoch; give your "
                                 "metric another name.")
    return logged


def _as_list(callbacks: Any) -> Iterable[Any]:
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        return [callbacks]
    return callbacks


def _check_callback(callback: Any) -> None:
    """A callback defines at least one event; a misspelt one (``on_epoch_ends``) is named with the fix."""
    if isinstance(callback, type):
        raise TrainwiseError(f"callbacks takes callback objects, got the class {callback.__name__}; pass "
                             f"{callback.__name__}() instead.")
    names = [n for n in dir(callback) if n.startswith("on_") and callable(getattr(callback, n, None))]
    for name in names:
        if name in EVENTS:
            continue
        close = [_ALIASES[name]] if name in _ALIASES else difflib.get_close_matches(name, EVENTS, n=1, cutoff=0.8)
        if close:  # a misspelt event would silently never be called
            raise TrainwiseError(f"callback {type(callback).__name__} has a method {name}, which is no event; did "
                                 f"you mean {close[0]}?")
    if not any(n in EVENTS for n in names):
        raise TrainwiseError(f"callback {type(callback).__name__} defines none of the events {', '.join(EVENTS)}.")
