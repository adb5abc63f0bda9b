"""One ``fit`` as an object: what the run holds besides the checkpointed :class:`RunState`, how it is built
from a Trainer's options (model placed, optimizer, loaders, run folder, resume, the step, guards, callbacks),
and how it ends (best weights, curves, the end record, every file closed, the process group left).

The Trainer's loop (:mod:`trainwise.trainer`) runs it, built from a :class:`RunSpec` (the options and the objects
the Trainer was given); the policies (:mod:`trainwise.policies`) are handed the parts they use, and the user's
callbacks a view (:class:`~trainwise.callbacks.TrainingState`). Package-internal: the public face is
``Trainer.fit`` and the primitives it calls.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainwise._version import __version__
from trainwise.accumulation import GradientAccumulator
from trainwise.callbacks import CallbackErrors, CallbackList, LatestMetrics, TrainingState
from trainwise.checkpoint.compat import FACTS_KEY, run_facts
from trainwise.checkpoint.manager import CheckpointManager, latest_in
from trainwise.checkpoint.resume import LoopCounters, RunState, resume
from trainwise.checkpoint.training import finish_checkpoint_writes, save_training_checkpoint
from trainwise.checkpoint.weights import save_weights
from trainwise.compiled import CompileWatch
from trainwise.config import TrainerConfig
from trainwise.data.batches import count_choice
from trainwise.data.loaders import StreamCheck, evaluation_loader, training_loader, window_steps
from trainwise.data.samplers import padding_for
from trainwise.device import resolve_device, resolve_precision
from trainwise.diagnosis import OverfittingReport
from trainwise.early_stopping import EarlyStopping, best_epoch, metric_mode
from trainwise.errors import TrainwiseError
from trainwise.freezing import pin_frozen_norm_layers
from trainwise.guards.core import Guard, GuardFinding
from trainwise.guards.loss import NonFiniteLossGuard, check_finite_everywhere
from trainwise.guards.registry import all_check_classes
from trainwise.metrics import MetricSet
from trainwise.oom import AdaptiveMicroBatches, check_auto_loader
from trainwise.optimizers import build_optimizer, build_scheduler
from trainwise.policies import (
    EarlyStop,
    LogCadence,
    OverfittingWatch,
    PeriodicCheckpoint,
    PlateauStep,
    UnfreezeSchedule,
)
from trainwise.progress import make_progress
from trainwise.results import FitResult
from trainwise.run_control import Outcome, RunControl
from trainwise.run_folder import BEST_WEIGHTS, RunFolder
from trainwise.runlog import RunLock, open_run
from trainwise.seeding import seed_everything
from trainwise.step import TrainStep
from trainwise.strategy import SingleProcess, Strategy, connect
from trainwise.tracking import TrackedLog, open_loggers

# The guards' codes this loop rules out itself: it zeroes the gradients every step (TW105), scales float16 with a
# GradScaler (TW109) and moves every batch to the model's device (TW112).
RULED_OUT_BY_THE_LOOP = frozenset({"TW105", "TW109", "TW112"})
# The forward-time checks watch one optimizer step in this many: the mistakes they catch repeat on every step,
# and hooking every forward costs about 4% of a millisecond step. Callbacks' forwards are all watched.
GUARD_FORWARD_EVERY = 8


@dataclasses.dataclass(frozen=True, eq=False)
class RunSpec:
    """What one ``fit`` is built from: the Trainer's plain options and the objects it was given (``Trainer.fit``
    hands it to :func:`start_run`, which reads nothing else of the Trainer)."""

    config: TrainerConfig
    forward: Callable[[Any, torch.device], Callable[[Any, Any], Any]]  # (precision, device) -> the step's forward
    split_batch: Callable[[Any], tuple[Any, Any]]  # a batch -> (inputs, targets)
    optimizer: Any = None  # an optimizer, or a factory called with the trainable parameters (None: AdamW)
    scheduler: Any = None  # a scheduler, or a factory called with the optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    callbacks: Sequence[Any] = ()  # the user's callbacks
    logger_objects: Sequence[Any] = ()  # tracker objects beside the named loggers of config.loggers


@dataclasses.dataclass(eq=False)
class Fit:
    """What one ``fit`` holds besides the checkpointed :class:`RunState`; the loop runs it, and hands the policies
    and callbacks only the parts they use."""

    options: TrainerConfig
    state: RunState
    strategy: Strategy
    lock: RunLock
    folder: RunFolder
    eval_model: torch.nn.Module
    val_loader: Any
    precision: Any
    guard: NonFiniteLossGuard  # every loss, checked at log intervals and checkpoints
    stream: StreamCheck
    config: dict[str, Any]  # the options and run facts every checkpoint records
    control: RunControl  # how the run ends: the signals, the stops requested, their agreement across processes
    step: TrainStep | None = None
    manager: CheckpointManager | None = None  # rank 0's checkpoints
    callbacks: CallbackList | None = None
    guard_hooks: Guard | None = None
    compiled: CompileWatch | None = None  # with compile=True: the graphs torch.compile compiles, for the end record
    outcome: Outcome = dataclasses.field(default_factory=Outcome)  # how it ended, written at the loop's one end
    started: float = 0.0
    # the newest values read from the device, which callbacks see: published by the log cadence and the loop
    latest: LatestMetrics = dataclasses.field(default_factory=LatestMetrics)
    resumed_step: int | None = None
    checkpoint_step: int = -1
    count_said: bool = False  # what count="auto" chose was said (after the first step)

    @property
    def counters(self) -> LoopCounters:
        return self.state.counters

    @property
    def optimizer_steps(self) -> int:
        return self.state.accumulator.optimizer_steps

    def checkpoint(self, *, metric: float | None = None, epoch_done: bool = False) -> None:
        """Save the full state at an optimizer-step boundary, never after a non-finite loss; at an epoch's end
        (``epoch_done``) its counters say the next epoch, where a resume of it starts (the loop's own counter
        stays on the epoch just trained)."""
        if not self.options.checkpoints:
            return
        if self.options.nonfinite == "stop":
            check_finite_everywhere(self.guard, self.optimizer_steps)
        self.counters.accuracy = self.step.counts_accuracy
        entries = self.state.entries()
        if epoch_done:
            entries["loop"] = self.counters.next_epoch()
        with self.control.held():  # a Ctrl-C inside torch.save would break the file being written
            save_training_checkpoint(self.manager, entries, step=self.optimizer_steps, metric=metric,
                                     config=self.config, run_dir=self.folder.run_dir,
                                     background=True)  # fsync and pruning overlap the next epoch
        self.checkpoint_step = self.optimizer_steps

    def say_count(self) -> None:
        """With ``count="auto"``: what the first batch chose to count, and why, printed, logged and added to
        ``config.json`` (once, after the first optimizer step)."""
        self.count_said = True
        self.folder.log.settle()  # config.json, committed beside the first step, is on disk (or its error raised)
        found = count_choice(self.state.model) if self.options.count == "auto" else None
        if found is not None:
            count, reason = found
            self.folder.announce("count", f"counting {count}: {reason}", count=count, reason=reason)
            self.folder.amend_config(count=count, count_reason=reason)

    def report_halvings(self) -> None:
        """batch_size='auto' ran out of memory: said once per halving; checkpoints keep the new size."""
        for old, new in self.step.take_halvings():
            effective = self.options.effective_batch
            step, parts = self.step.splitter.step + 1, -(-effective // new)  # the window's step
            message = (f"OOM at micro-batch {old} in step {step}: continuing with {new} x {parts}, effective batch "
                       f"{effective} unchanged.")
            self.counters.micro_batch = new
            self.folder.announce("oom", message, step=step, micro_batch_before=old, micro_batch=new,
                                 micro_batches=parts, message=message)

    # -- the end -------------------------------------------------------------------------------------

    def finish(self, *, restore_best: bool = True) -> FitResult:
        """Restore the best weights (early stopping), find the best epoch, draw the curves, end the run."""
        cfg, history, stopper = self.options, self.counters.history, self.state.early_stopping
        best, value = best_epoch(history, cfg.monitor, cfg.mode)
        if restore_best and stopper is not None and stopper.best_epoch is not None:
            best, value = stopper.best_epoch, stopper.best_value
            if stopper.restore(self.state.model) is not None and best != len(history):
                self.folder.say(f"restored the weights of epoch {best} ({cfg.monitor} {value:.6g}).")
        overfitting = OverfittingReport(**self.counters.overfitting) if self.counters.overfitting else None
        plot = None
        if cfg.plot and history and self.strategy.is_main:
            plot = self.folder.draw_curves(history, monitor=cfg.monitor, best_epoch=best, format=cfg.plot_format,
                                           overfitting_epoch=overfitting.onset_epoch if overfitting else None)
        outcome = self.outcome
        try:
            self.end(outcome.end_state(), artifacts=[plot] if plot else [])
        except BaseException:  # an on_fit_end that raised: the run is closed first (checkpoint whole, hooks off)
            self.close(failing=True)
            raise
        self.close(check=outcome.stopped == "completed")  # the guards' last check, then every hook removed
        return FitResult(
            history=history, run_dir=self.folder.run_dir, steps=self.optimizer_steps,
            seconds=time.perf_counter() - self.started, stopped=outcome.stopped, device=str(self.strategy.device),
            precision=self.precision.name, message=outcome.message, best_epoch=best, best_value=value,
            stopped_early=outcome.stopped_early, overfitting=overfitting, plot=plot, model=self.state.model,
        )

    def end(self, status: str, *, artifacts: list[Any], error: BaseException | None = None) -> None:
        """Tell the callbacks (``on_fit_end``), the log and the trackers how the run ended (trackers also get the
        curves and the final weights). An ``on_fit_end`` that raises makes the run ``failed``, the log naming the
        callback; its error is raised once the log and the trackers have been told."""
        if self.outcome.status is not None:  # told already
            return
        self.outcome.status = status  # what on_fit_end sees as state.status
        ended = CallbackErrors()
        if self.callbacks is not None:
            try:
                ended = self.callbacks.fire_naming("on_fit_end", failing=error)
            except BaseException as exc:  # Ctrl-C or an exit inside an on_fit_end: no other was called after it
                ended = CallbackErrors(cause=getattr(exc, "trainwise_callback", "a callback"), raised=exc)
        raised = ended.raised
        if raised is not None:
            status, error = "failed", error or raised
        # the end record's one writer: what the callbacks' end found joins it here
        record: dict[str, Any] = {"kind": "end", "status": status, "step": self.optimizer_steps,
                                  **(ended.record() if status == "failed" else {})}
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"[:500]
        graphs = self.compiled.new_graphs() if self.compiled is not None else None
        if graphs is not None:  # versions of the forward compiled in this run; TW115 says when they are too many
            record["compiled_graphs"] = graphs
        final = status != "failed" and not self.strategy.sharded  # FSDP's weights are sharded over processes
        self.folder.finish(status, record, artifacts=artifacts,
                           final_weights=functools.partial(save_weights, self.state.model) if final else None)
        if raised is not None:
            raise raised

    def close(self, *, check: bool = False, failing: bool = False) -> None:
        """Finish the last checkpoint write, remove the guards, close the progress display and the log; while
        another error propagates (``failing``), a failed checkpoint write is reported, not raised over it."""
        if failing and self.outcome.status is None:
            try:
                self.end("failed", artifacts=[], error=sys.exc_info()[1])
            except Exception as exc:  # the error already propagating is the one to see
                self.folder.say(f"on_fit_end failed too: {type(exc).__name__}: {exc}")
        try:
            try:
                finish_checkpoint_writes(self.manager)  # the last checkpoint is on disk when fit returns or raises
            except TrainwiseError as exc:
                if not failing:
                    raise
                self.folder.say(str(exc))
            finally:
                if self.guard_hooks is not None:
                    self.guard_hooks.close(check=check)
        finally:
            self.folder.close()

    def release(self) -> None:
        """Free the run folder for the next writer and leave a process group this fit joined, after letting go of
        the DDP/compiled wrappers: a traceback's frames may still hold this run, and a wrapper that outlives its
        group into interpreter exit aborts gloo."""
        self.lock.release()
        if self.step is not None:
            self.step.model = None
            if self.step.splitter is not None:
                self.step.splitter.model = None
        self.guard_hooks, self.eval_model = None, self.state.model
        self.strategy.close()

    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint (rank 0 lists them; another process names the step it saved)."""
        if self.manager is not None:
            try:
                latest = self.manager.latest()
                return None if latest is None else str(latest)
            except (OSError, TrainwiseError):
                return None
        step = self.checkpoint_step if self.checkpoint_step >= 0 else self.resumed_step
        return None if step is None else f"the one of step {step} in {self.folder.run_dir}"


