"""The Trainer: the loop a person would write with trainwise's primitives (examples/hand_written_loop.py), with
the run folder, checkpoints, resume, preemption and the built-in policies composed around it.

Where each part lives: the step between two optimizer steps is :class:`~trainwise.step.TrainStep`; how many
processes train and how they agree, :mod:`trainwise.strategy`; every decision taken between epochs or steps
(log cadence, periodic checkpoints, unfreezing, the plateau step, overfitting, early stopping),
:mod:`trainwise.policies`; what a checkpoint holds and resuming it, :mod:`trainwise.checkpoint.resume`; every
file of the run and what it says, :class:`~trainwise.run_folder.RunFolder`; what one fit holds and its set-up and
end, :mod:`trainwise.run`; the options, :class:`TrainerConfig`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import torch

from trainwise.callbacks import callback_metrics
from trainwise.config import TrainerConfig, unknown_option
from trainwise.data.batches import BatchConventions
from trainwise.data.batches import split_batch as default_split_batch
from trainwise.data.loaders import length, threads_beside_workers
from trainwise.data.samplers import set_sampler_epoch
from trainwise.device import resolve_device, resolve_precision
from trainwise.errors import NonFiniteLossError, TrainwiseError, UnknownOptionError
from trainwise.evaluation import evaluate
from trainwise.guards.loss import check_finite_everywhere
from trainwise.progress import plural
from trainwise.results import FitResult
from trainwise.run import Fit, RunSpec, start_run
from trainwise.run_control import Stop
from trainwise.seeding import determinism_restored
from trainwise.tracking import split_loggers

_OPTIONS = frozenset(f.name for f in dataclasses.fields(TrainerConfig)) - {"loggers"}


class Trainer:
    """A small training loop with the fundamentals right by default.

    >>> result = Trainer(epochs=5, lr=1e-3, batch_size=64, seed=0).fit(MyModel, train_set, val_set)
    >>> result.last["val_accuracy"], result.model

    The plain-valued options are those of :class:`TrainerConfig` (validated there; ``help(Trainer)`` and type
    checkers list them with their types and defaults). ``fit`` takes the model or, for initial weights set by
    ``seed``, a function that builds it (called after seeding). ``optimizer`` is an optimizer or a factory called
    with the trainable parameters (default: AdamW with ``lr`` and ``weight_decay``); ``scheduler`` one or a factory
    called with the optimizer, stepped once per optimizer step (``ReduceLROnPlateau`` once per epoch on the
    validation loss); ``loss_fn(outputs, targets)`` defaults to the model's own loss or cross-entropy;
    ``split_batch(batch)`` returns ``(inputs, targets)``; ``collate_fn`` batches samples as a DataLoader's does.
    ``loggers`` adds trackers beside ``metrics.jsonl`` (docs/tracking.md); ``callbacks`` are objects with any of the
    events of :class:`trainwise.Callback` (docs/callbacks.md). Ctrl-C finishes the current optimizer step, saves a
    checkpoint and raises ``KeyboardInterrupt`` (``.result`` holds the :class:`FitResult`); a second one stops at
    once. A preemption signal (``preempt_signals``, default SIGTERM) does the same and raises
    :class:`trainwise.Preempted` (exit code 143 when uncaught); under torchrun the processes agree on the step.
    """

    # The options are TrainerConfig's fields, spelled out so that help(), editors and type checkers see them;
    # tests/trainer/test_trainer_options.py holds names, order, types and defaults to the dataclass.
    def __init__(self, *,
                 epochs: int = 10,
                 lr: float = 0.001,
                 weight_decay: float = 0.01,
                 batch_size: int | Literal['auto'] = 32,
                 effective_batch: int | None = None,
                 accumulation_steps: int | None = None,
                 eval_batch_size: int | None = None,
                 drop_last: bool = False,
                 max_grad_norm: float | None = None,
                 device: str = 'auto',
                 precision: Literal['auto', 'bf16', 'fp16', 'fp32'] = 'auto',
                 seed: int = 0,
                 deterministic: bool = False,
                 num_workers: int = 0,
                 compile: bool = False,
                 run_dir: str | os.PathLike[str] | None = None,
                 log_every: int = 50,
                 progress: Literal['auto', 'bar', 'lines', 'off'] = 'auto',
                 nonfinite: Literal['stop', 'skip'] = 'stop',
                 accuracy: Literal['auto', 'on', 'off'] = 'auto',
                 loss_reduction: Literal['mean', 'sum'] = 'mean',
                 count: Literal['auto', 'samples', 'tokens'] = 'auto',
                 ignore_index: int = -100,
                 lr_by_pattern: Mapping[str, float] | None = None,
                 unfreeze_at: Mapping[int, Sequence[str]] | None = None,
                 patience: int | None = None,
                 monitor: str = 'val_loss',
                 mode: Literal['auto', 'min', 'max'] = 'auto',
                 min_delta: float = 0.0,
                 keep_best: Literal['memory', 'disk'] = 'memory',
                 diagnose: bool = True,
                 guards: Literal['warn', 'raise', 'off'] = 'warn',
                 train_norm_stats: bool = False,
                 plot: bool = True,
                 plot_format: Literal['svg', 'png'] = 'svg',
                 resume: str | None = None,
                 resume_mismatch: Literal['refuse', 'allow'] = 'refuse',
                 overwrite: bool = False,
                 checkpoint_every: int | None = None,
                 keep_last: int = 2,
                 checkpoints: bool = True,
                 distributed: Literal['auto', 'ddp', 'fsdp', 'off'] = 'auto',
                 dist_timeout: float = 300.0,
                 preempt_signals: Sequence[str] = ('SIGTERM',),
                 optimizer: Any = None, scheduler: Any = None,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None, loggers: Iterable[Any] = ("jsonl",),
                 callbacks: Iterable[Any] = (), **unknown: Any) -> None:
        options = {name: value for name, value in locals().items() if name in _OPTIONS}
        unknown_option(unknown, error=UnknownOptionError)  # a TypeError naming the closest option
        if options["run_dir"] is not None:
            options["run_dir"] = str(options["run_dir"])
        loggers = [loggers] if isinstance(loggers, (str, bytes)) or not isinstance(loggers, Iterable) else loggers
        self.logger_objects = split_loggers([item for item in loggers if not isinstance(item, str)])[1]
        self.config = TrainerConfig(**options, loggers=[item for item in loggers if isinstance(item, str)])
        self.callbacks = list(callbacks or ())
        self.optimizer, self.scheduler, self.loss_fn, self.collate_fn = optimizer, scheduler, loss_fn, collate_fn
        self.split_batch = split_batch if split_batch is not None else default_split_batch

    @classmethod
    def from_config(cls, config: TrainerConfig, **objects: Any) -> Trainer:
        """A Trainer from a :class:`TrainerConfig` plus the optimizer/scheduler/loss_fn/split_batch objects."""
        options = config.to_dict()
        objects["loggers"] = [*options.pop("loggers"), *objects.get("loggers", ())]  # names and logger objects
        return cls(**options, **objects)

    # -- the loop ------------------------------------------------------------------------------------

    def fit(self, model: torch.nn.Module | Callable[[], torch.nn.Module], train_data: Any,
            val_data: Any = None) -> FitResult:
        """Train ``model`` (a module, or a function that builds it after seeding) on ``train_data`` (Dataset,
        DataLoader or iterable of batches), validating each epoch; the trained module is ``result.model``."""
        if not isinstance(model, torch.nn.Module) and not callable(model):
            raise TrainwiseError(
                f"model must be a torch.nn.Module or a function that builds one, got {type(model).__name__}."
            )
        with determinism_restored():  # deterministic=True holds for this fit only
            fit = start_run(self._spec(), model, train_data, val_data)
            try:
                # the thread count a checkpoint recorded (float sums depend on it); the signal handlers of the
                # run's control (Ctrl-C, preemption) from here to the end of the run
                with threads_beside_workers(fit.strategy.device, fit.state.loader, threads=fit.counters.threads), \
                        fit.control:
                    return self._run(fit)
            finally:
                fit.release()  # the run folder free for the next writer, a process group this fit joined left

    def _spec(self) -> RunSpec:
        """What a run is built from: the options and the objects this Trainer was given."""
        return RunSpec(config=self.config, forward=self.forward_function, split_batch=self.split_batch,
                       optimizer=self.optimizer, scheduler=self.scheduler, loss_fn=self.loss_fn,
                       collate_fn=self.collate_fn, callbacks=tuple(self.callbacks),
                       logger_objects=tuple(self.logger_objects))

    def _run(self, fit: Fit) -> FitResult:
        """The epochs, then the run's one end; an error the end does not answer closes the run and propagates."""
        raised: BaseException | None = None
        stop: Stop | None = None
        try:
            fit.counters.threads = torch.get_num_threads()
            self._fire(fit, "on_fit_start")
            stop = self._epochs(fit)
        except KeyboardInterrupt as exc:  # a second Ctrl-C, or one outside training: at once, as python's
            stop, raised = Stop("interrupted"), exc
        except NonFiniteLossError as exc:
            raised = exc
        except BaseException as exc:
            fit.close(failing=True)
            lost = fit.strategy.lost_process(exc, checkpoint=fit.latest_checkpoint(),
                                             timeout=self.config.dist_timeout)
            if lost is not None:  # a process that died: one sentence naming it and the latest good checkpoint
                raise lost from None
            raise
        return self._end(fit, stop, raised)

    def _epochs(self, fit: Fit) -> Stop | None:
        """The epochs left to train; the run control's answer that ended them (None: every epoch trained)."""
        control = fit.control
        if control.stopped_early:  # resumed after it had stopped early: it stays stopped (said at the resume)
            return control.at_end() or Stop("stopped_early")
        for epoch in range(fit.counters.epoch, self.config.epochs + 1):
            stop = self._epoch(fit, epoch)
            if stop is not None:
                return stop
        return control.at_end()

    def _end(self, fit: Fit, stop: Stop | None, raised: BaseException | None) -> FitResult:
        """The one place the run ends: its outcome recorded and said, the run finished (the best weights back
        unless it was cut short); an interrupt, a preemption or a non-finite loss is then raised with
        ``.result``, anything else returns the result."""
        outcome, steps = fit.outcome, fit.optimizer_steps
        if isinstance(raised, NonFiniteLossError):
            outcome.stopped, outcome.message = "nonfinite", str(raised)
            fit.folder.record({"kind": "nonfinite", "step": raised.step, "message": outcome.message})
            raised.result = fit.finish(restore_best=False)  # type: ignore[attr-defined]
            raise raised
        if stop is None or stop.reason == "stopped_early":
            if stop is not None:
                outcome.stopped_early, outcome.message = True, stop.message or ""
                if stop.message is not None:
                    fit.folder.announce("stopped_early", stop.message, epoch=fit.counters.epoch,
                                        message=stop.message)
            return fit.finish()
        outcome.stopped, outcome.saved = stop.reason, fit.checkpoint_step == steps
        saved = f"; its checkpoint at step {steps} resumes it" if outcome.saved and fit.manager else ""
        cause = f"preempted by {stop.signal}" if stop.reason == "preempted" else "interrupted"
        outcome.message = (f"{cause} at step {steps}{saved}; {plural(len(fit.counters.history), 'epoch')} finished "
                           f"and everything logged so far is in {fit.folder.log.path}.")
        fit.folder.announce(stop.reason, outcome.message, step=steps,
                            **({"signal": stop.signal} if stop.reason == "preempted" else {}))
        error = raised if raised is not None else stop.error(outcome.message)
        error.result = fit.finish(restore_best=False)  # type: ignore[union-attr]
        raise error

    def _epoch(self, fit: Fit, epoch: int) -> Stop | None:
        """Train one epoch, validate, record it, let the policies and callbacks decide, checkpoint; the run
        control's answer when the run ends here (agreed across processes)."""
        cfg, counters = self.config, fit.counters
        counters.epoch = epoch  # the loop's one epoch counter (callbacks read it as state.epoch)
        started = time.perf_counter()
        set_sampler_epoch(fit.state.loader, epoch)  # a new shuffle each epoch, the same on every process
        self._fire(fit, "on_epoch_start")  # the unfreeze schedule first
        trained = self._train_epoch(fit)
        if isinstance(trained, Stop):
            return trained
        record: dict[str, Any] = {"epoch": epoch, **{f"train_{k}": v for k, v in trained.items()}}
        if fit.val_loader is not None:
            values = self.validate(fit.eval_model, fit.val_loader, precision=fit.precision, device=fit.strategy.device)
            record.update({f"val_{k}": v for k, v in values.items()})
        fit.latest.publish(record)  # callbacks see the epoch's record from here on, as it grows
        # the callbacks' metrics join the record (monitor sees them); then ReduceLROnPlateau steps
        logged = fit.callbacks.fire("on_validation_end", users=fit.val_loader is not None)
        record.update(callback_metrics(logged, record))
        record.update(lr=fit.state.optimizer.param_groups[0]["lr"], step=fit.state.accumulator.optimizer_steps,
                      seconds=time.perf_counter() - started)
        counters.history.append(record)
        fit.folder.record({"kind": "epoch", **record})
        fit.folder.progress.end_epoch(epoch, cfg.epochs, {k: v for k, v in record.items() if k != "epoch"})
        self._fire(fit, "on_epoch_end")  # the overfitting watch first, early stopping last
        fit.control.agree()  # a requested stop, rank 0 deciding, recorded before the checkpoint saves it
        fit.checkpoint(metric=record.get(cfg.monitor), epoch_done=True)  # a resume of it starts epoch + 1
        return fit.control.at_epoch(epoch)  # looked at once the checkpoint is whole (a Ctrl-C was held for it)

    def _train_epoch(self, fit: Fit) -> dict[str, float] | Stop:
        """Every batch of the epoch through the step; the running values over every process at its end, or the
        run control's answer when a signal ends the run after one of its windows."""
        loader, step, accumulator, control = fit.state.loader, fit.step, fit.state.accumulator, fit.control
        fit.state.model.train()
        start = loader.resume_offset  # batches of this epoch trained before a resume
        if not start:
            fit.state.metrics.reset()
        fit.folder.progress.start_epoch(fit.counters.epoch, self.config.epochs, length(loader))
        if start:
            fit.folder.progress.advance(start)
        fit.stream.start_epoch()
        unsized = fit.strategy.enabled and length(loader) is None  # every process must end on the same batch
        progress = fit.folder.progress
        advance = progress.advance if getattr(progress, "enabled", True) else None  # progress="off": no call a batch
        with control.training():  # a first Ctrl-C is held until the window has stepped
            for batch, last_batch in loader.with_last():  # the last batch is known without len()
                if unsized:
                    fit.strategy.agree_on_last(last_batch, loader.batches_done)
                if step.add(batch, last=last_batch):  # the batch ended a window: the optimizer stepped
                    if not fit.count_said:
                        fit.say_count()
                    if step.splitter is not None:  # batch_size="auto": a micro-batch halved is said once
                        fit.report_halvings()
                    self._fire(fit, "on_step_end")  # log cadence, periodic checkpoint, then the user's callbacks
                    # a plain attribute each step; a held signal (agreed under several processes) is answered
                    if control.asked and (stop := control.at_step()) is not None:
                        if stop.save and fit.checkpoint_step != accumulator.optimizer_steps:
                            fit.checkpoint()  # mid-epoch, while the loader holds its place: the resume is exact
                        return stop
                if advance is not None:
                    advance()
        if not loader.batches_done:
            if unsized:
                fit.strategy.agree_on_last(True, 0)
            raise TrainwiseError(f"the training data yielded no batches in epoch {fit.counters.epoch}; pass data that "
                                 "yields batches every epoch (an iterator is used up after one).")
        if self.config.nonfinite == "stop":
            check_finite_everywhere(fit.guard, accumulator.optimizer_steps)
        return fit.strategy.reduce(fit.state.metrics)  # sums over every process (one all-reduce)

    def _fire(self, fit: Fit, event: str) -> None:
        """The policies and callbacks of ``event``; the metrics callbacks log are written at the current step."""
        logged = fit.callbacks.fire(event)
        if logged:
            fit.folder.record({"kind": "metric", "epoch": fit.counters.epoch,
                               "step": fit.state.accumulator.optimizer_steps, **logged})

    # -- evaluation ----------------------------------------------------------------------------------

    def validate(self, model: torch.nn.Module, loader: Iterable[Any], *, precision: Any = None,
                 device: torch.device | str | None = None) -> dict[str, float]:
        """Loss (and accuracy) over a whole loader under eval mode and inference mode, counted as training counts
        (``count``: by token when the loss is a mean over tokens)."""
        cfg = self.config
        device = torch.device(device) if device is not None else resolve_device(cfg.device).device
        precision = precision or resolve_precision(cfg.precision, device)
        return evaluate(model, loader, self.forward_function(precision, device), device=device,
                        accuracy=cfg.accuracy, ignore_index=cfg.ignore_index)

    def forward_function(self, precision: Any, device: torch.device) -> BatchConventions:
        """This Trainer's batch conventions (``split_batch``, ``loss_fn``, ``count``, ``ignore_index``,
        ``loss_reduction``), precision and device, declared once: ``forward(model, batch)`` gives the
        :class:`~trainwise.data.MicroBatch` that training and validation count."""
        cfg = self.config
        return BatchConventions(
            device=device, split=self.split_batch, loss_fn=self.loss_fn, count=cfg.count,
            ignore_index=cfg.ignore_index, reduction=cfg.loss_reduction,
            autocast=None if getattr(precision, "name", None) == "fp32" else precision.autocast,  # fp32: none
        )


