"""The Trainer: the loop a person would write with trainwise's primitives (examples/hand_written_loop.py), with
the run folder, checkpoints, resume, preemption and the built-in policies composed around it.

Where each part lives: the step between two optimizer steps is :class:`~trainwise.step.TrainStep`; how many
processes train and how they agree, :mod:`trainwise.strategy`; every decision taken between epochs or steps
(log cadence, periodic checkpoints, unfreezing, the plateau step, overfitting, early stopping),
:mod:`trainwise.policies`; what a checkpoint holds and resuming it, :mod:`trainwise.checkpoint.resume`; every
file of the run and what it says, :class:`~trainwise.run_folder.RunFolder`; the options, :class:`TrainerConfig`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainwise._version import __version__
from trainwise.accumulation import GradientAccumulator
from trainwise.callbacks import CallbackList, TrainingState, callback_metrics
from trainwise.checkpoint.compat import FACTS_KEY, run_facts
from trainwise.checkpoint.manager import CheckpointManager, latest_in
from trainwise.checkpoint.resume import LoopCounters, RunState, resume
from trainwise.checkpoint.training import finish_checkpoint_writes, save_training_checkpoint
from trainwise.checkpoint.weights import save_weights
from trainwise.config import TrainerConfig, unknown_option
from trainwise.data.batches import MicroBatch, forward_micro_batch
from trainwise.data.batches import split_batch as default_split_batch
from trainwise.data.loaders import (
    StreamCheck,
    evaluation_loader,
    length,
    threads_beside_workers,
    training_loader,
    window_steps,
)
from trainwise.data.samplers import padding_for, set_sampler_epoch
from trainwise.device import resolve_device, resolve_precision
from trainwise.diagnosis import OverfittingReport
from trainwise.early_stopping import EarlyStopping, best_epoch, metric_mode
from trainwise.errors import NonFiniteLossError, TrainwiseError, UnknownOptionError
from trainwise.evaluation import evaluate
from trainwise.freezing import pin_frozen_norm_layers
from trainwise.guards.core import Guard, GuardFinding
from trainwise.guards.loss import NonFiniteLossGuard, check_finite_everywhere
from trainwise.guards.registry import all_check_classes
from trainwise.interrupts import Preempted, StepBoundaryInterrupt
from trainwise.metrics import MetricSet
from trainwise.oom import AdaptiveMicroBatches, check_auto_loader
from trainwise.optimizers import build_optimizer, build_scheduler
from trainwise.plots import PLOT_HINT, plot_learning_curves, write_learning_curves_svg
from trainwise.policies import (
    EarlyStop,
    LogCadence,
    OverfittingWatch,
    PeriodicCheckpoint,
    PlateauStep,
    UnfreezeSchedule,
)
from trainwise.progress import make_progress, plural
from trainwise.results import FitResult
from trainwise.run_folder import BEST_WEIGHTS, CURVES_PNG, CURVES_SVG, RunFolder
from trainwise.runlog import RunLock, open_run
from trainwise.seeding import determinism_restored, seed_everything
from trainwise.step import TrainStep
from trainwise.strategy import SingleProcess, connect
from trainwise.tracking import TrackedLog, open_loggers, split_loggers

# The guards' codes this loop rules out itself: it zeroes the gradients every step (TW105), scales float16 with a
# GradScaler (TW109) and moves every batch to the model's device (TW112).
RULED_OUT_BY_THE_LOOP = frozenset({"TW105", "TW109", "TW112"})
# The forward-time checks watch one optimizer step in this many: the mistakes they catch repeat on every step,
# and hooking every forward costs about 4% of a millisecond step. Callbacks' forwards are all watched.
GUARD_FORWARD_EVERY = 8


@dataclasses.dataclass(eq=False)
class Fit:
    """What one ``fit`` holds besides the checkpointed :class:`RunState`; the policies see the run through it."""

    state: RunState
    strategy: SingleProcess
    folder: RunFolder
    eval_model: torch.nn.Module
    val_loader: Any
    precision: Any
    guard: NonFiniteLossGuard  # every loss, checked at log intervals and checkpoints
    stream: StreamCheck
    config: dict[str, Any]  # the options and run facts every checkpoint records
    step: TrainStep | None = None
    manager: CheckpointManager | None = None  # rank 0's checkpoints
    callbacks: CallbackList | None = None
    guard_hooks: Guard | None = None
    interrupt: StepBoundaryInterrupt = dataclasses.field(default_factory=lambda: StepBoundaryInterrupt(enabled=False))
    checkpoint: Callable[[], None] = lambda: None  # a checkpoint now (the periodic-checkpoint policy calls it)
    started: float = 0.0
    latest: dict[str, float] = dataclasses.field(default_factory=dict)  # the newest values read from the device
    epoch: int = 0  # the epoch training is in (or last was in)
    resumed_step: int | None = None
    checkpoint_step: int = -1
    saved: bool = False  # an interrupt or preemption saved a checkpoint at its step
    stopped: str = "completed"  # completed, interrupted, preempted or nonfinite
    stopped_early: bool = False
    message: str = ""
    ended: bool = False  # callbacks and trackers were told the end state

    @property
    def counters(self) -> LoopCounters:
        return self.state.counters

    def drop_wrappers(self) -> None:
        """Let go of the DDP/compiled wrappers before the process group is destroyed: a traceback's frames
        still hold this run, and a wrapper that outlives the group into interpreter exit aborts gloo."""
        if self.step is not None:
            self.step.model = None
            if self.step.splitter is not None:
                self.step.splitter.model = None
        self.guard_hooks = None
        self.eval_model = self.state.model
        self.checkpoint = lambda: None  # the partial holding this run: no cycle left for the collector


class Trainer:
    """A small training loop with the fundamentals right by default.

    >>> result = Trainer(epochs=5, lr=1e-3, batch_size=64, seed=0).fit(MyModel, train_set, val_set)
    >>> result.last["val_accuracy"], result.model

    The plain-valued options are those of :class:`TrainerConfig` (declared there, once; ``help(Trainer)`` lists
    them with their defaults). ``fit`` takes the model or, for initial weights set by ``seed``, a function
    that builds it (called after seeding). ``optimizer`` is an optimizer or a factory called with the trainable
    parameters (default: AdamW with ``lr`` and ``weight_decay``); ``scheduler`` one or a factory called with the
    optimizer, stepped once per optimizer step (``ReduceLROnPlateau`` once per epoch on the validation loss);
    ``loss_fn(outputs, targets)`` defaults to the model's own loss or cross-entropy; ``split_batch(batch)``
    returns ``(inputs, targets)``; ``collate_fn`` batches samples as a DataLoader's does. ``loggers`` adds
    trackers beside ``metrics.jsonl`` (docs/tracking.md); ``callbacks`` are objects with any of the events of
    :class:`trainwise.Callback` (docs/callbacks.md). Ctrl-C finishes the current optimizer step, saves a
    checkpoint and raises ``KeyboardInterrupt`` (``.result`` holds the :class:`FitResult`); a second one stops
    at once. A preemption signal (``preempt_signals``, default SIGTERM) does the same and raises
    :class:`trainwise.Preempted` (exit code 143 when uncaught); under torchrun the processes agree on the step.
    """

    def __init__(self, *, optimizer: Any = None, scheduler: Any = None,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None, loggers: Iterable[Any] = ("jsonl",),
                 callbacks: Iterable[Any] = (), **options: Any) -> None:
        unknown_option(options, error=UnknownOptionError)  # a TypeError, as Python's own
        if options.get("run_dir") is not None:
            options["run_dir"] = str(options["run_dir"])
        loggers = [loggers] if isinstance(loggers, (str, bytes)) or not isinstance(loggers, Iterable) else loggers
        self.logger_objects = split_loggers([item for item in loggers if not isinstance(item, str)])[1]
        self.config = TrainerConfig(**options, loggers=[item for item in loggers if isinstance(item, str)])
        self.callbacks = list(callbacks or ())
        self.optimizer, self.scheduler, self.loss_fn, self.collate_fn = optimizer, scheduler, loss_fn, collate_fn
        self.split_batch = split_batch if split_batch is not None else default_split_batch
        self._strategy: SingleProcess = SingleProcess(torch.device("cpu"))  # set by fit() (under torchrun: DDP)
        self._lock = RunLock(".")  # the run folder's, once fit() has opened it

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
        fit = None
        try:
            with determinism_restored():  # deterministic=True holds for this fit only
                try:
                    fit = self._start(model, train_data, val_data)
                except BaseException as exc:  # a process lost while the run starts: the same one sentence
                    lost = self._strategy.lost_process(exc, checkpoint=latest_in(self.config.run_dir),
                                                       timeout=self.config.dist_timeout)
                    if lost is not None:
                        raise lost from None
                    raise
                # the thread count a checkpoint recorded (float sums depend on it); Ctrl-C waits for the step
                # (not under several processes, which agree on the step through the strategy instead)
                with threads_beside_workers(fit.strategy.device, fit.state.loader, threads=fit.counters.threads), \
                        StepBoundaryInterrupt(enabled=not fit.strategy.enabled,
                                              preempt=self.config.preempt_signals) as fit.interrupt:
                    return self._run(fit)
        finally:
            self._lock.release()  # the run folder is free for the next writer
            if fit is not None:
                fit.drop_wrappers()
            self._strategy.close()  # only a process group this fit joined
            self._lock, self._strategy = RunLock("."), SingleProcess(torch.device("cpu"))

    def _run(self, fit: Fit) -> FitResult:
        """The epochs, then the end of the run; an interrupt, a preemption or a NaN ends them saved and logged."""
        try:
            fit.counters.threads = torch.get_num_threads()
            self._fire(fit, "on_fit_start")
            for epoch in range(fit.counters.epoch, 0 if fit.stopped_early else self.config.epochs + 1):
                if self._epoch(fit, epoch):
                    break
            if fit.interrupt.preempted:  # held after the last step: the run ends saved, as preempted
                fit.saved = fit.checkpoint_step == fit.state.accumulator.optimizer_steps
                raise Preempted(signal_name=fit.interrupt.preempted)
        except (KeyboardInterrupt, Preempted) as exc:
            preempted = isinstance(exc, Preempted)
            steps, fit.stopped = fit.state.accumulator.optimizer_steps, "preempted" if preempted else "interrupted"
            saved = f"; its checkpoint at step {steps} resumes it" if fit.saved and fit.manager else ""
            fit.message = (f"{'preempted by ' + exc.signal if preempted else 'interrupted'} at step {steps}{saved}; "
                           f"{plural(len(fit.counters.history), 'epoch')} finished and everything logged so far is "
                           f"in {fit.folder.log.path}.")
            extra = {"signal": exc.signal} if preempted else {}
            fit.folder.announce(fit.stopped, fit.message, step=steps, **extra)
            if preempted:
                exc.message = fit.message
            exc.result = self._finish(fit, restore_best=False)  # type: ignore[union-attr]
            raise
        except NonFiniteLossError as exc:
            fit.stopped, fit.message = "nonfinite", str(exc)
            fit.folder.record({"kind": "nonfinite", "step": exc.step, "message": fit.message})
            exc.result = self._finish(fit, restore_best=False)  # type: ignore[attr-defined]
            raise
        except BaseException as exc:
            self._close(fit, failing=True)
            lost = fit.strategy.lost_process(exc, checkpoint=self._latest_checkpoint(fit),
                                             timeout=self.config.dist_timeout)
            if lost is not None:  # a process that died: one sentence naming it and the latest good checkpoint
                raise lost from None
            raise
        return self._finish(fit)

    def _epoch(self, fit: Fit, epoch: int) -> bool:
        """Train one epoch, validate, record it, let the policies and callbacks decide, checkpoint; True when the
        run stops early (the stop agreed across processes)."""
        cfg, counters, state = self.config, fit.counters, fit.callbacks.state
        counters.epoch = fit.epoch = epoch
        started = time.perf_counter()
        set_sampler_epoch(fit.state.loader, epoch)  # a new shuffle each epoch, the same on every process
        self._fire(fit, "on_epoch_start")  # the unfreeze schedule first
        record: dict[str, Any] = {"epoch": epoch, **{f"train_{k}": v for k, v in self._train_epoch(fit).items()}}
        if fit.val_loader is not None:
            values = self.validate(fit.eval_model, fit.val_loader, precision=fit.precision, device=fit.strategy.device)
            record.update({f"val_{k}": v for k, v in values.items()})
        fit.latest = dict(record)
        # the callbacks' metrics join the record (monitor sees them); then ReduceLROnPlateau steps
        logged = fit.callbacks.fire("on_validation_end", users=fit.val_loader is not None)
        record.update(callback_metrics(logged, record))
        record.update(lr=fit.state.optimizer.param_groups[0]["lr"], step=fit.state.accumulator.optimizer_steps,
                      seconds=time.perf_counter() - started)
        counters.history.append(record)
        fit.latest = dict(record)
        fit.folder.record({"kind": "epoch", **record})
        fit.folder.progress.end_epoch(epoch, cfg.epochs, {k: v for k, v in record.items() if k != "epoch"})
        self._fire(fit, "on_epoch_end")  # the overfitting watch first, early stopping last
        stop = fit.strategy.agree(state.stop_reason is not None)  # rank 0 decides; every process stops together
        counters.epoch, counters.stopped_early = epoch + 1, stop  # a resumed run that had stopped stays stopped
        self._checkpoint(fit, metric=record.get(cfg.monitor))
        if fit.interrupt.requested or (fit.interrupt.preempted and not fit.strategy.enabled):
            fit.saved = cfg.checkpoints  # held while the epoch's checkpoint was written: raised once it is whole
            if fit.interrupt.requested:
                raise KeyboardInterrupt
            raise Preempted(signal_name=fit.interrupt.preempted)
        if stop:
            fit.stopped_early = True
            fit.message = state.stop_message or f"stopped after epoch {epoch}: rank 0 asked to stop."
            fit.folder.announce("stopped_early", fit.message, epoch=epoch, message=fit.message)
        return stop

    def _train_epoch(self, fit: Fit) -> dict[str, float]:
        """Every batch of the epoch through the step; the running values over every process at its end."""
        loader, step, accumulator, interrupt = fit.state.loader, fit.step, fit.state.accumulator, fit.interrupt
        fit.state.model.train()
        start = loader.resume_offset  # batches of this epoch trained before a resume
        if not start:
            fit.state.metrics.reset()
        fit.folder.progress.start_epoch(fit.epoch, self.config.epochs, length(loader))
        if start:
            fit.folder.progress.advance(start)
        fit.stream.start_epoch()
        unsized = fit.strategy.enabled and length(loader) is None  # every process must end on the same batch
        interrupt.armed = True
        for batch, last_batch in loader.with_last():  # the last batch is known without len()
            if unsized:
                fit.strategy.agree_on_last(last_batch, loader.batches_done)
            if step.add(batch, last=last_batch):  # the batch ended a window: the optimizer stepped
                self._report_halvings(fit)
                self._fire(fit, "on_step_end")  # log cadence, periodic checkpoint, then the user's callbacks
                # a preemption signal rides the next windows' count all-reduce: every process stops here together
                accumulator.stop_requested = interrupt.preempted is not None
                if interrupt.requested or accumulator.stop_agreed:  # held until this step: the state is exact
                    if fit.checkpoint_step != accumulator.optimizer_steps:
                        self._checkpoint(fit)
                    fit.saved = self.config.checkpoints
                    if interrupt.requested:
                        raise KeyboardInterrupt
                    raise Preempted(signal_name=interrupt.preempted or "a signal to another process")
            fit.folder.progress.advance()
        interrupt.armed = False
        if not loader.batches_done:
            if unsized:
                fit.strategy.agree_on_last(True, 0)
            raise TrainwiseError(f"the training data yielded no batches in epoch {fit.epoch}; pass data that "
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

    def _report_halvings(self, fit: Fit) -> None:
        """batch_size='auto' ran out of memory: said once per halving; checkpoints keep the new size."""
        for old, new in fit.step.take_halvings():
            effective = self.config.effective_batch
            step, parts = fit.step.splitter.step + 1, -(-effective // new)  # the window's step
            message = (f"OOM at micro-batch {old} in step {step}: continuing with {new} x {parts}, effective batch "
                       f"{effective} unchanged.")
            fit.counters.micro_batch = new
            fit.folder.announce("oom", message, step=step, micro_batch_before=old, micro_batch=new,
                                micro_batches=parts, message=message)

    def _checkpoint(self, fit: Fit, *, metric: float | None = None) -> None:
        """Save the full state at an optimizer-step boundary, never after a non-finite loss."""
        if not self.config.checkpoints:
            return
        if self.config.nonfinite == "stop":
            check_finite_everywhere(fit.guard, fit.state.accumulator.optimizer_steps)
        fit.counters.accuracy = fit.step.counts_accuracy
        with fit.interrupt.held():  # a Ctrl-C inside torch.save would break the file being written
            save_training_checkpoint(fit.manager, fit.state.entries(), step=fit.state.accumulator.optimizer_steps,
                                     metric=metric, config=fit.config, run_dir=fit.folder.run_dir,
                                     background=True)  # fsync and pruning overlap the next epoch
        fit.checkpoint_step = fit.state.accumulator.optimizer_steps

    # -- set-up --------------------------------------------------------------------------------------

    def _start(self, model: Any, train_data: Any, val_data: Any) -> Fit:
        """Model, optimizer, data, accumulator, the run folder; then the resume, the step, guards and callbacks."""
        cfg, started = self.config, time.perf_counter()
        model, precision, notes = self._place_model(model)
        strategy, device = self._strategy, self._strategy.device
        optimizer = build_optimizer(model, self.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    lr_by_pattern=cfg.lr_by_pattern, check_coverage=cfg.guards == "off")
        scheduler = build_scheduler(self.scheduler, optimizer)
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        train_loader, val_loader = self._loaders(model, train_data, val_data, device)
        auto = cfg.batch_size == "auto"  # each batch of effective_batch samples is one window, split as it fits
        accumulator = GradientAccumulator(
            optimizer, steps=1 if auto else window_steps(train_loader, effective_batch=cfg.effective_batch,
                                                         steps=cfg.accumulation_steps, split=self.split_batch),
            scheduler=None if plateau else scheduler, scaler=precision.make_scaler(),
            max_grad_norm=cfg.max_grad_norm, skip_nonfinite=cfg.nonfinite == "skip", distributed=strategy.enabled)
        forward_model, eval_model = strategy.wrap(model, compile=cfg.compile)
        state = RunState(model=model, optimizer=optimizer, accumulator=accumulator, loader=train_loader,
                         metrics=MetricSet(device), scheduler=scheduler)
        facts = run_facts(model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader,
                          window=accumulator.steps, precision=precision.name, world_size=strategy.world_size,
                          loss_fn=self.loss_fn)
        fit = Fit(state=state, strategy=strategy, folder=self._open_folder(precision), eval_model=eval_model,
                  val_loader=val_loader, precision=precision, started=started, stream=StreamCheck(train_loader),
                  guard=NonFiniteLossGuard(device, model=model if cfg.nonfinite == "stop" else None),
                  config={**cfg.to_dict(), FACTS_KEY: facts})  # built once: every checkpoint records it
        fit.checkpoint = functools.partial(self._checkpoint, fit)
        self._keep(fit)
        for note in notes:  # the device line is printed only: config.json records the device and precision
            shown = note.pop("shown", False)
            if not shown:
                fit.folder.announce("note", note["message"] if "norm_layers" in note else None, **note)
            else:
                fit.folder.say(note["message"])
        policies = self._policies(fit, plateau=scheduler if plateau else None)
        unfreeze = next((p for p in policies if isinstance(p, UnfreezeSchedule)), None)
        fit.resumed_step = resume(state, cfg.resume, fit.folder, config=cfg.to_dict(), facts=facts,
                                  mismatch=cfg.resume_mismatch, sharded=strategy.sharded, is_main=strategy.is_main,
                                  before_restore=unfreeze and functools.partial(self._replay, unfreeze, state))
        if fit.guard.model is not None:
            fit.guard.keep(accumulator.optimizer_steps)  # a NaN before the first check returns the model here
        fit.folder.log.begin()  # compared first, written after: a refused resume has left the folder as it was
        splitter = None
        if auto:
            splitter = AdaptiveMicroBatches(fit.counters.micro_batch or cfg.effective_batch,
                                            distributed=strategy.enabled, model=forward_model)
        fit.step = TrainStep(forward_model, accumulator, self._forward_function(precision, device), state.metrics,
                             accuracy=cfg.accuracy, ignore_index=cfg.ignore_index, stream=fit.stream,
                             skip_nonfinite=cfg.nonfinite == "skip", splitter=splitter,
                             loss_guard=fit.guard if cfg.nonfinite == "stop" else None,
                             counts_accuracy=fit.counters.accuracy)
        if fit.counters.stopped_early:
            fit.stopped_early = True
            fit.folder.say(f"the run had stopped early at epoch {fit.counters.epoch - 1}; nothing to train (start "
                           "another run_dir to train again).")
        self._install_guards(fit, forward_model)
        self._open_callbacks(fit, policies)
        return fit

    def _place_model(self, model: Any) -> tuple[torch.nn.Module, Any, list[dict[str, Any]]]:
        """Seed, build the model (a factory) or take it, join the processes, move it to its device, keep frozen
        norm layers in eval, shard it (FSDP); the notes say what the log should know."""
        cfg, notes = self.config, []
        seed_everything(cfg.seed, deterministic=cfg.deterministic)
        if isinstance(model, torch.nn.Module):
            notes.append({"message": "the model was built before fit(), so its initial weights come from the "
                          "caller's RNG; pass a function that builds it for weights set by seed."})
        else:
            built = model()
            if not isinstance(built, torch.nn.Module):
                name = getattr(model, "__name__", type(model).__name__)
                raise TrainwiseError(f"the model factory {name} returned a {type(built).__name__}, not a "
                                     "torch.nn.Module.")
            model = built
        choice = resolve_device(cfg.device)
        self._strategy = connect(cfg.distributed, choice.device, timeout=cfg.dist_timeout)  # torchrun: join
        self._strategy.check(unfreeze_at=cfg.unfreeze_at, auto_batch=cfg.batch_size == "auto")
        device = self._strategy.device
        model.to(device)
        # requires_grad_(False) alone leaves BatchNorm updating its statistics in train mode: pinned in eval
        pinned = [] if cfg.train_norm_stats else pin_frozen_norm_layers(model)
        if pinned:
            names = ", ".join(pinned[:3]) + (", ..." if len(pinned) > 3 else "")
            notes.append({"message": f"kept {len(pinned)} norm layer(s) whose parameters are frozen in eval mode "
                          f"({names}); pass train_norm_stats=True to let them update their running statistics.",
                          "norm_layers": pinned})
        self._strategy.place(model)  # FSDP shards here, before the optimizer sees the parameters
        precision = resolve_precision(cfg.precision, device)
        notes.append({"message": f"training on {device} ({choice.reason}) in {precision.name} ({precision.reason})",
                      "shown": True})
        return model, precision, notes

    def _loaders(self, model: torch.nn.Module, train_data: Any, val_data: Any, device: torch.device) -> tuple[Any, Any]:
        """The training loader (seeded, sharded under torchrun, resumable) and the evaluation one."""
        cfg = self.config
        batch_size = cfg.effective_batch if cfg.batch_size == "auto" else cfg.batch_size
        options = {"seed": cfg.seed, "num_workers": cfg.num_workers, "device": device,
                   "shard": self._strategy.enabled, "collate_fn": self.collate_fn}
        # a process whose shard ran out pads with real samples weighted 0 (docs/distributed.md, Ragged shards)
        train = training_loader(train_data, batch_size=batch_size, epochs=cfg.epochs, drop_last=cfg.drop_last,
                                padding=padding_for(model), **options)
        if cfg.batch_size == "auto":
            check_auto_loader(train, cfg.effective_batch)
        val = None if val_data is None else evaluation_loader(val_data, batch_size=cfg.eval_batch_size or batch_size,
                                                               **options)
        return train, val

    def _open_folder(self, precision: Any) -> RunFolder:
        """Name, lock and log the run folder (rank 0 writes; the start record and config.json wait for the
        resume's comparison) with its progress display."""
        cfg = self.config
        path, self._lock, log = open_run(cfg.run_dir, self._params(precision), resume=cfg.resume,
                                         overwrite=cfg.overwrite, deferred=True)
        return RunFolder(path).attach(log=log, progress=make_progress(cfg.progress if self._strategy.is_main
                                                                      else "off"))

    def _params(self, precision: Any) -> dict[str, Any]:
        """config.json's content, and the trackers' hyperparameters."""
        return {"trainer": self.config.to_dict(), "device": str(self._strategy.device), "precision": precision.name,
                "precision_reason": precision.reason, "trainwise": __version__, "torch": torch.__version__}

    def _keep(self, fit: Fit) -> None:
        """Rank 0's checkpoints, and the best weights early stopping keeps (in memory, or on disk on rank 0)."""
        cfg, main = self.config, fit.strategy.is_main
        mode = metric_mode(cfg.monitor) if cfg.mode == "auto" else cfg.mode
        if cfg.checkpoints and main:
            fit.manager = CheckpointManager(fit.folder.run_dir, keep_last=cfg.keep_last, monitor=cfg.monitor,
                                            mode=mode, run_id=fit.folder.log.run_id)
        if cfg.patience is not None:
            keep = cfg.keep_best if main else "memory"  # one writer of the best-weights file
            fit.state.early_stopping = EarlyStopping(
                cfg.monitor, mode=cfg.mode, patience=cfg.patience, min_delta=cfg.min_delta, keep=keep,
                path=fit.folder.file(BEST_WEIGHTS) if keep == "disk" else None)

    def _policies(self, fit: Fit, *, plateau: Any) -> list[Any]:
        """The built-in callbacks this configuration asks for, in the order they run at an event."""
        cfg = self.config
        policies: list[Any] = [LogCadence(cfg.log_every, check_finite=cfg.nonfinite == "stop")]
        if cfg.checkpoint_every and cfg.checkpoints:
            policies.append(PeriodicCheckpoint(cfg.checkpoint_every))
        if cfg.unfreeze_at:
            policies.append(UnfreezeSchedule(cfg.unfreeze_at, lr_by_pattern=cfg.lr_by_pattern))
        if plateau is not None:
            policies.append(PlateauStep(plateau))
        if cfg.diagnose:
            policies.append(OverfittingWatch())
        if fit.state.early_stopping is not None:
            policies.append(EarlyStop(fit.state.early_stopping))
        return policies

    @staticmethod
    def _replay(unfreeze: UnfreezeSchedule, state: RunState, epoch: int, mid_epoch: bool) -> None:
        unfreeze.replay(state.model, state.optimizer, state.scheduler, epoch=epoch, mid_epoch=mid_epoch)

    def _install_guards(self, fit: Fit, forward_model: torch.nn.Module) -> None:
        """The doctor's codes at run time (``guards``), each finding printed and logged once; not the checks
        this loop rules out, nor TW108 with ``train_norm_stats=True`` (frozen norm layers then update on purpose)."""
        cfg = self.config
        if cfg.guards == "off":
            return
        skipped = RULED_OUT_BY_THE_LOOP | ({"TW108"} if cfg.train_norm_stats else set())
        codes = [c.code for c in all_check_classes() if c.code not in skipped]

        def found(finding: GuardFinding) -> None:
            fit.folder.announce("guard", f"guard: {finding}", **dataclasses.asdict(finding))

        try:  # with compile=True the forwards are hooked outside the compiled region: no graph break
            fit.guard_hooks = Guard(forward_model, fit.state.optimizer, action="raise" if cfg.guards == "raise"
                                    else "record", check_every=cfg.log_every, on_finding=found, checks=codes,
                                    forward_every=GUARD_FORWARD_EVERY, other_wrappers=[fit.eval_model])
        except BaseException:
            self._close(fit)
            raise
        fit.guard_hooks.step = fit.state.accumulator.optimizer_steps

    def _open_callbacks(self, fit: Fit, policies: list[Any]) -> None:
        """The policies and the user's callbacks with their view of the run; the loggers beside metrics.jsonl."""
        cfg = self.config
        try:
            fit.callbacks = CallbackList(self.callbacks, TrainingState(fit, cfg.epochs), policies=policies)
            if fit.guard_hooks is not None:  # the guards check every forward a callback runs
                fit.callbacks.context = fit.guard_hooks.watching_forwards
            if fit.strategy.is_main and (cfg.loggers != ["jsonl"] or self.logger_objects):
                trackers = open_loggers(cfg.loggers, self.logger_objects, fit.folder.run_dir,
                                        resumed_step=fit.resumed_step)
                fit.folder.log = TrackedLog(fit.folder.log, trackers, on_failure=fit.folder.say)
                fit.folder.log.each("log_hyperparams", {**self._params(fit.precision), "world_size":
                                                        fit.strategy.world_size,
                                                        "accumulation_steps": fit.state.accumulator.steps})
        except BaseException:
            self._close(fit, failing=True)
            raise

    # -- the end -------------------------------------------------------------------------------------

    def _finish(self, fit: Fit, *, restore_best: bool = True) -> FitResult:
        """Restore the best weights (early stopping), find the best epoch, draw the curves, end the run."""
        cfg, history, stopper = self.config, fit.counters.history, fit.state.early_stopping
        best, value = best_epoch(history, cfg.monitor, cfg.mode)
        if restore_best and stopper is not None and stopper.best_epoch is not None:
            best, value = stopper.best_epoch, stopper.best_value
            if stopper.restore(fit.state.model) is not None and best != len(history):
                fit.folder.say(f"restored the weights of epoch {best} ({cfg.monitor} {value:.6g}).")
        overfitting = OverfittingReport(**fit.counters.overfitting) if fit.counters.overfitting else None
        plot = None
        if cfg.plot and history and fit.strategy.is_main:
            curves = {"history": history, "monitor": cfg.monitor, "best_epoch": best,
                      "overfitting_epoch": overfitting.onset_epoch if overfitting else None}
            if cfg.plot_format == "svg":  # no plotting library: a few milliseconds
                plot = write_learning_curves_svg(path=fit.folder.file(CURVES_SVG), **curves)
            else:
                try:
                    plot = plot_learning_curves(path=fit.folder.file(CURVES_PNG), **curves)
                except ImportError:
                    fit.folder.say(PLOT_HINT)
        status = {"interrupted": "interrupted", "preempted": "preempted", "nonfinite": "failed"}.get(
            fit.stopped, "stopped_early" if fit.stopped_early else "finished")
        try:
            self._end(fit, status, artifacts=[plot] if plot else [])
        except BaseException:  # an on_fit_end that raised: the run is closed first (checkpoint whole, hooks off)
            self._close(fit, failing=True)
            raise
        self._close(fit, check=fit.stopped == "completed")  # the guards' last check, then every hook removed
        return FitResult(
            history=history, run_dir=fit.folder.run_dir, steps=fit.state.accumulator.optimizer_steps,
            seconds=time.perf_counter() - fit.started, stopped=fit.stopped, device=str(fit.strategy.device),
            precision=fit.precision.name, message=fit.message, best_epoch=best, best_value=value,
            stopped_early=fit.stopped_early, overfitting=overfitting, plot=plot, model=fit.state.model,
        )

    def _end(self, fit: Fit, status: str, *, artifacts: list[Any], error: BaseException | None = None) -> None:
        """Tell the callbacks (``on_fit_end``), the log and the trackers how the run ended (trackers also get the
        curves and the final weights). An ``on_fit_end`` that raises makes the run ``failed``, the log naming the
        callback; its error is raised once the log and the trackers have been told."""
        if fit.ended:
            return
        fit.ended = True
        raised: BaseException | None = None
        record: dict[str, Any] = {"kind": "end", "status": status, "step": fit.state.accumulator.optimizer_steps}
        if fit.callbacks is not None:
            fit.callbacks.state.status = status
            try:
                fit.callbacks.fire_naming("on_fit_end")
            except BaseException as exc:
                raised, status, error = exc, "failed", error or exc
                record.update(status=status, callback=getattr(exc, "trainwise_callback", "a callback"))
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"[:500]
        final = status != "failed" and not fit.strategy.sharded  # FSDP's weights are sharded over processes
        fit.folder.finish(status, record, artifacts=artifacts,
                          final_weights=functools.partial(save_weights, fit.state.model) if final else None)
        if raised is not None:
            raise raised

    def _close(self, fit: Fit, *, check: bool = False, failing: bool = False) -> None:
        """Finish the last checkpoint write, remove the guards, close the progress display and the log; while
        another error propagates (``failing``), a failed checkpoint write is reported, not raised over it."""
        if failing and not fit.ended:
            try:
                self._end(fit, "failed", artifacts=[], error=sys.exc_info()[1])
            except Exception as exc:  # the error already propagating is the one to see
                fit.folder.say(f"on_fit_end failed too: {type(exc).__name__}: {exc}")
        try:
            try:
                finish_checkpoint_writes(fit.manager)  # the last checkpoint is on disk when fit returns or raises
            except TrainwiseError as exc:
                if not failing:
                    raise
                fit.folder.say(str(exc))
            finally:
                if fit.guard_hooks is not None:
                    fit.guard_hooks.close(check=check)
        finally:
            fit.folder.close()

    @staticmethod
    def _latest_checkpoint(fit: Fit) -> str | None:
        """The newest complete checkpoint (rank 0 lists them; another process names the step it saved)."""
        if fit.manager is not None:
            try:
                latest = fit.manager.latest()
                return None if latest is None else str(latest)
            except (OSError, TrainwiseError):
                return None
        step = fit.checkpoint_step if fit.checkpoint_step >= 0 else fit.resumed_step
        return None if step is None else f"the one of step {step} in {fit.folder.run_dir}"

    # -- evaluation ----------------------------------------------------------------------------------

    def validate(self, model: torch.nn.Module, loader: Iterable[Any], *, precision: Any = None,
                 device: torch.device | str | None = None) -> dict[str, float]:
        """Loss (and accuracy) over a whole loader under eval mode and inference mode, counted by sample."""
        cfg = self.config
        device = torch.device(device) if device is not None else resolve_device(cfg.device).device
        precision = precision or resolve_precision(cfg.precision, device)
        return evaluate(model, loader, self._forward_function(precision, device), device=device,
                        accuracy=cfg.accuracy, ignore_index=cfg.ignore_index)

    def _forward_function(self, precision: Any, device: torch.device) -> Callable[[Any, Any], MicroBatch]:
        """``forward_micro_batch(model, batch)`` with this Trainer's batch conventions, precision and device
        bound once (a partial: no Python frame of its own on every step)."""
        cfg = self.config
        return functools.partial(
            forward_micro_batch, device=device, split=self.split_batch, loss_fn=self.loss_fn, count=cfg.count,
            ignore_index=cfg.ignore_index, reduction=cfg.loss_reduction, autocast=precision.autocast,
        )



Trainer.__init__.__signature__ = TrainerConfig.signature(Trainer.__init__)  # type: ignore[attr-defined]
