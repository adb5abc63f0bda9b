"""Lightning: ``L.Trainer(callbacks=[TrainwiseGuard()])`` runs the runtime guard over every ``fit``.

On fit start the callback attaches a :class:`~trainwise.guards.Guard` to the LightningModule and its optimizer
(through Lightning's ``LightningOptimizer``); it closes it at fit end (the last checks) or on an exception.
Each finding is a ``GuardWarning`` as with ``trainwise.guard``, and its count per code is logged with
``pl_module.log("trainwise/TW108", n)`` after every training batch once something is found (so it reaches
TensorBoard, W&B, MLflow or CSV at the logger's cadence), and sent to every logger at fit end.

Imports Lightning (``lightning``, or the older ``pytorch_lightning`` package) when imported.
"""

from __future__ import annotations

from typing import Any

from trainwise.guards.core import Action, Guard, GuardFinding
from trainwise.integrations._findings import FindingCounts

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise ImportError("trainwise.integrations.lightning needs Lightning: pip install lightning") from None

STEP_CHECKS = ["TW105", "TW113"]  # the checks a second optimizer's guard runs: those of its own steps


class TrainwiseGuard(Callback):
    """The runtime guard over a Lightning fit: ``L.Trainer(callbacks=[TrainwiseGuard()])``.

    ``action``, ``check_every`` and ``checks`` are :func:`trainwise.guard`'s; ``log=False`` keeps the counts out
    of Lightning's loggers. The forward checked is the LightningModule's (``self(x)``) and that of each direct
    submodule with trainable parameters called outside it (``self.model(x)``): a frozen teacher called under
    ``no_grad`` is not an evaluation. With several optimizers the first gets every check but TW107 (which would
    count the others' parameters as missing) and each other one TW105 and TW113. ``findings`` lists what was
    found in the last fit.
    """

    def __init__(self, *, action: Action = "warn", check_every: int = 50, checks: list[str] | None = None,
                 log: bool = True) -> None:
        super().__init__()
        self.action, self.check_every, self.checks, self.log = action, check_every, checks, log
        self.guards: list[Guard] = []
        self.counts = FindingCounts()

    @property
    def findings(self) -> list[GuardFinding]:
        """Every finding of the last fit, in the order found."""
        return [f for guard in self.guards for f in guard.findings]

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._close(check=False)
        optimizers = pl_module.optimizers()  # LightningOptimizer(s): the guard follows them to the torch one
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        forwards = [m for m in pl_module.children() if any(p.requires_grad for p in m.parameters())]
        first = self.checks
        if len(optimizers) > 1:
            first = [c for c in (self.checks or _all_codes()) if c != "TW107"]
        self.guards = [Guard(pl_module, optimizers[0] if optimizers else None, action=self.action,
                             check_every=self.check_every, checks=first, forwards=forwards)]
        for optimizer in optimizers[1:]:
            codes = [c for c in STEP_CHECKS if self.checks is None or c in self.checks]
            if codes:
                self.guards.append(Guard(pl_module, optimizer, action=self.action, check_every=self.check_every,
                                         checks=codes))
        self.counts = FindingCounts(self.guards)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.log or not any(guard.findings for guard in self.guards):
            return  # a clean run logs nothing
        metrics = self.counts.metrics()
        for name, value in metrics.items():  # every batch: Lightning sends step metrics on its logging steps only
            pl_module.log(name, value, on_step=True, on_epoch=False)
        self.counts.sent(metrics)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close(check=True)
        metrics = self.counts.metrics()
        if self.log and metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
            self.counts.sent(metrics)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(check=False)  # the hooks removed, nothing more reported

    def _close(self, *, check: bool) -> None:
        for guard in reversed(self.guards):  # the last installed first: each puts back what it wrapped
            guard.close(check=check)


def _all_codes() -> list[str]:
    from trainwise.guards.registry import all_check_classes

    return [cls.code for cls in all_check_classes()]
