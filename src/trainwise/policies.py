"""The Trainer's loop policies, as built-in callbacks on the callback protocol (:mod:`trainwise.callbacks`):
each owns one decision and its own state, and is told of the same events a user's callback is.

- :class:`UnfreezeSchedule`: ``unfreeze_at``, at the start of the epochs it names; replayed on resume;
- :class:`LogCadence`: the running values every ``log_every`` optimizer steps (one host read each);
- :class:`PeriodicCheckpoint`: a checkpoint every ``checkpoint_every`` optimizer steps;
- :class:`PlateauStep`: ``ReduceLROnPlateau`` stepped once per epoch on the validation (else training) loss;
- :class:`OverfittingWatch`: the onset of overfitting, reported once;
- :class:`EarlyStop`: early stopping, which asks the run to stop (``state.request_stop``) like any callback.

``BEFORE`` policies run before the user's callbacks at an event, ``AFTER`` ones after them (early stopping
sees what the callbacks asked; the plateau step sees the metrics they logged). Each policy is built with the
collaborators it uses (:mod:`trainwise.run` hands them over: the accumulator's counts, a callable that saves, the
run folder's ``announce``...); of the event's state it reads only what a user's callback may (the epoch, the
metrics, ``request_stop``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from trainwise.diagnosis import detect_overfitting
from trainwise.early_stopping import EarlyStopping
from trainwise.freezing import unfreeze_into
from trainwise.progress import BarProgress

if TYPE_CHECKING:
    import torch

    from trainwise.callbacks import TrainingState
    from trainwise.checkpoint.resume import LoopCounters

Announce = Callable[..., None]  # RunFolder.announce(kind, text, **fields): printed, logged and tracked


class Policy:
    """A built-in callback; ``order`` says whether it runs before or after the user's callbacks."""

    order: ClassVar[Literal["before", "after"]] = "before"


class UnfreezeSchedule(Policy):
    """Unfreeze the parameters matching each pattern at the start of its epoch, adding them to the optimizer
    (and the scheduler); a resume replays the unfreezing done by then, so the optimizer has its groups."""

    def __init__(self, unfreeze_at: dict[int, list[str]], *, lr_by_pattern: dict[str, float] | None,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 resume_offset: Callable[[], int], announce: Announce) -> None:
        self.unfreeze_at = unfreeze_at
        self.lr_by_pattern = lr_by_pattern
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler  # what unfreezing changes
        self.resume_offset = resume_offset  # the training loader's: batches of this epoch trained before a resume
        self.announce = announce

    def replay(self, epoch: int, mid_epoch: bool) -> None:
        """Before a checkpoint of ``epoch`` is restored: every unfreezing done by then, again."""
        for at in sorted(self.unfreeze_at):
            if at < epoch or (mid_epoch and at == epoch):
                unfreeze_into(self.model, self.optimizer, *self.unfreeze_at[at], lr_by_pattern=self.lr_by_pattern,
                              scheduler=self.scheduler)

    def on_epoch_start(self, state: TrainingState) -> None:
        epoch = state.epoch
        patterns = self.unfreeze_at.get(epoch)
        if not patterns or self.resume_offset():  # a resumed epoch already unfroze what it had to
            return
        added = unfreeze_into(self.model, self.optimizer, *patterns, lr_by_pattern=self.lr_by_pattern,
                              scheduler=self.scheduler)
        self.announce("unfreeze", f"epoch {epoch}: unfroze {', '.join(patterns)} ({len(added)} parameter "
                      "tensors added)", epoch=epoch, patterns=list(patterns), parameters=added)


