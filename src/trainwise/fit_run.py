"""What one ``Trainer.fit`` carries between its steps and epochs (:class:`Run`), and how a run ends: the
callbacks and trackers told, the last checkpoint written, hooks removed, the log closed."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import torch

from trainwise.accumulation import GradientAccumulator
from trainwise.callbacks import CallbackList
from trainwise.checkpoint.loader import ResumableLoader
from trainwise.checkpoint.manager import CheckpointManager
from trainwise.checkpoint.training import finish_checkpoint_writes
from trainwise.checkpoint.weights import save_weights
from trainwise.config import TrainerConfig
from trainwise.data import StreamCheck
from trainwise.diagnosis import OverfittingReport
from trainwise.early_stopping import EarlyStopping
from trainwise.errors import TrainwiseError
from trainwise.guards.core import Guard, GuardFinding
from trainwise.guards.loss import NonFiniteLossGuard
from trainwise.guards.registry import all_check_classes
from trainwise.interrupts import StepBoundaryInterrupt
from trainwise.metrics import MetricSet
from trainwise.oom import AdaptiveMicroBatches
from trainwise.progress import PlainProgress
from trainwise.step import TrainStep
from trainwise.tracking import TrackedLog


@dataclasses.dataclass
class Outcome:
    stopped: Literal["completed", "interrupted", "preempted", "nonfinite"] = "completed"
    message: str = ""
    stopped_early: bool = False
    overfitting: OverfittingReport | None = None


@dataclasses.dataclass(eq=False)
class Run:
    """What one ``fit`` carries between epochs and steps; ``loop`` holds the plain values a checkpoint saves."""

    model: torch.nn.Module
    forward_model: torch.nn.Module  # DDP-wrapped and/or compiled for training
    eval_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    plateau: bool
    accumulator: GradientAccumulator
    train_loader: ResumableLoader
    val_loader: Iterable[Any] | None
    precision: Any
    device: torch.device
    metrics: MetricSet
    guard: NonFiniteLossGuard
    stream: StreamCheck
    started: float
    fsdp: bool = False
    agree_on_last: bool = False
    step: TrainStep | None = None  # micro-batches in, optimizer steps out (built once any resume is read)
    run_dir: Path = Path(".")
    log: Any = None  # RunLog, or NullRunLog off rank 0
    progress: PlainProgress | None = None  # type: ignore[assignment]
    stopper: EarlyStopping | None = None
    manager: CheckpointManager | None = None
    resumable: dict[str, Any] = dataclasses.field(default_factory=dict)
    loop: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"epoch": 1, "history": [], "accuracy": None, "overfitting": None}
    )
    outcome: Outcome = dataclasses.field(default_factory=Outcome)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # what a checkpoint records of the run
    checkpoint_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # the config and facts it records
    guard_hooks: Guard | None = None  # the runtime guards (guards="warn" or "raise")
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # config.json; the trackers' hyperparameters
    resumed_step: int | None = None  # the step a resume continued from
    callbacks: CallbackList | None = None
    latest: dict[str, float] = dataclasses.field(default_factory=dict)  # the newest values read from the device
    interrupt: StepBoundaryInterrupt = dataclasses.field(default_factory=lambda: StepBoundaryInterrupt(enabled=False))
    interrupt_saved: bool = False  # a held Ctrl-C saved a checkpoint at its step
    early_show: int = 0  # the next window of the epoch whose running values the bar shows (0: none)
    epoch_windows: int = 0  # windows before this epoch
    ended: bool = False  # callbacks and trackers were told the end state
    micro: AdaptiveMicroBatches | None = None  # batch_size="auto": the micro-batch size that fits
    epoch: int = 0  # the epoch training is in (or last was in)
    checkpoint_step: int = -1  # the step of the last checkpoint written


# The guards' codes the Trainer's own loop cannot produce: gradients never zeroed, float16 without a scaler, a
# batch on another device.
RULED_OUT_BY_THE_LOOP = frozenset({"TW105", "TW109", "TW112"})
# The forward-time checks watch one optimizer step in this many: the mistakes they catch (a graph kept in a
# list, a frozen norm layer in train mode) repeat on every step, and hooking every forward costs about 4% of a
# millisecond step. Callbacks' forwards are all watched.
GUARD_FORWARD_EVERY = 8


def install_guards(run: Run, config: TrainerConfig) -> None:
    """The doctor's codes at run time (``guards``): each finding printed and logged once."""
    cfg = config
    if cfg.guards == "off":
        return

    def found(finding: GuardFinding) -> None:
        run.progress.message(f"guard: {finding}")
        run.log.write({"kind": "guard", **dataclasses.asdict(finding)})

    # Not run: what this loop rules out itself (it zeroes the gradients after every step, scales float16 with
    # a GradScaler, moves every batch to the model's device), and TW108 with train_norm_stats=True (frozen
    # norm layers then update their statistics on purpose). Each skipped check is work on every step.
    skipped = RULED_OUT_BY_THE_LOOP | ({"TW108"} if cfg.train_norm_stats else set())
    codes = [c.code for c in all_check_classes() if c.code not in skipped]
    try:
        # the models the loop calls: with compile=True their forwards are hooked outside the compiled region,
        # so the checks add no graph break to the user's module
        run.guard_hooks = Guard(run.forward_model, run.optimizer,
                                action="raise" if cfg.guards == "raise" else "record",
                                check_every=cfg.log_every, on_finding=found, checks=codes,
                                forward_every=GUARD_FORWARD_EVERY, other_wrappers=[run.eval_model])
    except BaseException:
        close_run(run)
        raise
    run.guard_hooks.step = run.accumulator.optimizer_steps


