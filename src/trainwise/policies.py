"""The Trainer's loop policies, as built-in callbacks on the callback protocol (:mod:`trainwise.callbacks`):
each owns one decision and its own state, and is told of the same events a user's callback is.

- :class:`UnfreezeSchedule`: ``unfreeze_at``, at the start of the epochs it names; replayed on resume;
- :class:`LogCadence`: the running values every ``log_every`` optimizer steps (one host read each);
- :class:`PeriodicCheckpoint`: a checkpoint every ``checkpoint_every`` optimizer steps;
- :class:`PlateauStep`: ``ReduceLROnPlateau`` stepped once per epoch on the validation (else training) loss;
- :class:`OverfittingWatch`: the onset of overfitting, reported once;
- :class:`EarlyStop`: early stopping, which asks the run to stop (``state.request_stop``) like any callback.

``BEFORE`` policies run before the user's callbacks at an event, ``AFTER`` ones after them (early stopping
sees what the callbacks asked; the plateau step sees the metrics they logged). A built-in policy reaches the
loop through ``state.fit`` (package-internal: the Trainer's view of the run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from trainwise.diagnosis import detect_overfitting
from trainwise.early_stopping import EarlyStopping
from trainwise.freezing import unfreeze_into
from trainwise.guards.loss import check_finite_everywhere
from trainwise.progress import BarProgress


class Policy:
    """A built-in callback; ``order`` says whether it runs before or after the user's callbacks."""

    order: ClassVar[Literal["before", "after"]] = "before"


class UnfreezeSchedule(Policy):
    """Unfreeze the parameters matching each pattern at the start of its epoch, adding them to the optimizer
    (and the scheduler); a resume replays the unfreezing done by then, so the optimizer has its groups."""

    def __init__(self, unfreeze_at: dict[int, list[str]], *, lr_by_pattern: dict[str, float] | None) -> None:
        self.unfreeze_at = unfreeze_at
        self.lr_by_pattern = lr_by_pattern

    def replay(self, model: Any, optimizer: Any, scheduler: Any, *, epoch: int, mid_epoch: bool) -> None:
        """Before a checkpoint of ``epoch`` is restored: every unfreezing done by then, again."""
        for at in sorted(self.unfreeze_at):
            if at < epoch or (mid_epoch and at == epoch):
                unfreeze_into(model, optimizer, *self.unfreeze_at[at], lr_by_pattern=self.lr_by_pattern,
                              scheduler=scheduler)

    def on_epoch_start(self, state: Any) -> None:
        fit, epoch = state.fit, state.epoch
        patterns = self.unfreeze_at.get(epoch)
        if not patterns or fit.state.loader.resume_offset:  # a resumed epoch already unfroze what it had to
            return
        added = unfreeze_into(fit.state.model, fit.state.optimizer, *patterns, lr_by_pattern=self.lr_by_pattern,
                              scheduler=fit.state.scheduler)
        fit.folder.announce("unfreeze", f"epoch {epoch}: unfroze {', '.join(patterns)} ({len(added)} parameter "
                            "tensors added)", epoch=epoch, patterns=list(patterns), parameters=added)


class LogCadence(Policy):
    """Every ``every`` optimizer steps: the running values over every process (one host read and all-reduce),
    shown and logged. On the progress bar, steps 1, 2, 4... of each epoch show this process's values too."""

    def __init__(self, every: int, *, check_finite: bool) -> None:
        self.every = every
        self.check_finite = check_finite
        self.accumulator: Any = None  # the run's GradientAccumulator, from the first epoch's start
        self.epoch_windows = 0  # windows before this epoch
        self.early_show = 0  # the next window of the epoch whose running values the bar shows (0: none)

    def on_epoch_start(self, state: Any) -> None:
        fit = state.fit
        self.accumulator = fit.state.accumulator
        self.epoch_windows = self.accumulator.windows
        self.early_show = 1 if isinstance(fit.folder.progress, BarProgress) else 0

    def on_step_end(self, state: Any) -> None:
        windows = self.accumulator.optimizer_steps + self.accumulator.skipped_steps  # .windows, without its frame
        if windows % self.every and windows - self.epoch_windows != self.early_show:
            return  # most steps: nothing to show or log
        fit = state.fit
        accumulator, progress = fit.state.accumulator, fit.folder.progress
        if windows - self.epoch_windows == self.early_show:
            if self.early_show < self.every:
                progress.show(fit.state.metrics.compute())  # this process's values: no collective
            self.early_show *= 2
        if windows % self.every:
            return
        if self.check_finite:
            check_finite_everywhere(fit.guard, accumulator.optimizer_steps)
        values = fit.strategy.reduce(fit.state.metrics)  # one host sync (and all-reduce) per log interval
        fit.latest = values
        progress.show(values)
        fit.folder.record({"kind": "train", "epoch": state.epoch, "step": accumulator.optimizer_steps, **values,
                           "lr": fit.state.optimizer.param_groups[0]["lr"]})


class PeriodicCheckpoint(Policy):
    """A checkpoint every ``every`` optimizer steps (beside the one at each epoch's end)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, state: Any) -> None:
        if state.fit.state.accumulator.windows % self.every == 0:
            state.fit.checkpoint()


class PlateauStep(Policy):
    """``ReduceLROnPlateau`` stepped once per epoch on the validation loss (the training loss without
    validation), after the callbacks' metrics joined the epoch's record and before its learning rate is read."""

    order = "after"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def on_validation_end(self, state: Any) -> None:
        metrics = state.metrics
        self.scheduler.step(metrics.get("val_loss", metrics["train_loss"]))


class OverfittingWatch(Policy):
    """The first epoch whose validation loss rose above its best while training loss fell, reported once."""

    def on_epoch_end(self, state: Any) -> None:
        counters = state.fit.counters
        if counters.overfitting is not None:  # reported already (before a resume too: the counters keep it)
            return
        report = detect_overfitting(counters.history)
        if report is not None:
            counters.overfitting = dataclasses.asdict(report)
            state.fit.folder.announce("overfitting", report.message(), **counters.overfitting)


class EarlyStop(Policy):
    """Early stopping: after the user's callbacks (a stop one of them asked for wins the message), asks the run to
    stop once ``monitor`` has not improved for ``patience`` epochs; keeps the best weights."""

    order = "after"

    def __init__(self, stopper: EarlyStopping) -> None:
        self.stopper = stopper

    def on_epoch_end(self, state: Any) -> None:
        epoch, fit = state.epoch, state.fit
        if self.stopper.update(epoch, fit.counters.history[-1], fit.state.model) and state.stop_reason is None:
            state.request_stop(self.stopper.stop_message(epoch), message=self.stopper.stop_message(epoch))


__all__ = ["EarlyStop", "LogCadence", "OverfittingWatch", "PeriodicCheckpoint", "PlateauStep", "Policy",
           "UnfreezeSchedule"]