class LogCadence(Policy):
    """Every ``every`` optimizer steps: the running values over every process (one host read and all-reduce),
    shown and logged. On the progress bar, steps 1, 2, 4... of each epoch show this process's values too."""

    def __init__(self, every: int, *, accumulator: Any, metrics: Any, reduce: Callable[[Any], dict[str, float]],
                 optimizer: torch.optim.Optimizer, progress: Any, record: Callable[[dict[str, Any]], None],
                 publish: Callable[[dict[str, float]], None], check_finite: Callable[[int], None] | None) -> None:
        self.every = every
        self.accumulator = accumulator  # the run's GradientAccumulator: it counts the windows and the steps
        self.metrics = metrics  # the run's MetricSet: the epoch's running sums, on the device
        self.reduce = reduce  # the strategy's: the running values over every process (one host read)
        self.optimizer = optimizer  # its learning rate is logged
        self.progress = progress  # the run folder's progress display
        self.record = record  # RunFolder.record: a line of metrics.jsonl (and the trackers)
        self.publish = publish  # LatestMetrics.publish: the run's newest values, which callbacks see as state.metrics
        self.check_finite = check_finite  # nonfinite="stop": a NaN since the last check ends the run here
        self.epoch_windows = 0  # windows before this epoch
        self.early_show = 0  # the next window of the epoch whose running values the bar shows (0: none)

    def on_epoch_start(self, state: TrainingState) -> None:
        self.epoch_windows = self.accumulator.windows
        self.early_show = 1 if isinstance(self.progress, BarProgress) else 0

    def on_step_end(self, state: TrainingState) -> None:
        windows = self.accumulator.optimizer_steps + self.accumulator.skipped_steps  # .windows, without its frame
        if windows % self.every and windows - self.epoch_windows != self.early_show:
            return  # most steps: nothing to show or log
        accumulator, progress = self.accumulator, self.progress
        if windows - self.epoch_windows == self.early_show:
            if self.early_show < self.every:
                progress.show(self.metrics.compute())  # this process's values: no collective
            self.early_show *= 2
        if windows % self.every:
            return
        if self.check_finite is not None:
            self.check_finite(accumulator.optimizer_steps)
        values = self.reduce(self.metrics)  # one host sync (and all-reduce) per log interval
        self.publish(values)
        progress.show(values)
        self.record({"kind": "train", "epoch": state.epoch, "step": accumulator.optimizer_steps, **values,
                     "lr": self.optimizer.param_groups[0]["lr"]})


class PeriodicCheckpoint(Policy):
    """A checkpoint every ``every`` optimizer steps (beside the one at each epoch's end)."""

    def __init__(self, every: int, *, windows: Callable[[], int], save: Callable[[], None]) -> None:
        self.every = every
        self.windows = windows  # the accumulator's count of windows (optimizer steps and skipped ones)
        self.save = save  # the run's checkpoint (run.Fit.checkpoint): the full state at this step

    def on_step_end(self, state: TrainingState) -> None:
        if self.windows() % self.every == 0:
            self.save()


class PlateauStep(Policy):
    """``ReduceLROnPlateau`` stepped once per epoch on the validation loss (the training loss without
    validation), after the callbacks' metrics joined the epoch's record and before its learning rate is read."""

    order = "after"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def on_validation_end(self, state: TrainingState) -> None:
        metrics = state.metrics
        self.scheduler.step(metrics.get("val_loss", metrics["train_loss"]))


class OverfittingWatch(Policy):
    """The first epoch whose validation loss rose above its best while training loss fell, reported once."""

    def __init__(self, counters: LoopCounters, *, announce: Announce) -> None:
        self.counters = counters  # the loop's: the history read, the report kept (a checkpoint saves it)
        self.announce = announce

    def on_epoch_end(self, state: TrainingState) -> None:
        counters = self.counters
        if counters.overfitting is not None:  # reported already (before a resume too: the counters keep it)
            return
        report = detect_overfitting(counters.history)
        if report is not None:
            counters.overfitting = dataclasses.asdict(report)
            self.announce("overfitting", report.message(), **counters.overfitting)


class EarlyStop(Policy):
    """Early stopping: after the user's callbacks (a stop one of them asked for wins the message), asks the run to
    stop once ``monitor`` has not improved for ``patience`` epochs; keeps the best weights."""

    order = "after"

    def __init__(self, stopper: EarlyStopping, *, counters: LoopCounters, model: torch.nn.Module) -> None:
        self.stopper = stopper  # the run's (checkpointed): the best value and weights so far
        self.counters = counters  # the loop's: the epoch's record is the last of its history
        self.model = model  # whose best weights are kept

    def on_epoch_end(self, state: TrainingState) -> None:
        epoch = state.epoch
        if self.stopper.update(epoch, self.counters.history[-1], self.model) and state.stop_reason is None:
            state.request_stop(self.stopper.stop_message(epoch), message=self.stopper.stop_message(epoch))


__all__ = ["EarlyStop", "LogCadence", "OverfittingWatch", "PeriodicCheckpoint", "PlateauStep", "Policy",
           "UnfreezeSchedule"]
