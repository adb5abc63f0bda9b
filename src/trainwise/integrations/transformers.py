"""Hugging Face: ``Trainer(..., callbacks=[TrainwiseGuard()])`` runs the runtime guard over ``trainer.train()``.

``on_train_begin`` receives the model and the optimizer Accelerate has prepared (an ``AcceleratedOptimizer``,
which the guard follows to the torch optimizer); the callback attaches a :class:`~trainwise.guards.Guard` to
them and closes it in ``on_train_end``. Each finding is a ``GuardWarning`` as with ``trainwise.guard``; at each
of the Trainer's logs the guard's device checks run and the count per code joins the logged values
(``trainwise/TW108``: TensorBoard, W&B, MLflow and ``trainer.state.log_history`` get it); what the last checks
find after the Trainer's last log is logged once more, the same way, before the loggers close.

Imports ``transformers`` when imported.
"""

from __future__ import annotations

import sys
from typing import Any

from trainwise.guards.core import Action, Guard, GuardFinding
from trainwise.integrations._findings import FindingCounts

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError("trainwise.integrations.transformers needs Hugging Face Transformers: "
                      "pip install transformers") from None

_FRAMES = 4  # frames searched above a callback method for the CallbackHandler that calls it


class TrainwiseGuard(TrainerCallback):
    """The runtime guard over a Hugging Face ``Trainer`` run: ``Trainer(..., callbacks=[TrainwiseGuard()])``.

    ``action``, ``check_every`` and ``checks`` are :func:`trainwise.guard`'s; ``log=False`` keeps the counts out
    of the Trainer's logs. At the start of training the callback moves itself first among the Trainer's
    callbacks, so that the reporting ones (TensorBoard, W&B, MLflow...) see the counts it adds to each log.
    ``findings`` lists what the last ``train()`` found.
    """

    def __init__(self, *, action: Action = "warn", check_every: int = 50, checks: list[str] | None = None,
                 log: bool = True) -> None:
        self.action, self.check_every, self.checks, self.log = action, check_every, checks, log
        self.guard: Guard | None = None
        self.counts = FindingCounts()
        self._handler: Any = None
        self._running = False

    @property
    def findings(self) -> list[GuardFinding]:
        """Every finding of the last ``train()``, in the order found."""
        return list(self.guard.findings) if self.guard is not None else []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self._close(check=False)
        self.guard = Guard(model, optimizer, action=self.action, check_every=self.check_every, checks=self.checks)
        self.counts = FindingCounts([self.guard])
        self._running = True
        self._handler = _handler_calling(self)
        if self._handler is not None and self._handler.callbacks[0] is not self:
            # a new list: the one the handler is iterating now is left as it is
            self._handler.callbacks = [self, *(cb for cb in self._handler.callbacks if cb is not self)]

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not self._running or logs is None or self.guard is None:
            return
        self.guard.check_now()  # the checks that read the device: the Trainer reads the loss here anyway
        metrics = self.counts.metrics()
        if self.log and metrics:
            last = state.log_history[-1] if state.log_history else None
            if isinstance(last, dict) and all(last.get(key) is value for key, value in logs.items()):
                last.update(metrics)  # the Trainer's copy of these logs (the same values: a NaN is itself)
            logs.update(metrics)
            self.counts.sent(metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close(check=True)
        if not self.log or not self.counts.unsent():
            return
        logs = self.counts.metrics()  # found by the last checks, after the Trainer's last log: logged as it logs
        state.log_history.append({**logs, "step": state.global_step})
        if self._handler is not None:
            self._handler.on_log(args, state, control, logs)
        self.counts.sent(logs)

    def _close(self, *, check: bool) -> None:
        self._running = False
        if self.guard is not None:
            self.guard.close(check=check)


def _handler_calling(callback: TrainerCallback) -> Any:
    """The Trainer's ``CallbackHandler`` whose ``call_event`` is running ``callback``'s method (the caller's
    ``self``, holding ``callback`` in its ``callbacks``), or None."""
    frame = sys._getframe(2)  # the callback's method is frame 1
    for _ in range(_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if any(cb is callback for cb in getattr(owner, "callbacks", None) or ()):
            return owner
        frame = frame.f_back
    return None