def build_model(factory: Callable[[], Any]) -> torch.nn.Module:
    """Call a model factory (after seeding); anything but a module is one sentence."""
    model = factory()
    if not isinstance(model, torch.nn.Module):
        name = getattr(factory, "__name__", type(factory).__name__)
        raise TrainwiseError(f"the model factory {name} returned a {type(model).__name__}, not a torch.nn.Module.")
    return model


def end_trackers(run: Run, status: str, *, artifacts: list[Path], error: BaseException | None = None) -> None:
    """Tell the callbacks (``on_fit_end``), the log and the trackers how the run ended; trackers also get the
    learning curves and the final weights. An ``on_fit_end`` that raises makes the run ``failed`` (the log
    names the callback); its error is raised once the log and the trackers have been told."""
    if run.ended:
        return
    run.ended = True
    callback_error: BaseException | None = None
    record: dict[str, Any] = {"kind": "end", "status": status, "step": run.accumulator.optimizer_steps}
    if run.callbacks is not None:
        run.callbacks.state.status = status
        try:
            fire_each(run.callbacks, "on_fit_end")
        except BaseException as exc:
            callback_error, status = exc, "failed"
            record.update(status=status, callback=getattr(exc, "trainwise_callback", "a callback"))
            error = error or exc
    if run.log is not None:
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"[:500]
        with contextlib.suppress(TrainwiseError):  # a full disk: the run's error says so already
            run.log.write(record)
    if isinstance(run.log, TrackedLog) and run.log.trackers:
        if status != "failed" and not run.fsdp:  # FSDP's weights are sharded over processes
            from trainwise.run_folder import FINAL_WEIGHTS, RunFolder

            artifacts = [*artifacts, save_weights(run.model, RunFolder(run.run_dir).file(FINAL_WEIGHTS))]
        run.log.finish(status, artifacts)
    if callback_error is not None:
        raise callback_error


def fire_each(callbacks: CallbackList, event: str) -> None:
    """``callbacks.fire(event)`` whose error names the callback that raised it (``trainwise_callback`` on the
    exception: ``"MyCallback.on_fit_end"``)."""
    with callbacks.context():
        for handler in callbacks.handlers[event]:
            try:
                handler(callbacks.state)
            except BaseException as exc:
                owner = getattr(handler, "__self__", None)
                name = (f"{type(owner).__name__}.{event}" if owner is not None
                        else getattr(handler, "__qualname__", "a callback"))
                with contextlib.suppress(AttributeError, TypeError):  # an exception that takes no attribute
                    exc.trainwise_callback = name  # type: ignore[attr-defined]
                raise
    callbacks.state.take_logged()  # nothing is logged after the end record


def latest_checkpoint(run: Run) -> str | None:
    """The newest complete checkpoint of the run (rank 0 lists them; another rank names the step it saved)."""
    if run.manager is not None:
        with contextlib.suppress(OSError, TrainwiseError):
            latest = run.manager.latest()
            return None if latest is None else str(latest)
    step = run.checkpoint_step if run.checkpoint_step >= 0 else run.resumed_step
    return None if step is None else f"the one of step {step} in {run.run_dir}"


def callback_metrics(logged: dict[str, float], record: dict[str, float]) -> dict[str, float]:
    """Metrics logged at ``on_validation_end`` join the epoch's record; a name the record has is refused."""
    for name in logged:
        if name in record:
            raise TrainwiseError(f"a callback logged {name}, which the Trainer already logs this epoch; give your "
                                 "metric another name.")
    return logged


def close_run(run: Run, *, check: bool = False, failing: bool = False) -> None:
    """Finish the last checkpoint write, remove the guards, close the progress display and the log; while
    another error propagates (``failing``), a failed checkpoint write is reported, not raised over it."""
    if failing and not run.ended:
        try:
            end_trackers(run, "failed", artifacts=[], error=sys.exc_info()[1])
        except Exception as exc:  # the error already propagating is the one to see
            if run.progress is not None:
                run.progress.message(f"on_fit_end failed too: {type(exc).__name__}: {exc}")
    try:
        try:
            finish_checkpoint_writes(run.manager)  # the last checkpoint is on disk when fit returns or raises
        except TrainwiseError as exc:
            if not failing:
                raise
            if run.progress is not None:
                run.progress.message(str(exc))
        finally:
            if run.guard_hooks is not None:
                run.guard_hooks.close(check=check)
    finally:
        if run.progress is not None:
            run.progress.close()
        if run.log is not None:
            run.log.close()
