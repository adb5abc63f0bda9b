"""The Trainer: composes the primitives (data, device, seeding, metrics, accumulation, evaluation, checkpoints,
guards); no logic of its own.

Everything it does, a hand-written loop can do with the same public calls; see docs/hand-written-loop.md.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch

from trainwise._version import __version__
from trainwise.accumulation import GradientAccumulator
from trainwise.batches import MicroBatch, forward_micro_batch
from trainwise.batches import split_batch as default_split_batch
from trainwise.callbacks import CallbackList, TrainingState
from trainwise.checkpoint.compat import FACTS_KEY, run_facts
from trainwise.checkpoint.manager import CheckpointManager, latest_in
from trainwise.checkpoint.training import (
    save_training_checkpoint,
)
from trainwise.config import TrainerConfig
from trainwise.data import StreamCheck, evaluation_loader, length, threads_beside_workers, training_loader, window_steps
from trainwise.device import resolve_device, resolve_precision
from trainwise.diagnosis import detect_overfitting
from trainwise.distributed import (
    DistributedInfo,
    broadcast_flag,
    close_distributed,
    global_metric_values,
    init_distributed,
    local_device,
    lost_process_error,
    padding_for,
    same_last_batch,
    set_sampler_epoch,
    shard_model,
    wrap_ddp,
)
from trainwise.early_stopping import EarlyStopping, best_epoch, metric_mode
from trainwise.errors import NonFiniteLossError, TrainwiseError
from trainwise.evaluation import evaluate
from trainwise.fit_resume import resume_run
from trainwise.fit_run import (
    Run,
    build_model,
    callback_metrics,
    close_run,
    end_trackers,
    install_guards,
    latest_checkpoint,
)
from trainwise.freezing import pin_frozen_norm_layers, unfreeze_into
from trainwise.guards.loss import NonFiniteLossGuard, check_finite_everywhere
from trainwise.interrupts import Preempted, StepBoundaryInterrupt
from trainwise.metrics import MetricSet
from trainwise.oom import AdaptiveMicroBatches, check_auto_loader
from trainwise.optimizers import OptimizerArg, build_optimizer, build_scheduler
from trainwise.plots import PLOT_HINT, plot_learning_curves, write_learning_curves_svg
from trainwise.progress import BarProgress, make_progress, plural
from trainwise.results import FitResult
from trainwise.run_folder import BEST_WEIGHTS, CURVES_PNG, CURVES_SVG, RunFolder
from trainwise.runlog import RunLock, open_run
from trainwise.seeding import determinism_restored, seed_everything
from trainwise.step import TrainStep
from trainwise.tracking import TrackedLog, open_loggers, split_loggers


class Trainer:
    """A small training loop with the fundamentals right by default.

    >>> result = Trainer(epochs=5, lr=1e-3, batch_size=64, seed=0).fit(MyModel, train_set, val_set)
    >>> result.last["val_accuracy"], result.model

    ``fit`` takes the model or, for initial weights set by ``seed``, a function that builds it (called after
    seeding). A model built before ``fit`` has the initial weights of the caller's RNG: seed before building
    it for a reproducible run. On CPU with loader workers the Trainer leaves one core per worker (fewer
    intra-op threads, restored after ``fit``): the same seed then gives slightly different weights with 0
    and 2 workers; a checkpoint records the thread count and a resume uses it again.

    ``optimizer`` is an optimizer instance or a factory called with the trainable parameters (default:
    AdamW with ``lr`` and ``weight_decay``); ``scheduler`` an instance or a factory called with the
    optimizer, stepped once per optimizer step (``ReduceLROnPlateau`` once per epoch on the validation
    loss); ``loss_fn(outputs, targets)`` defaults to cross-entropy; ``split_batch(batch)`` returns
    ``(inputs, targets)`` (a target of ``None`` for a loss without one: samples are counted from the inputs);
    ``collate_fn`` batches samples, as a DataLoader's does (``transformers.DataCollatorWithPadding`` pads
    text). The plain-valued options are those of :class:`TrainerConfig`.

    ``loggers`` adds trackers beside ``metrics.jsonl``: ``"tensorboard"``, ``"mlflow"`` or objects with
    ``log_metrics(metrics, step)`` (docs/tracking.md); ``callbacks`` are objects with any of the events of
    :class:`trainwise.Callback` (docs/callbacks.md). Ctrl-C during training finishes the current optimizer
    step, saves a checkpoint and the log, then raises ``KeyboardInterrupt`` (its ``result`` attribute holds
    the :class:`FitResult`); a second Ctrl-C stops at once. A preemption signal (``preempt_signals``, default
    SIGTERM; also under torchrun, where the processes agree on the step) does the same and raises
    :class:`trainwise.Preempted` (exit code 143 when uncaught).
    """

    def __init__(
        self,
        *,
        epochs: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        batch_size: int | Literal["auto"] = 32,
        drop_last: bool = False,
        effective_batch: int | None = None,
        accumulation_steps: int | None = None,
        eval_batch_size: int | None = None,
        max_grad_norm: float | None = None,
        device: str = "auto",
        precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto",
        seed: int = 0,
        deterministic: bool = False,
        num_workers: int = 0,
        compile: bool = False,
        run_dir: str | None = None,
        log_every: int = 50,
        progress: Literal["auto", "bar", "lines", "off"] = "auto",
        nonfinite: Literal["stop", "skip"] = "stop",
        accuracy: Literal["auto", "on", "off"] = "auto",
        loss_reduction: Literal["mean", "sum"] = "mean",
        count: Literal["samples", "tokens"] = "samples",
        ignore_index: int = -100,
        lr_by_pattern: dict[str, float] | None = None,
        unfreeze_at: dict[int, list[str]] | None = None,
        patience: int | None = None,
        monitor: str = "val_loss",
        mode: Literal["auto", "min", "max"] = "auto",
        min_delta: float = 0.0,
        keep_best: Literal["memory", "disk"] = "memory",
        diagnose: bool = True,
        guards: Literal["warn", "raise", "off"] = "warn",
        train_norm_stats: bool = False,
        plot: bool = True,
        plot_format: Literal["svg", "png"] = "svg",
        resume: str | None = None,
        resume_mismatch: Literal["refuse", "allow"] = "refuse",
        overwrite: bool = False,
        checkpoint_every: int | None = None,
        keep_last: int = 2,
        checkpoints: bool = True,
        distributed: Literal["auto", "ddp", "fsdp", "off"] = "auto",
        dist_timeout: float = 300.0,
        preempt_signals: Sequence[str] = ("SIGTERM",),
        optimizer: OptimizerArg = None,
        scheduler: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loggers: Sequence[Any] = ("jsonl",),
        callbacks: Sequence[Any] = (),
    ) -> None:
        options = {k: v for k, v in locals().items() if k in TrainerConfig.option_names()}
        options["run_dir"] = None if run_dir is None else str(run_dir)
        options["loggers"], self.logger_objects = split_loggers(loggers)
        self.config = TrainerConfig(**options)
        self.callbacks = list(callbacks or ())
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn  # None: the model's own loss when it returns one, else cross-entropy
        self.split_batch = split_batch if split_batch is not None else default_split_batch
        self.collate_fn = collate_fn  # batches samples (a Dataset, datasets.Dataset or list of samples)
        self._dist = DistributedInfo()  # set by fit() under torchrun

    @classmethod
    def from_config(cls, config: TrainerConfig, **objects: Any) -> Trainer:
        """A Trainer from a :class:`TrainerConfig` plus the optimizer/scheduler/loss_fn/split_batch objects."""
        options = config.to_dict()
        objects["loggers"] = [*options.pop("loggers"), *objects.get("loggers", ())]  # names and logger objects
        return cls(**options, **objects)

    # -- the loop ------------------------------------------------------------------------------------

    def fit(
        self, model: torch.nn.Module | Callable[[], torch.nn.Module], train_data: Any, val_data: Any = None
    ) -> FitResult:
        """Train ``model`` (a module, or a function that builds it after seeding) on ``train_data`` (Dataset,
        DataLoader or iterable of batches), validating each epoch; the trained module is ``result.model``."""
        if not isinstance(model, torch.nn.Module) and not callable(model):
            raise TrainwiseError(
                f"model must be a torch.nn.Module or a function that builds one, got {type(model).__name__}."
            )
        self._lock = RunLock(".")  # replaced by the run folder's lock once it is known
        try:
            with determinism_restored():  # deterministic=True holds for this fit only
                try:
                    run = self._start(model, train_data, val_data)
                except BaseException as exc:  # a process lost while the run starts: the same one sentence
                    lost = lost_process_error(exc, self._dist, checkpoint=latest_in(self.config.run_dir),
                                              timeout=self.config.dist_timeout)
                    if lost is not None:
                        raise lost from None
                    raise
                return self._run(run)
        finally:
            self._lock.release()  # the run folder is free for the next writer
            close_distributed(self._dist)  # only a process group this fit created
            self._dist = DistributedInfo()

    def _start(self, model: Any, train_data: Any, val_data: Any) -> Run:
        """Model, optimizer, data, accumulator; then the run folder and the resume."""
        cfg = self.config
        started = time.perf_counter()
        model, device, precision, notes = self._place_model(model)
        sharded = self._dist.enabled and cfg.distributed == "fsdp"
        optimizer = build_optimizer(model, self.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    lr_by_pattern=cfg.lr_by_pattern, check_coverage=cfg.guards == "off")
        scheduler = build_scheduler(self.scheduler, optimizer)
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        loaders = {"seed": cfg.seed, "num_workers": cfg.num_workers, "device": device, "shard": self._dist.enabled}
        auto = cfg.batch_size == "auto"  # each batch of effective_batch samples is one window, split as it fits
        batch_size = cfg.effective_batch if auto else cfg.batch_size
        if auto and sharded:
            raise TrainwiseError("batch_size='auto' is not supported with distributed='fsdp'; set batch_size to "
                                 "a micro-batch that fits, with effective_batch.")
        loaders["collate_fn"] = self.collate_fn
        # a process whose shard ran out pads with real samples weighted 0 (docs/distributed.md, Ragged shards)
        train_loader = training_loader(train_data, batch_size=batch_size, epochs=cfg.epochs, drop_last=cfg.drop_last,
                                       padding=padding_for(model), **loaders)
        if auto:
            check_auto_loader(train_loader, cfg.effective_batch)
        val_loader = None if val_data is None else evaluation_loader(
            val_data, batch_size=cfg.eval_batch_size or batch_size, **loaders)
        accumulator = GradientAccumulator(
            optimizer,
            steps=1 if auto else window_steps(train_loader, effective_batch=cfg.effective_batch,
                                              steps=cfg.accumulation_steps, split=self.split_batch),
            scheduler=None if plateau else scheduler,
            scaler=precision.make_scaler(),
            max_grad_norm=cfg.max_grad_norm,
            skip_nonfinite=cfg.nonfinite == "skip",
            distributed=self._dist.enabled,
        )
        # DDP only trains: validation runs on the module itself (no per-batch collective, so unequal eval
        # shards cannot hang), and its metrics are summed over processes at the end
        eval_model = torch.compile(model) if cfg.compile else model
        forward_model = eval_model
        if self._dist.enabled and not sharded:
            forward_model = wrap_ddp(model, device)
            forward_model = torch.compile(forward_model) if cfg.compile else forward_model
        run = Run(
            model=model, forward_model=forward_model, eval_model=eval_model,
            optimizer=optimizer, scheduler=scheduler, plateau=plateau, accumulator=accumulator,
            train_loader=train_loader, val_loader=val_loader, precision=precision, device=device,
            metrics=MetricSet(device), started=started, fsdp=sharded,
            guard=NonFiniteLossGuard(device, model=model if cfg.nonfinite == "stop" else None),
            stream=StreamCheck(train_loader),
            agree_on_last=self._dist.enabled and length(train_loader) is None,
        )
        if auto:
            run.micro = AdaptiveMicroBatches(cfg.effective_batch, distributed=self._dist.enabled, model=forward_model)
        run.facts = run_facts(model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader,
                              window=accumulator.steps, precision=precision.name, world_size=self._dist.world_size,
                              loss_fn=self.loss_fn)
        run.checkpoint_config = {**self.config.to_dict(), FACTS_KEY: run.facts}  # once: every checkpoint records it
        self._open_run_folder(run)
        for note in notes:
            if note.pop("shown", False):  # printed only: config.json records the device, precision and reasons
                run.progress.message(note["message"])
                continue
            if "norm_layers" in note:
                run.progress.message(note["message"])
            run.log.write({"kind": "note", **note})
        resume_run(run, self.config, is_main=self._dist.is_main)
        if run.micro is not None and run.loop.get("micro_batch"):  # a resume starts at the size that fitted
            run.micro.size = int(run.loop["micro_batch"])
        run.step = TrainStep(run.forward_model, run.accumulator, self._forward_function(precision, device),
                             run.metrics, accuracy=cfg.accuracy, ignore_index=cfg.ignore_index,
                             skip_nonfinite=cfg.nonfinite == "skip", stream=run.stream, splitter=run.micro,
                             loss_guard=run.guard if cfg.nonfinite == "stop" else None, decided=run.loop)
        install_guards(run, self.config)
        self._open_trackers(run)
        return run

    def _report_halvings(self, run: Run) -> None:
        """batch_size='auto' ran out of memory: say so once per halving; checkpoints keep the new size."""
        for old, new in run.step.take_halvings():
            step, windows = run.micro.step + 1, -(-self.config.effective_batch // new)  # the window's step
            message = (f"OOM at micro-batch {old} in step {step}: continuing with {new} x {windows}, effective "
                       f"batch {self.config.effective_batch} unchanged.")
            run.loop["micro_batch"] = new
            run.progress.message(message)
            run.log.write({"kind": "oom", "step": step, "micro_batch_before": old, "micro_batch": new,
                           "micro_batches": windows, "message": message})

    def _open_trackers(self, run: Run) -> None:
        """The loggers beside metrics.jsonl (rank 0 only), and the callbacks with their view of the run."""
        try:
            run.callbacks = CallbackList(self.callbacks, TrainingState(run, self.config.epochs))
            if run.guard_hooks is not None:  # the guards check every forward a callback runs
                run.callbacks.context = run.guard_hooks.watching_forwards
            if self._dist.is_main and (self.config.loggers != ["jsonl"] or self.logger_objects):
                trackers = open_loggers(self.config.loggers, self.logger_objects, run.run_dir,
                                        resumed_step=run.resumed_step)
                run.log = TrackedLog(run.log, trackers, on_failure=run.progress.message)
                run.log.each("log_hyperparams", {**run.params, "accumulation_steps": run.accumulator.steps,
                                                 "world_size": self._dist.world_size})
        except BaseException:
            close_run(run, failing=True)
            raise

    def _place_model(self, model: Any) -> tuple[torch.nn.Module, torch.device, Any, list[dict[str, Any]]]:
        """Seed, build the model (a factory) or take it, join the processes, move it to its device, keep
        frozen norm layers in eval, shard it (FSDP); the notes say what the log should know."""
        cfg, notes = self.config, []
        seed_everything(cfg.seed, deterministic=cfg.deterministic)
        if isinstance(model, torch.nn.Module):
            notes.append({"message": "the model was built before fit(), so its initial weights come from the "
                          "caller's RNG; pass a function that builds it for weights set by seed."})
        else:
            model = build_model(model)
        choice = resolve_device(cfg.device)
        device = choice.device
        if cfg.distributed != "off":  # under torchrun: join the process group (a no-op for one process)
            self._dist = init_distributed(local_device(device), timeout=cfg.dist_timeout)
            device = local_device(device) if self._dist.enabled else device
        if self._dist.enabled and cfg.unfreeze_at:  # DDP and FSDP fix the trainable parameters when they wrap
            raise TrainwiseError(
                "unfreeze_at is not supported with several processes; run each unfreezing phase as its own fit()."
            )
        model.to(device)
        # requires_grad_(False) alone leaves BatchNorm updating its statistics in train mode: pinned in eval
        pinned = [] if cfg.train_norm_stats else pin_frozen_norm_layers(model)
        if pinned:
            names = ", ".join(pinned[:3]) + (", ..." if len(pinned) > 3 else "")
            notes.append({"message": f"kept {len(pinned)} norm layer(s) whose parameters are frozen in eval mode "
                          f"({names}); pass train_norm_stats=True to let them update their running statistics.",
                          "norm_layers": pinned})
        if self._dist.enabled and cfg.distributed == "fsdp":
            shard_model(model)  # FSDP2, in place, before the optimizer sees the parameters
        precision = resolve_precision(cfg.precision, device)
        notes.append({"message": f"training on {device} ({choice.reason}) in {precision.name} ({precision.reason})",
                      "shown": True})
        return model, device, precision, notes

    def _open_run_folder(self, run: Run) -> None:
        """Name, lock and log the run folder (rank 0 writes), and make the progress, stopper and checkpoints."""
        cfg, main = self.config, self._dist.is_main
        run.params = {"trainer": cfg.to_dict(), "device": str(run.device), "precision": run.precision.name,
                      "precision_reason": run.precision.reason, "trainwise": __version__, "torch": torch.__version__}
        run.run_dir, self._lock, run.log = open_run(cfg.run_dir, run.params, resume=cfg.resume, overwrite=cfg.overwrite,
                                                    deferred=True)  # written once resume_run has compared
        names = RunFolder(run.run_dir)
        run.progress = make_progress(cfg.progress if main else "off")
        if cfg.patience is not None:
            keep = cfg.keep_best if main else "memory"  # one writer of the best-weights file
            run.stopper = EarlyStopping(cfg.monitor, mode=cfg.mode, patience=cfg.patience, min_delta=cfg.min_delta,
                                        keep=keep, path=names.file(BEST_WEIGHTS) if keep == "disk" else None)
        if cfg.checkpoints and main:
            mode = metric_mode(cfg.monitor) if cfg.mode == "auto" else cfg.mode
            run.manager = CheckpointManager(run.run_dir, keep_last=cfg.keep_last, monitor=cfg.monitor, mode=mode,
                                            run_id=run.log.run_id)
        # everything a checkpoint holds; restored in place on resume (plain values come back in "loop")
        run.resumable = {"model": run.model, "optimizer": run.optimizer, "accumulator": run.accumulator,
                         "loader": run.train_loader, "metrics": run.metrics, "loop": run.loop}
        for name, item in (("scheduler", run.scheduler), ("scaler", run.accumulator.scaler),
                           ("early_stopping", run.stopper)):
            if item is not None:
                run.resumable[name] = item

    def _run(self, run: Run) -> FitResult:
        """The epochs; an interrupt or a NaN ends them with what was logged so far. The signal handlers stay
        until the run is closed: a repeated SIGTERM while the end state is written is ignored, and one that
        came after the last step takes effect once the run is closed (see StepBoundaryInterrupt)."""
        if run.loop.get("stopped_early"):
            run.outcome.stopped_early = True
            run.progress.message(f"the run had stopped early at epoch {run.loop['epoch'] - 1}; nothing to train "
                                 "(start another run_dir to train again).")
        # a resume computes with the thread count the checkpoint recorded (float sums depend on it); Ctrl-C
        # during training waits for the current optimizer step (not under several processes, which would have
        # to agree on the step)
        with threads_beside_workers(run.device, run.train_loader, threads=run.loop.get("threads")), \
                StepBoundaryInterrupt(enabled=not self._dist.enabled,
                                      preempt=self.config.preempt_signals) as run.interrupt:
            return self._epochs(run)

    def _epochs(self, run: Run) -> FitResult:
        try:
            run.loop["threads"] = torch.get_num_threads()
            self._fire(run, "on_fit_start")
            for epoch in range(run.loop["epoch"], 0 if run.outcome.stopped_early else self.config.epochs + 1):
                if self._epoch(run, epoch):
                    break
            if run.interrupt.preempted:  # held after the last step: the run ends saved, as preempted
                run.interrupt_saved = run.checkpoint_step == run.accumulator.optimizer_steps
                raise Preempted(signal_name=run.interrupt.preempted)
        except KeyboardInterrupt as exc:
            steps = run.accumulator.optimizer_steps
            run.outcome.stopped = "interrupted"
            saved = f"; its checkpoint at step {steps} resumes it" if run.interrupt_saved and run.manager else ""
            finished = plural(len(run.loop["history"]), "epoch")
            run.outcome.message = (f"interrupted at step {steps}{saved}; {finished} finished and everything logged so "
                                   f"far is in {run.log.path}.")
            run.log.write({"kind": "interrupted", "step": steps})
            run.progress.message(run.outcome.message)
            exc.result = self._finish(run, restore_best=False)  # type: ignore[attr-defined]
            raise
        except Preempted as exc:  # a scheduler's SIGTERM: the step's checkpoint and the log, then exit 143
            steps = run.accumulator.optimizer_steps
            run.outcome.stopped = "preempted"
            saved = f"; its checkpoint at step {steps} resumes it" if run.interrupt_saved and run.manager else ""
            finished = plural(len(run.loop["history"]), "epoch")
            run.outcome.message = exc.message = (
                f"preempted by {exc.signal} at step {steps}{saved}; {finished} finished and everything logged so "
                f"far is in {run.log.path}.")
            run.log.write({"kind": "preempted", "step": steps, "signal": exc.signal})
            run.progress.message(run.outcome.message)
            exc.result = self._finish(run, restore_best=False)
            raise
        except NonFiniteLossError as exc:
            run.outcome.stopped, run.outcome.message = "nonfinite", str(exc)
            run.log.write({"kind": "nonfinite", "step": exc.step, "message": run.outcome.message})
            exc.result = self._finish(run, restore_best=False)  # type: ignore[attr-defined]
            raise
        except BaseException as exc:
            close_run(run, failing=True)
            # a process that died: one sentence naming it and the latest good checkpoint, not gloo's traceback
            lost = lost_process_error(exc, self._dist, checkpoint=latest_checkpoint(run),
                                      timeout=self.config.dist_timeout)
            if lost is not None:
                raise lost from None
            raise
        return self._finish(run)

    def _fire(self, run: Run, event: str) -> None:
        """Call the callbacks of ``event``; the metrics they log are written at the current step."""
        logged = run.callbacks.fire(event)
        if logged:
            run.log.write({"kind": "metric", "epoch": run.loop["epoch"], "step": run.accumulator.optimizer_steps,
                           **logged})

    def _epoch(self, run: Run, epoch: int) -> bool:
        """Train one epoch, validate, log, diagnose, checkpoint; True when early stopping ends the run."""
        cfg = self.config
        run.loop["epoch"] = run.epoch = epoch
        epoch_started = time.perf_counter()
        if not run.train_loader.resume_offset:  # a resumed epoch already unfroze what it had to
            self._unfreeze_scheduled(run, epoch)
        set_sampler_epoch(run.train_loader, epoch)  # a new shuffle each epoch, the same on every rank
        self._fire(run, "on_epoch_start")
        record: dict[str, float] = {"epoch": epoch}
        record.update({f"train_{k}": v for k, v in self._train_epoch(run, epoch).items()})
        if run.val_loader is not None:
            values = self.validate(run.eval_model, run.val_loader, precision=run.precision, device=run.device)
            record.update({f"val_{k}": v for k, v in values.items()})
            run.latest = dict(record)
            record.update(callback_metrics(run.callbacks.fire("on_validation_end"), record))  # monitor sees them
        if run.plateau:
            run.scheduler.step(record.get("val_loss", record["train_loss"]))
        record.update(lr=run.optimizer.param_groups[0]["lr"], step=run.accumulator.optimizer_steps,
                      seconds=time.perf_counter() - epoch_started)
        run.loop["history"].append(record)
        run.latest = dict(record)
        run.log.write({"kind": "epoch", **record})
        run.progress.end_epoch(epoch, cfg.epochs, {k: v for k, v in record.items() if k != "epoch"})
        if cfg.diagnose and run.outcome.overfitting is None:
            run.outcome.overfitting = detect_overfitting(run.loop["history"])
            if run.outcome.overfitting is not None:
                run.progress.message(run.outcome.overfitting.message())
                run.loop["overfitting"] = dataclasses.asdict(run.outcome.overfitting)
                run.log.write({"kind": "overfitting", **run.loop["overfitting"]})
        self._fire(run, "on_epoch_end")
        stopper, asked = run.stopper, run.callbacks.state.stop_reason
        stop = (stopper is not None and stopper.update(epoch, record, run.model)) or asked is not None
        if self._dist.enabled:
            stop = broadcast_flag(stop, device=run.device)  # rank 0 decides; every rank stops together
        run.loop["epoch"] = epoch + 1
        run.loop["stopped_early"] = stop  # a resumed run that had stopped stays stopped
        self._checkpoint(run, metric=record.get(cfg.monitor))
        if run.interrupt.requested:  # Ctrl-C while the epoch's checkpoint was written: raised once it is whole
            run.interrupt_saved = cfg.checkpoints
            raise KeyboardInterrupt
        if run.interrupt.preempted and not self._dist.enabled:  # several processes stop at an agreed step
            run.interrupt_saved = cfg.checkpoints
            raise Preempted(signal_name=run.interrupt.preempted)
        if stop:
            run.outcome.stopped_early = True
            by_stopper, reason = stopper is not None and asked is None, asked or "rank 0 asked to stop"
            run.outcome.message = (stopper.stop_message(epoch) if by_stopper
                                   else f"stopped after epoch {epoch}: {reason}.")
            run.progress.message(run.outcome.message)
            run.log.write({"kind": "stopped_early", "epoch": epoch, "message": run.outcome.message})
        return stop

    def _unfreeze_scheduled(self, run: Run, epoch: int) -> None:
        patterns = (self.config.unfreeze_at or {}).get(epoch)
        if not patterns:
            return
        added = unfreeze_into(run.model, run.optimizer, *patterns, lr_by_pattern=self.config.lr_by_pattern,
                              scheduler=run.scheduler)
        run.progress.message(f"epoch {epoch}: unfroze {', '.join(patterns)} ({len(added)} parameter tensors added)")
        run.log.write({"kind": "unfreeze", "epoch": epoch, "patterns": list(patterns), "parameters": added})

    def _train_epoch(self, run: Run, epoch: int) -> dict[str, float]:
        loader = run.train_loader
        run.model.train()
        start = loader.resume_offset  # batches of this epoch trained before a resume
        if not start:
            run.metrics.reset()
        run.progress.start_epoch(epoch, self.config.epochs, length(loader))
        if start:
            run.progress.advance(start)
        run.stream.start_epoch()
        run.early_show = 1 if isinstance(run.progress, BarProgress) else 0  # the bar's running loss from step 1
        run.epoch_windows = run.accumulator.windows
        interrupt = run.interrupt
        interrupt.armed = True
        for batch, last_batch in loader.with_last():  # the last batch is known without len()
            if run.agree_on_last:  # DDP on data without len(): every rank must end on the same batch
                same_last_batch(last_batch, loader.batches_done, device=run.device)
            if run.step.add(batch, last=last_batch):  # the batch ended a window: the optimizer stepped
                if run.micro is not None:
                    self._report_halvings(run)
                self._after_window(run, epoch)
                if run.callbacks.step_end:
                    self._fire(run, "on_step_end")
                # a preemption signal rides the next windows' count all-reduce: every process stops here together
                run.accumulator.stop_requested = interrupt.preempted is not None
                if interrupt.requested or run.accumulator.stop_agreed:  # held until this step: the state is exact
                    if run.checkpoint_step != run.accumulator.optimizer_steps:
                        self._checkpoint(run)
                    run.interrupt_saved = self.config.checkpoints
                    if interrupt.requested:
                        raise KeyboardInterrupt
                    raise Preempted(signal_name=interrupt.preempted or "a signal to another process")
            run.progress.advance()
        interrupt.armed = False
        if not loader.batches_done:
            if run.agree_on_last:
                same_last_batch(True, 0, device=run.device)
            raise TrainwiseError(
                f"the training data yielded no batches in epoch {epoch}; pass data that yields batches every "
                "epoch (an iterator is used up after one)."
            )
        if self.config.nonfinite == "stop":
            check_finite_everywhere(run.guard, run.accumulator.optimizer_steps)
        return global_metric_values(run.metrics)  # sums over every process (one all-reduce)

    def _after_window(self, run: Run, epoch: int) -> None:
        """After each window: log every ``log_every`` windows, checkpoint every ``checkpoint_every``."""
        cfg, windows = self.config, run.accumulator.windows
        if windows - run.epoch_windows == run.early_show:  # steps 1, 2, 4... of an epoch, on the bar only
            if run.early_show < cfg.log_every:
                run.progress.show(run.metrics.compute())  # this process's values: no collective
            run.early_show *= 2
        if windows % cfg.log_every == 0:
            if cfg.nonfinite == "stop":
                check_finite_everywhere(run.guard, run.accumulator.optimizer_steps)
            values = global_metric_values(run.metrics)  # one host sync (and all-reduce) per log interval
            run.latest = values
            run.progress.show(values)
            run.log.write({"kind": "train", "epoch": epoch, "step": run.accumulator.optimizer_steps, **values,
                           "lr": run.optimizer.param_groups[0]["lr"]})
        if cfg.checkpoint_every and windows % cfg.checkpoint_every == 0:
            self._checkpoint(run)

    def _checkpoint(self, run: Run, *, metric: float | None = None) -> None:
        """Save the full state at an optimizer-step boundary, never after a non-finite loss."""
        if not self.config.checkpoints:
            return
        if self.config.nonfinite == "stop":
            check_finite_everywhere(run.guard, run.accumulator.optimizer_steps)
        with run.interrupt.held():  # a Ctrl-C inside torch.save would break the file being written
            save_training_checkpoint(run.manager, run.resumable, step=run.accumulator.optimizer_steps, metric=metric,
                                     config=run.checkpoint_config, run_dir=run.run_dir,
                                     background=True)  # fsync and pruning overlap the next epoch
        run.checkpoint_step = run.accumulator.optimizer_steps

    def _finish(self, run: Run, *, restore_best: bool = True) -> FitResult:
        """Restore the best weights (early stopping), find the best epoch, draw the curves, build the result."""
        cfg, history, outcome, stopper = self.config, run.loop["history"], run.outcome, run.stopper
        best, value = best_epoch(history, cfg.monitor, cfg.mode)
        if restore_best and stopper is not None and stopper.best_epoch is not None:
            best, value = stopper.best_epoch, stopper.best_value
            if stopper.restore(run.model) is not None and best != len(history):
                run.progress.message(f"restored the weights of epoch {best} ({cfg.monitor} {value:.6g}).")
        plot = None
        if cfg.plot and history and self._dist.is_main:
            curves = {"history": history, "monitor": cfg.monitor, "best_epoch": best,
                      "overfitting_epoch": outcome.overfitting.onset_epoch if outcome.overfitting else None}
            names = RunFolder(run.run_dir)
            if cfg.plot_format == "svg":  # no plotting library: a few milliseconds
                plot = write_learning_curves_svg(path=names.file(CURVES_SVG), **curves)
            else:
                try:
                    plot = plot_learning_curves(path=names.file(CURVES_PNG), **curves)
                except ImportError:
                    run.progress.message(PLOT_HINT)
        status = {"interrupted": "interrupted", "preempted": "preempted", "nonfinite": "failed"}.get(
            outcome.stopped, "stopped_early" if outcome.stopped_early else "finished")
        try:
            end_trackers(run, status, artifacts=[plot] if plot else [])
        except BaseException:  # an on_fit_end that raised: the run is closed first (checkpoint whole, hooks off)
            close_run(run, failing=True)
            raise
        close_run(run, check=outcome.stopped == "completed")  # the guards' last check, then every hook removed
        return FitResult(
            history=history, run_dir=run.run_dir, steps=run.accumulator.optimizer_steps,
            seconds=time.perf_counter() - run.started, stopped=outcome.stopped, device=str(run.device),
            precision=run.precision.name, message=outcome.message, best_epoch=best, best_value=value,
            stopped_early=outcome.stopped_early, overfitting=outcome.overfitting, plot=plot, model=run.model,
        )

    def _forward_function(self, precision: Any, device: torch.device) -> Callable[[Any, Any], MicroBatch]:
        """``forward_micro_batch(model, batch)`` with this Trainer's batch conventions, precision and device
        bound once (a partial: no Python frame of its own on every step)."""
        cfg = self.config
        return functools.partial(
            forward_micro_batch, device=device, split=self.split_batch, loss_fn=self.loss_fn, count=cfg.count,
            ignore_index=cfg.ignore_index, reduction=cfg.loss_reduction, autocast=precision.autocast,
        )

    def validate(
        self,
        model: torch.nn.Module,
        loader: Iterable[Any],
        *,
        precision: Any = None,
        device: torch.device | str | None = None,
    ) -> dict[str, float]:
        """Loss (and accuracy) over a whole loader under eval mode and inference mode, counted by sample."""
        cfg = self.config
        device = torch.device(device) if device is not None else resolve_device(cfg.device).device
        precision = precision or resolve_precision(cfg.precision, device)
        return evaluate(model, loader, self._forward_function(precision, device), device=device,
                        accuracy=cfg.accuracy, ignore_index=cfg.ignore_index)