# -- building a run from a Trainer's options ----------------------------------------------------------------


def start_run(spec: RunSpec, model: Any, train_data: Any, val_data: Any) -> Fit:
    """The run ``Trainer.fit(model, train_data, val_data)`` trains, built from ``spec``; what it had taken (the run
    folder's lock, a process group) is let go if building it fails, a lost process said in one sentence."""
    builder = _Builder(spec)
    try:
        return builder.build(model, train_data, val_data)
    except BaseException as exc:
        lost = builder.strategy.lost_process(exc, checkpoint=latest_in(builder.cfg.run_dir),
                                             timeout=builder.cfg.dist_timeout)
        builder.lock.release()
        builder.strategy.close()
        if lost is not None:
            raise lost from None
        raise


class _Builder:
    """The set-up of one run, in the order a person would write it: model, processes, optimizer, data, the
    run folder, resume, the step, guards, callbacks."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec, self.cfg = spec, spec.config
        self.strategy: Strategy = SingleProcess(torch.device("cpu"))  # until connect(): under torchrun, DDP or FSDP
        self.lock = RunLock(".")  # until the run folder is opened

    def build(self, model: Any, train_data: Any, val_data: Any) -> Fit:
        cfg, spec, started = self.cfg, self.spec, time.perf_counter()
        model, precision, notes = self._place_model(model)
        strategy, device = self.strategy, self.strategy.device
        optimizer = build_optimizer(model, spec.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    lr_by_pattern=cfg.lr_by_pattern, check_coverage=cfg.guards == "off",
                                    fold_groups=not strategy.sharded)  # FSDP's checkpoints keep their groups
        scheduler = build_scheduler(spec.scheduler, optimizer)
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        train_loader, val_loader = self._loaders(model, train_data, val_data, device)
        auto = cfg.batch_size == "auto"  # each batch of effective_batch samples is one window, split as it fits
        accumulator = GradientAccumulator(
            optimizer, steps=1 if auto else window_steps(train_loader, effective_batch=cfg.effective_batch,
                                                         steps=cfg.accumulation_steps, split=spec.split_batch),
            scheduler=None if plateau else scheduler, scaler=precision.make_scaler(),
            max_grad_norm=cfg.max_grad_norm, skip_nonfinite=cfg.nonfinite == "skip", distributed=strategy.enabled)
        forward_model, eval_model = strategy.wrap(model, compile=cfg.compile)
        state = RunState(model=model, optimizer=optimizer, accumulator=accumulator, loader=train_loader,
                         metrics=MetricSet(device), scheduler=scheduler)
        facts = run_facts(model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader,
                          window=accumulator.steps, precision=precision.name, world_size=strategy.world_size,
                          loss_fn=spec.loss_fn)
        folder = self._open_folder(precision)  # the lock taken
        fit = Fit(options=cfg, state=state, strategy=strategy, lock=self.lock, folder=folder, eval_model=eval_model,
                  val_loader=val_loader, precision=precision, started=started, stream=StreamCheck(train_loader),
                  guard=NonFiniteLossGuard(device, model=model if cfg.nonfinite == "stop" else None),
                  config={**cfg.to_dict(), FACTS_KEY: facts},  # built once: every checkpoint records it
                  control=RunControl(state.counters, preempt=cfg.preempt_signals, agree=strategy.agree,
                                     distributed=strategy.enabled),
                  compiled=CompileWatch([forward_model, eval_model]) if cfg.compile else None)
        fit.control.share(accumulator)  # several processes: a preemption rides each window's count all-reduce
        self._keep(fit)
        for note in notes:  # the device line is printed only: config.json records the device and precision
            if not note.pop("shown", False):
                fit.folder.announce("note", note["message"] if "norm_layers" in note else None, **note)
            else:
                fit.folder.say(note["message"])
        policies = self._policies(fit, plateau=scheduler if plateau else None)
        unfreeze = next((p for p in policies if isinstance(p, UnfreezeSchedule)), None)
        fit.resumed_step = resume(state, cfg.resume, fit.folder, config=cfg.to_dict(), facts=facts,
                                  mismatch=cfg.resume_mismatch, sharded=strategy.sharded, is_main=strategy.is_main,
                                  before_restore=unfreeze.replay if unfreeze is not None else None)
        if fit.guard.model is not None:
            fit.guard.keep(accumulator.optimizer_steps)  # a NaN before the first check returns the model here
        fit.folder.log.begin()  # compared first, written after: a refused resume has left the folder as it was
        splitter = None
        if auto:
            splitter = AdaptiveMicroBatches(fit.counters.micro_batch or cfg.effective_batch,
                                            distributed=strategy.enabled, model=forward_model)
        fit.step = TrainStep(forward_model, accumulator, spec.forward(precision, device), state.metrics,
                             accuracy=cfg.accuracy, ignore_index=cfg.ignore_index, stream=fit.stream,
                             skip_nonfinite=cfg.nonfinite == "skip", splitter=splitter,
                             loss_guard=fit.guard if cfg.nonfinite == "stop" else None,
                             counts_accuracy=fit.counters.accuracy)
        if fit.control.stopped_early:
            fit.folder.say(f"the run had stopped early at epoch {fit.counters.epoch - 1}; nothing to train (start "
                           "another run_dir to train again).")
        self._install_guards(fit, forward_model)
        self._open_callbacks(fit, policies)
        return fit

    def _place_model(self, model: Any) -> tuple[torch.nn.Module, Any, list[dict[str, Any]]]:
        """Seed, build the model (a factory) or take it, join the processes, move it to its device, keep frozen
        norm layers in eval, shard it (FSDP); the notes say what the log should know."""
        cfg, notes = self.cfg, []
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
        self.strategy = connect(cfg.distributed, choice.device, timeout=cfg.dist_timeout)  # torchrun: join
        cfg.check_processes(self.strategy.name)  # an option these processes cannot honour: one sentence
        device = self.strategy.device
        model.to(device)
        # requires_grad_(False) alone leaves BatchNorm updating its statistics in train mode: pinned in eval
        pinned = [] if cfg.train_norm_stats else pin_frozen_norm_layers(model)
        if pinned:
            names = ", ".join(pinned[:3]) + (", ..." if len(pinned) > 3 else "")
            notes.append({"message": f"kept {len(pinned)} norm layer(s) whose parameters are frozen in eval mode "
                          f"({names}); pass train_norm_stats=True to let them update their running statistics.",
                          "norm_layers": pinned})
        self.strategy.place(model)  # FSDP shards here, before the optimizer sees the parameters
        precision = resolve_precision(cfg.precision, device)
        notes.append({"message": f"training on {device} ({choice.reason}) in {precision.name} ({precision.reason})",
                      "shown": True})
        return model, precision, notes

    def _loaders(self, model: torch.nn.Module, train_data: Any, val_data: Any, device: torch.device) -> tuple[Any, Any]:
        """The training loader (seeded, sharded under torchrun, resumable) and the evaluation one."""
        cfg = self.cfg
        batch_size = cfg.effective_batch if cfg.batch_size == "auto" else cfg.batch_size
        options = {"seed": cfg.seed, "num_workers": cfg.num_workers, "device": device,
                   "shard": self.strategy.enabled, "collate_fn": self.spec.collate_fn}
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
        cfg = self.cfg
        path, self.lock, log = open_run(cfg.run_dir, self._params(precision), resume=cfg.resume,
                                        overwrite=cfg.overwrite, deferred=True)
        return RunFolder(path).attach(log=log, progress=make_progress(cfg.progress if self.strategy.is_main
                                                                      else "off"))

    def _params(self, precision: Any) -> dict[str, Any]:
        """config.json's content, and the trackers' hyperparameters."""
        return {"trainer": self.cfg.to_dict(), "device": str(self.strategy.device), "precision": precision.name,
                "precision_reason": precision.reason, "trainwise": __version__, "torch": torch.__version__}

    def _keep(self, fit: Fit) -> None:
        """Rank 0's checkpoints, and the best weights early stopping keeps (in memory, or on disk on rank 0)."""
        cfg, main = self.cfg, fit.strategy.is_main
        mode = metric_mode(cfg.monitor) if cfg.mode == "auto" else cfg.mode
        if cfg.checkpoints and main:
            fit.manager = CheckpointManager(fit.folder.run_dir, keep_last=cfg.keep_last, monitor=cfg.monitor,
                                            mode=mode, run_id=fit.folder.log.run_id)
            fit.manager.claim(write=False)  # a copied run folder sharing the original's checkpoints/: refused
        if cfg.patience is not None:
            keep = cfg.keep_best if main else "memory"  # one writer of the best-weights file
            fit.state.early_stopping = EarlyStopping(
                cfg.monitor, mode=cfg.mode, patience=cfg.patience, min_delta=cfg.min_delta, keep=keep,
                path=fit.folder.file(BEST_WEIGHTS) if keep == "disk" else None)

    def _policies(self, fit: Fit, *, plateau: Any) -> list[Any]:
        """The built-in callbacks this configuration asks for, in the order they run at an event, each handed the
        parts of the run it uses."""
        cfg, state, folder = self.cfg, fit.state, fit.folder
        accumulator = state.accumulator
        policies: list[Any] = [LogCadence(
            cfg.log_every, accumulator=accumulator, metrics=state.metrics, reduce=fit.strategy.reduce,
            optimizer=state.optimizer, progress=folder.progress, record=folder.record, publish=fit.latest.publish,
            check_finite=functools.partial(check_finite_everywhere, fit.guard) if cfg.nonfinite == "stop" else None)]
        if cfg.checkpoint_every and cfg.checkpoints:
            policies.append(PeriodicCheckpoint(cfg.checkpoint_every, windows=lambda: accumulator.windows,
                                               save=fit.checkpoint))
        if cfg.unfreeze_at:
            policies.append(UnfreezeSchedule(cfg.unfreeze_at, lr_by_pattern=cfg.lr_by_pattern, model=state.model,
                                             optimizer=state.optimizer, scheduler=state.scheduler,
                                             resume_offset=lambda: state.loader.resume_offset,
                                             announce=folder.announce))
        if plateau is not None:
            policies.append(PlateauStep(plateau))
        if cfg.diagnose:
            policies.append(OverfittingWatch(state.counters, announce=folder.announce))
        if state.early_stopping is not None:
            policies.append(EarlyStop(state.early_stopping, counters=state.counters, model=state.model))
        return policies

    def _install_guards(self, fit: Fit, forward_model: torch.nn.Module) -> None:
        """The doctor's codes at run time (``guards``), each finding printed and logged once; not the checks
        this loop rules out, nor TW108 with ``train_norm_stats=True`` (frozen norm layers then update on purpose)."""
        cfg = self.cfg
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
            fit.close()
            raise
        fit.guard_hooks.step = fit.optimizer_steps

    def _open_callbacks(self, fit: Fit, policies: list[Any]) -> None:
        """The policies and the user's callbacks with their view of the run; the loggers beside metrics.jsonl."""
        cfg, spec, state = self.cfg, self.spec, fit.state
        view = TrainingState(epochs=cfg.epochs, counters=state.counters, latest=fit.latest, model=state.model,
                             steps=lambda: state.accumulator.optimizer_steps, optimizer=state.optimizer,
                             run_dir=fit.folder.run_dir, control=fit.control, outcome=fit.outcome)
        try:
            fit.callbacks = CallbackList(spec.callbacks, view, outcome=fit.outcome, policies=policies)
            if fit.guard_hooks is not None:  # the guards check every forward a callback runs
                fit.callbacks.context = fit.guard_hooks.watching_forwards
            if fit.strategy.is_main and (cfg.loggers != ["jsonl"] or spec.logger_objects):
                trackers = open_loggers(cfg.loggers, list(spec.logger_objects), fit.folder.run_dir,
                                        resumed_step=fit.resumed_step)
                fit.folder.log = TrackedLog(fit.folder.log, trackers, on_failure=fit.folder.say)
                fit.folder.log.each("log_hyperparams", {**self._params(fit.precision), "world_size":
                                                        fit.strategy.world_size,
                                                        "accumulation_steps": fit.state.accumulator.steps})
        except BaseException:
            fit.close(failing=True)
            raise

