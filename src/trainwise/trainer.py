"""The Trainer: composes the primitives (device, seeding, metrics, accumulation, evaluation); no logic of its own.

Everything it does, a hand-written loop can do with the same public calls; see docs/hand-written-loop.md.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainwise import __version__
from trainwise.accumulation import GradientAccumulator, accumulation_steps
from trainwise.batches import MicroBatch, count_items, forward_micro_batch, is_classification
from trainwise.batches import split_batch as default_split_batch
from trainwise.checkpoint import CheckpointManager, ResumableLoader, find_resume_checkpoint, read_checkpoint
from trainwise.checkpoint.manager import CHECKPOINT_FOLDER, checkpoint_name, verify_checksums
from trainwise.checkpoint.state import restore_checkpoint
from trainwise.config import TrainerConfig, max_workers
from trainwise.device import pin_memory_default, resolve_device, resolve_precision
from trainwise.diagnosis import OverfittingReport, detect_overfitting
from trainwise.distributed import (
    DistributedInfo,
    any_rank,
    barrier,
    broadcast_flag,
    broadcast_object,
    close_distributed,
    global_metric_values,
    init_distributed,
    is_sharded,
    load_sharded,
    local_device,
    save_sharded,
    set_sampler_epoch,
    shard_loader,
    shard_model,
    validation_padding,
    wrap_ddp,
)
from trainwise.early_stopping import EarlyStopping, metric_mode
from trainwise.errors import NonFiniteLossError, TrainwiseError
from trainwise.evaluation import evaluating
from trainwise.freezing import extend_optimizer, param_groups, unfreeze
from trainwise.guards import NonFiniteLossGuard, check_optimizer_covers
from trainwise.metrics import Mean, MetricSet
from trainwise.plots import PLOT_HINT, plot_learning_curves
from trainwise.progress import PlainProgress, make_progress
from trainwise.runlog import RunLock, RunLog, default_run_dir, write_failure
from trainwise.seeding import prepare_loader, seed_everything, seeded_loader

OptimizerArg = torch.optim.Optimizer | Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None


@dataclasses.dataclass
class FitResult:
    """What ``fit`` returns: one record per epoch, where the log is, and why training stopped."""

    history: list[dict[str, float]]
    run_dir: Path
    steps: int  # optimizer steps taken
    seconds: float
    stopped: Literal["completed", "interrupted", "nonfinite"]
    device: str
    precision: str
    message: str = ""
    best_epoch: int | None = None  # by ``monitor``; with early stopping, the epoch whose weights the model has
    best_value: float | None = None
    stopped_early: bool = False
    overfitting: OverfittingReport | None = None
    plot: Path | None = None

    @property
    def last(self) -> dict[str, float]:
        """The last epoch's record (empty if no epoch finished)."""
        return self.history[-1] if self.history else {}


class Trainer:
    """A small training loop with the fundamentals right by default.

    >>> result = Trainer(epochs=5, lr=1e-3, batch_size=64).fit(model, train_set, val_set)
    >>> result.last["val_accuracy"]

    ``optimizer`` is an optimizer instance or a factory called with the trainable parameters (default:
    AdamW with ``lr`` and ``weight_decay``); ``scheduler`` an instance or a factory called with the
    optimizer, stepped once per optimizer step (``ReduceLROnPlateau`` once per epoch on the validation
    loss); ``loss_fn(outputs, targets)`` defaults to cross-entropy; ``split_batch(batch)`` returns
    ``(inputs, targets)``. The plain-valued options are those of :class:`TrainerConfig`.
    """

    def __init__(
        self,
        *,
        epochs: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        batch_size: int = 32,
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
        plot: bool = True,
        resume: str | None = None,
        checkpoint_every: int | None = None,
        keep_last: int = 2,
        checkpoints: bool = True,
        distributed: Literal["auto", "ddp", "fsdp", "off"] = "auto",
        dist_timeout: float = 300.0,
        optimizer: OptimizerArg = None,
        scheduler: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
    ) -> None:
        options = {k: v for k, v in locals().items() if k in TrainerConfig.option_names()}
        options["run_dir"] = None if run_dir is None else str(run_dir)
        self.config = TrainerConfig(**options)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn  # None: the model's own loss when it returns one, else cross-entropy
        self.split_batch = split_batch if split_batch is not None else default_split_batch
        self._dist = DistributedInfo()  # set by fit() under torchrun

    @classmethod
    def from_config(cls, config: TrainerConfig, **objects: Any) -> Trainer:
        """A Trainer from a :class:`TrainerConfig` plus the optimizer/scheduler/loss_fn/split_batch objects."""
        return cls(**config.to_dict(), **objects)

    # -- building blocks -------------------------------------------------------------------------------

    def _optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise TrainwiseError(
                "the model has no trainable parameters; unfreeze some (requires_grad=True) before fit()."
            )
        opt = self.optimizer
        groups = param_groups(model, lr_by_pattern=self.config.lr_by_pattern)  # trainable only
        if opt is None:
            opt = torch.optim.AdamW(groups, lr=self.config.lr, weight_decay=self.config.weight_decay)
        elif not isinstance(opt, torch.optim.Optimizer):
            if not callable(opt):
                raise TrainwiseError(
                    f"optimizer must be a torch optimizer or a factory of one, got {type(opt).__name__}."
                )
            _check_factory_signature(
                "optimizer", opt, "the parameter groups", "lambda params: torch.optim.SGD(params, lr=0.1)"
            )
            opt = opt(groups)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TrainwiseError(
                    f"the optimizer factory returned a {type(opt).__name__}, not a torch optimizer."
                )
        check_optimizer_covers(model, opt)
        return opt

    def _scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        sched = self.scheduler
        if sched is None or hasattr(sched, "step"):
            return sched
        if callable(sched):
            _check_factory_signature(
                "scheduler", sched, "the optimizer", "lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=10)"
            )
            return sched(optimizer)
        raise TrainwiseError(f"scheduler must be a scheduler or a factory of one, got {type(sched).__name__}.")

    def _loader(self, data: Any, *, train: bool, device: torch.device) -> Iterable[Any]:
        loader = self._local_loader(data, train=train, device=device)
        if self._dist.enabled and isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
            # this process's shard, every sample on one process; training pads with zero-row batches (see shard_loader)
            loader = shard_loader(loader, train=train, seed=self.config.seed)
        return loader

    def _local_loader(self, data: Any, *, train: bool, device: torch.device) -> Iterable[Any]:
        cfg = self.config
        if isinstance(data, DataLoader):
            if isinstance(data.dataset, IterableDataset):  # no sampler to seed: the stream's order is its own
                return data
            return prepare_loader(data, seed=cfg.seed) if train else data
        if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
            if _length(data) == 0:
                what = "training" if train else "validation"
                fix = "pass val_data=None to train without validation" if not train else "check the data"
                raise TrainwiseError(f"the {what} data set is empty (0 samples); {fix}.")
            return seeded_loader(
                data,
                batch_size=cfg.batch_size if train else (cfg.eval_batch_size or cfg.batch_size),
                seed=cfg.seed,
                shuffle=train,
                num_workers=cfg.num_workers,
                pin_memory=pin_memory_default(device),
            )
        if isinstance(data, IterableDataset):
            if cfg.num_workers:
                raise TrainwiseError(
                    f"num_workers={cfg.num_workers} would give every loader worker the whole IterableDataset "
                    f"({type(data).__name__}), so each sample would count {cfg.num_workers} times; shard it in "
                    "__iter__ by torch.utils.data.get_worker_info() and pass your own DataLoader, or use "
                    "num_workers=0."
                )
            return DataLoader(
                data,
                batch_size=cfg.batch_size if train else (cfg.eval_batch_size or cfg.batch_size),
                pin_memory=pin_memory_default(device),
            )
        if isinstance(data, Iterable):
            if iter(data) is data and train and cfg.epochs > 1:  # a generator, a file handle, iter(list)
                raise TrainwiseError(
                    f"the training data is an iterator ({type(data).__name__}), which is used up after one epoch; "
                    "pass a list of batches, a Dataset or a DataLoader for several epochs."
                )
            return data
        raise TrainwiseError(
            f"training data must be a Dataset, a DataLoader or an iterable of batches, got {type(data).__name__}."
        )

    def _accumulation_steps(self, loader: Any) -> int:
        """From ``accumulation_steps``, or ``effective_batch`` over the loader's real batch size (a batch of
        ready-made batches, or of a batch sampler, is looked at: its sample count is the micro-batch)."""
        cfg = self.config
        if cfg.accumulation_steps is not None:
            return cfg.accumulation_steps
        if cfg.effective_batch is None:
            return 1
        batches = getattr(loader, "batch_sampler", None)  # under DDP a ShardedBatchSampler knows its batch size
        micro = getattr(loader, "batch_size", None) or getattr(batches, "batch_size", None)
        if not isinstance(loader.loader if isinstance(loader, ResumableLoader) else loader, DataLoader):
            micro = None  # ready-made batches: their own size, not the batch_size option
        if micro is None:
            micro = _first_batch_size(loader, self.split_batch)
        return accumulation_steps(cfg.effective_batch, micro)

    # -- the loop ------------------------------------------------------------------------------------

    def fit(self, model: torch.nn.Module, train_data: Any, val_data: Any = None) -> FitResult:
        """Train ``model`` on ``train_data`` (Dataset, DataLoader or iterable of batches), validating each epoch."""
        if not isinstance(model, torch.nn.Module):
            raise TrainwiseError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        determinism = _determinism_flags()
        self._lock = RunLock(".")  # replaced by the run folder's lock once it is known
        try:
            return self._fit(model, train_data, val_data)
        finally:
            self._lock.release()  # the run folder is free for the next writer
            _restore_determinism(determinism)  # deterministic=True holds for this fit only
            close_distributed(self._dist)  # only a process group this fit created
            self._dist = DistributedInfo()

    def _fit(self, model: torch.nn.Module, train_data: Any, val_data: Any) -> FitResult:
        cfg = self.config
        started = time.perf_counter()
        seed_everything(cfg.seed, deterministic=cfg.deterministic)
        device = resolve_device(cfg.device).device
        if cfg.distributed != "off":  # under torchrun: join the process group (a no-op for one process)
            self._dist = dist_info = init_distributed(local_device(device), timeout=cfg.dist_timeout)
            if dist_info.enabled:
                device = local_device(device)
        dist_info = self._dist
        sharded = dist_info.enabled and cfg.distributed == "fsdp"
        if dist_info.enabled and cfg.unfreeze_at:
            # DDP and FSDP fix the set of trainable parameters when they wrap the model
            raise TrainwiseError(
                "unfreeze_at is not supported with several processes; run each unfreezing phase as its own fit()."
            )
        precision = resolve_precision(cfg.precision, device)
        model.to(device)
        if sharded:
            shard_model(model)  # FSDP2, in place, before the optimizer sees the parameters
        optimizer = self._optimizer(model)
        scheduler = self._scheduler(optimizer)
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        train_loader = ResumableLoader(self._loader(train_data, train=True, device=device))
        val_loader = None if val_data is None else self._loader(val_data, train=False, device=device)
        _check_data(train_loader, "training")
        if val_loader is not None:
            _check_data(val_loader, "validation")
        accumulator = GradientAccumulator(
            optimizer,
            steps=self._accumulation_steps(train_loader),
            scheduler=None if plateau else scheduler,
            scaler=precision.make_scaler(),
            max_grad_norm=cfg.max_grad_norm,
            skip_nonfinite=cfg.nonfinite == "skip",
            distributed=dist_info.enabled,
        )
        forward_model = torch.compile(model) if cfg.compile else model
        eval_model = forward_model
        if dist_info.enabled and not sharded:
            # DDP for training; validation runs on the module itself (no per-batch collective, so the
            # unequal eval shards cannot hang), and its metrics are summed over processes at the end
            wrapped = wrap_ddp(model, device)
            forward_model = torch.compile(wrapped) if cfg.compile else wrapped
        run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir()
        if dist_info.enabled:
            run_dir = Path(broadcast_object(str(run_dir)))  # rank 0's clock names the run
        self._lock = _lock_run_dir(run_dir, dist_info)  # one writer per run folder; checks it is writable
        log = RunLog(run_dir) if dist_info.is_main else _NullLog(run_dir)  # only rank 0 writes
        log.write({"kind": "start", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resume": cfg.resume})
        log.write_json(
            "config.json",
            {
                "trainer": cfg.to_dict(),
                "device": str(device),
                "precision": precision.name,
                "precision_reason": precision.reason,
                "trainwise": __version__,
                "torch": torch.__version__,
            },
        )
        progress = make_progress(cfg.progress if dist_info.is_main else "off")
        stopper = None
        if cfg.patience is not None:
            keep = cfg.keep_best if dist_info.is_main else "memory"  # one writer of the best-weights file
            stopper = EarlyStopping(
                cfg.monitor,
                mode=cfg.mode,
                patience=cfg.patience,
                min_delta=cfg.min_delta,
                keep=keep,
                path=run_dir / "best-weights.pt" if keep == "disk" else None,
            )
        state = _LoopState(
            device=device,
            metrics=MetricSet(device),
            guard=NonFiniteLossGuard(device, model=model if cfg.nonfinite == "stop" else None),
            accumulator=accumulator,
            log=log,
            progress=progress,
            window_loss=Mean(device) if cfg.nonfinite == "skip" else None,
        )
        # Everything a checkpoint holds; restored in place on resume (plain values come back in "loop").
        resumable = {"model": model, "optimizer": optimizer, "accumulator": accumulator, "loader": train_loader,
                     "metrics": state.metrics, "loop": state.loop}
        for name, item in (("scheduler", scheduler), ("scaler", accumulator.scaler), ("early_stopping", stopper)):
            if item is not None:
                resumable[name] = item
        state.resumable = resumable
        state.dist = dist_info
        if cfg.checkpoints and dist_info.is_main:
            state.manager = CheckpointManager(run_dir, keep_last=cfg.keep_last, monitor=cfg.monitor,
                                              mode=metric_mode(cfg.monitor) if cfg.mode == "auto" else cfg.mode)
        found = _read_resume_checkpoint(cfg.resume, run_dir, progress, log, dist_info)
        if found is not None:
            resume_from, checkpoint = found
            saved = checkpoint["state"]
            # the optimizer must have the groups it had when saved: redo the unfreezing done by then
            mid_epoch = bool(saved.get("loader", {}).get("batches_done"))
            for epoch in sorted(cfg.unfreeze_at or {}):
                if epoch < saved["loop"]["epoch"] or (mid_epoch and epoch == saved["loop"]["epoch"]):
                    unfreeze(model, *cfg.unfreeze_at[epoch])  # type: ignore[index]
                    extend_optimizer(optimizer, model, lr_by_pattern=cfg.lr_by_pattern, scheduler=scheduler)
            if "sharded" in saved:  # FSDP: model and optimizer come from the sharded folder beside the file
                from trainwise.checkpoint.dcp import sharded_folder

                # only a plain sharded-stepN folder beside the file, and only on an FSDP run (issue 10)
                folder = sharded_folder(resume_from, saved["sharded"], fsdp=sharded)
                load_sharded(folder, resumable["model"], resumable["optimizer"])  # collective
                rest = {**_without_model(resumable), "sharded": None}
                restore_checkpoint(checkpoint, rest)  # plain values (the loop state) come back in `rest`
                resumable.update({k: v for k, v in rest.items() if k != "sharded"})
            else:
                restore_checkpoint(checkpoint, resumable)  # in place; the RNG states last
            if not dist_info.is_main:
                state.metrics.reset()  # the checkpoint holds the sums over all processes: rank 0 carries them
            state.loop = resumable["loop"]
            progress.message(
                f"resumed from {resume_from} at epoch {state.loop['epoch']}, step {accumulator.optimizer_steps}"
                + (f" ({train_loader.resume_offset} batches into the epoch)." if train_loader.resume_offset else ".")
            )
            log.write({"kind": "resumed", "checkpoint": str(resume_from), "epoch": state.loop["epoch"],
                       "step": accumulator.optimizer_steps})
        if state.guard.model is not None:
            state.guard.keep(accumulator.optimizer_steps)  # a NaN before the first check returns the model here
        history: list[dict[str, float]] = state.loop["history"]
        outcome = _Outcome(overfitting=_overfitting_from(state.loop))
        threads = _cpu_threads_beside_workers(device, train_loader)
        try:
            for epoch in range(state.loop["epoch"], cfg.epochs + 1):
                state.loop["epoch"] = epoch
                epoch_started = time.perf_counter()
                if not train_loader.resume_offset:  # a resumed epoch already unfroze what it had to
                    self._unfreeze_scheduled(epoch, model, optimizer, scheduler, progress, log)
                record: dict[str, float] = {"epoch": epoch}
                set_sampler_epoch(train_loader, epoch)  # a new shuffle each epoch, the same on every rank
                train_values = self._train_epoch(model, forward_model, train_loader, precision, state, epoch)
                record.update({f"train_{k}": v for k, v in train_values.items()})
                if val_loader is not None:
                    val_values = self.validate(eval_model, val_loader, precision=precision, device=device)
                    record.update({f"val_{k}": v for k, v in val_values.items()})
                if plateau:
                    scheduler.step(record.get("val_loss", record["train_loss"]))
                record["lr"] = optimizer.param_groups[0]["lr"]
                record["step"] = accumulator.optimizer_steps
                record["seconds"] = time.perf_counter() - epoch_started
                history.append(record)
                log.write({"kind": "epoch", **record})
                progress.end_epoch(epoch, cfg.epochs, {k: v for k, v in record.items() if k != "epoch"})
                if cfg.diagnose and outcome.overfitting is None:
                    outcome.overfitting = detect_overfitting(history)
                    if outcome.overfitting is not None:
                        progress.message(outcome.overfitting.message())
                        state.loop["overfitting"] = dataclasses.asdict(outcome.overfitting)
                        log.write({"kind": "overfitting", **state.loop["overfitting"]})
                stop = stopper is not None and stopper.update(epoch, record, model)
                if dist_info.enabled:
                    stop = broadcast_flag(stop, device=device)  # rank 0 decides; every rank stops together
                state.loop["epoch"] = epoch + 1
                self._checkpoint(state, metric=record.get(cfg.monitor))
                if stop:
                    outcome.stopped_early = True
                    progress.message(
                        f"early stopping at epoch {epoch}: {cfg.monitor} has not improved for "
                        f"{stopper.bad_epochs} epochs (best {stopper.best_value:.6g} at epoch {stopper.best_epoch})."
                    )
                    break
        except KeyboardInterrupt:
            outcome.stopped = "interrupted"
            outcome.message = (
                f"interrupted at step {accumulator.optimizer_steps}; {len(history)} epoch(s) finished and "
                f"everything logged so far is in {log.path}."
            )
            log.write({"kind": "interrupted", "step": accumulator.optimizer_steps})
            progress.message(outcome.message)
        except NonFiniteLossError as exc:
            outcome.stopped = "nonfinite"
            outcome.message = str(exc)
            log.write({"kind": "nonfinite", "step": exc.step, "message": outcome.message})
            exc.result = self._finish(  # type: ignore[attr-defined]
                model, history, run_dir, accumulator, started, device, precision, outcome, None, progress
            )
            _close(progress, log)
            raise
        except BaseException:
            _close(progress, log)
            raise
        finally:
            if threads is not None:
                torch.set_num_threads(threads)
        result = self._finish(
            model, history, run_dir, accumulator, started, device, precision, outcome, stopper, progress
        )
        _close(progress, log)
        return result

    def _unfreeze_scheduled(self, epoch, model, optimizer, scheduler, progress, log) -> None:
        patterns = (self.config.unfreeze_at or {}).get(epoch)
        if not patterns:
            return
        unfreeze(model, *patterns)
        added = extend_optimizer(optimizer, model, lr_by_pattern=self.config.lr_by_pattern, scheduler=scheduler)
        progress.message(f"epoch {epoch}: unfroze {', '.join(patterns)} ({len(added)} parameter tensors added)")
        log.write({"kind": "unfreeze", "epoch": epoch, "patterns": list(patterns), "parameters": added})

    def _finish(
        self, model, history, run_dir, accumulator, started, device, precision, outcome, stopper, progress
    ) -> FitResult:
        """Restore the best weights (early stopping), find the best epoch, draw the curves, build the result."""
        cfg = self.config
        best_epoch = best_value = None
        if stopper is not None and stopper.best_epoch is not None:
            best_epoch, best_value = stopper.best_epoch, stopper.best_value
            if stopper.restore(model) is not None and best_epoch != len(history):
                progress.message(f"restored the weights of epoch {best_epoch} ({cfg.monitor} {best_value:.6g}).")
        elif history:
            best_epoch, best_value = _best(history, cfg.monitor, cfg.mode)
        plot_path = None
        if cfg.plot and history and self._dist.is_main:
            try:
                plot_path = plot_learning_curves(
                    history,
                    run_dir / "learning_curves.png",
                    monitor=cfg.monitor,
                    best_epoch=best_epoch,
                    overfitting_epoch=outcome.overfitting.onset_epoch if outcome.overfitting else None,
                )
            except ImportError:
                progress.message(PLOT_HINT)
        return FitResult(
            history=history,
            run_dir=run_dir,
            steps=accumulator.optimizer_steps,
            seconds=time.perf_counter() - started,
            stopped=outcome.stopped,
            device=str(device),
            precision=precision.name,
            message=outcome.message,
            best_epoch=best_epoch,
            best_value=best_value,
            stopped_early=outcome.stopped_early,
            overfitting=outcome.overfitting,
            plot=plot_path,
        )

    def _train_epoch(
        self,
        model: torch.nn.Module,
        forward_model: torch.nn.Module,
        loader: Any,
        precision: Any,
        state: _LoopState,
        epoch: int,
    ) -> dict[str, float]:
        cfg = self.config
        model.train()
        accumulator, metrics, guard = state.accumulator, state.metrics, state.guard
        start = getattr(loader, "resume_offset", 0)  # batches of this epoch trained before a resume
        if not start:
            metrics.reset()
        num_batches = _length(loader)
        if num_batches == 0:
            raise TrainwiseError(
                "the training data yields no batches; use a smaller batch_size or drop_last=False."
            )
        state.progress.start_epoch(epoch, cfg.epochs, num_batches)
        if start:
            state.progress.advance(start)
        loss_metric = metrics.mean("loss")
        # with nonfinite="skip" a window's losses count only once its step is taken (see _optimizer_step)
        window_metric = state.window_loss if state.window_loss is not None else loss_metric
        limit, seen = _stream_limit(loader), 0  # a sized stream under workers: each sample once, checked
        for batch, last_batch in loader.with_last():  # the last batch is known without len()
            last = accumulator.ends_window(last=last_batch)
            with accumulator.sync_context(forward_model, last=last):
                micro = self._forward(forward_model, batch, precision, state.device)
                if limit is not None:
                    seen = _check_stream(loader, limit, seen + count_items(micro.targets))
                if micro.loss is None:  # no counted item (every token ignored): no gradient, no loss value
                    accumulator.backward_empty(micro.outputs)
                else:
                    accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)
            window_metric.update_loss(micro.loss, micro.count, micro.reduction)
            self._update_accuracy(metrics, micro, state.loop)
            if cfg.nonfinite == "stop" and micro.loss is not None:
                guard.observe(micro.loss, accumulator.optimizer_steps + 1)
            del micro  # no graph may outlive its step
            if last:
                self._optimizer_step(state, epoch)
            state.progress.advance()
        if accumulator.micro_batches:  # an iterable without len(): its last window is short
            self._optimizer_step(state, epoch)
        if not getattr(loader, "batches_done", 1):
            raise TrainwiseError(
                f"the training data yielded no batches in epoch {epoch}; pass data that yields batches every "
                "epoch (an iterator is used up after one)."
            )
        if cfg.nonfinite == "stop":
            _check_finite(state)
        return global_metric_values(metrics)  # sums over every process (one all-reduce)

    def _forward(self, model: torch.nn.Module, batch: Any, precision: Any, device: torch.device) -> MicroBatch:
        cfg = self.config
        return forward_micro_batch(
            model, batch, device=device, split=self.split_batch, loss_fn=self.loss_fn, count=cfg.count,
            ignore_index=cfg.ignore_index, reduction=cfg.loss_reduction, autocast=precision.autocast,
        )

    def _update_accuracy(self, metrics: MetricSet, micro: MicroBatch, decided: dict[str, Any]) -> None:
        """Count correct predictions once the first batch has shown that outputs are class logits."""
        cfg = self.config
        if decided["accuracy"] is None:
            decided["accuracy"] = cfg.accuracy == "on" or (
                cfg.accuracy == "auto" and is_classification(micro.outputs, micro.targets, per_sample=micro.model_loss)
            )
        if decided["accuracy"]:
            metrics.accuracy("accuracy", ignore_index=cfg.ignore_index).update(micro.outputs, micro.targets)

    def _optimizer_step(self, state: _LoopState, epoch: int) -> None:
        cfg, accumulator = self.config, state.accumulator
        stepped = accumulator.step()
        if state.window_loss is not None:  # nonfinite="skip": a skipped step's losses are not averaged in
            if stepped:
                state.metrics.mean("loss").update_sum(*state.window_loss.fold())
            state.window_loss.reset()
        if accumulator.windows % cfg.log_every == 0:
            if cfg.nonfinite == "stop":
                _check_finite(state)
            values = global_metric_values(state.metrics)  # one host sync (and all-reduce) per log interval
            state.progress.show(values)
            lr = accumulator.optimizer.param_groups[0]["lr"]
            state.log.write({"kind": "train", "epoch": epoch, "step": accumulator.optimizer_steps, **values, "lr": lr})
        if cfg.checkpoint_every and accumulator.windows % cfg.checkpoint_every == 0:
            self._checkpoint(state)

    def _checkpoint(self, state: _LoopState, *, metric: float | None = None) -> None:
        """Save the full state at an optimizer-step boundary, never after a non-finite loss."""
        if not self.config.checkpoints:
            return
        if self.config.nonfinite == "stop":
            _check_finite(state)
        resumable = state.resumable
        step = state.accumulator.optimizer_steps
        if state.dist.enabled:
            # the running metrics summed over processes, so that a resume (rank 0 loads them) stays exact
            reduced = MetricSet(state.device)
            reduced.load_state_dict(state.metrics.state_dict())
            reduced.all_reduce()
            resumable = {**resumable, "metrics": reduced}
            if is_sharded(resumable["model"]):
                # FSDP: every rank writes its shards of the model and optimizer (torch.distributed.checkpoint);
                # rank 0 writes the rest beside them in the usual checkpoint file, which names the folder
                folder = f"sharded-step{step:09d}"
                save_sharded(state.log.run_dir / "checkpoints" / folder, resumable["model"], resumable["optimizer"])
                resumable = {**_without_model(resumable), "sharded": folder}
        if state.manager is not None:  # rank 0 only, from the unwrapped module
            try:
                state.manager.save(resumable, step=step, metric=metric, config=self.config.to_dict())
            except OSError as exc:  # a full disk, a file size limit, a folder made read-only during the run
                raise TrainwiseError(_checkpoint_write_failure(state.manager, step, exc)) from None
            if "sharded" in resumable:
                _prune_sharded(state.manager)
        barrier()  # nobody goes on (or reads it) before the checkpoint is complete

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
        metrics = MetricSet(device)
        loss_metric = metrics.mean("loss")
        decided: dict[str, Any] = {"accuracy": None}
        # FSDP gathers parameters in every forward, so every process must run as many forwards: a process
        # with a shorter validation shard repeats its last batch and discards the result.
        padding = validation_padding(model, loader, device)
        last_batch = None
        with evaluating(model):
            for batch in loader:
                micro = self._forward(model, batch, precision, device)
                last_batch = batch
                loss_metric.update_loss(micro.loss, micro.count, micro.reduction)
                self._update_accuracy(metrics, micro, decided)
            for _ in range(padding):
                if last_batch is None:
                    raise TrainwiseError(
                        "a process got no validation batch under FSDP; use a validation set with at least as "
                        "many batches as processes."
                    )
                self._forward(model, last_batch, precision, device)
        use_accuracy = decided["accuracy"]
        with torch.inference_mode():  # metrics made inside evaluating() hold inference tensors
            if self._dist.enabled and any_rank(bool(use_accuracy), device=device):
                metrics.accuracy("accuracy", ignore_index=cfg.ignore_index)  # the same metrics on every process
            metrics.all_reduce()
        return metrics.compute()


def _check_factory_signature(what: str, factory: Callable[..., Any], takes: str, example: str) -> None:
    """Refuse an optimizer/scheduler factory that cannot be called with one argument, before it is called."""
    import inspect

    try:
        inspect.signature(factory).bind(None)
    except TypeError:
        name = getattr(factory, "__name__", type(factory).__name__)
        raise TrainwiseError(
            f"the {what} factory {name}{inspect.signature(factory)} must take one argument, {takes}, "
            f"like {example}."
        ) from None
    except ValueError:  # a builtin without a signature: the call itself will tell
        pass


def _check_data(loader: Any, what: str) -> None:
    """Refuse empty data, and more loader workers than the machine can run, before anything is written."""
    workers = getattr(loader, "num_workers", 0)
    if isinstance(workers, int) and workers > max_workers():
        raise TrainwiseError(
            f"the {what} DataLoader has num_workers={workers}, more than {max_workers()} (4 per CPU core here, "
            "at least 8): each worker is a process holding a copy of the dataset, so use fewer."
        )
    batches = _length(loader)
    if batches is None:  # an iterable without a length: checked when its first epoch yields nothing
        return
    if batches == 0:
        dataset = getattr(loader, "dataset", None)
        size = _length(dataset)
        if dataset is None:
            raise TrainwiseError(f"the {what} data yields no batches; check the data.")
        if size == 0:
            fix = "pass val_data=None to train without validation" if what == "validation" else "check the data"
            raise TrainwiseError(f"the {what} data set is empty (0 samples); {fix}.")
        raise TrainwiseError(
            f"the {what} data yields no batches ({size} samples with drop_last=True and a larger batch size); "
            "use a smaller batch_size or drop_last=False."
        )


def _first_batch_size(loader: Any, split: Callable[[Any], tuple[Any, Any]]) -> int:
    """The number of samples in the loader's first batch (for effective_batch with ready-made batches)."""
    inner = loader.loader if isinstance(loader, ResumableLoader) else loader
    if iter(inner) is inner:
        raise TrainwiseError(
            "effective_batch needs the batch size, which an iterator of batches cannot show without using up a "
            "batch; pass accumulation_steps=N instead."
        )
    for batch in inner:
        return int(count_items(split(batch)[1]))
    raise TrainwiseError("the training data yields no batches; check the data.")


def _length(data: Any) -> int | None:
    """``len(data)``, or None for data without a length (a DataLoader over an unsized IterableDataset raises)."""
    try:
        return len(data)
    except TypeError:
        return None


def _stream_limit(loader: Any) -> int | None:
    """The sample count a worker-loaded, sized IterableDataset must not exceed in one epoch (else None)."""
    inner = getattr(loader, "loader", loader)
    dataset = getattr(inner, "dataset", None)
    if not isinstance(inner, DataLoader) or not isinstance(dataset, IterableDataset) or not inner.num_workers:
        return None
    return _length(dataset)


def _check_stream(loader: Any, limit: int, seen: int) -> int:
    if seen > limit:
        raise TrainwiseError(
            f"the training stream yielded more samples than its length ({limit}): with num_workers="
            f"{loader.num_workers} every worker replays the whole IterableDataset; shard it in __iter__ by "
            "torch.utils.data.get_worker_info()."
        )
    return seen


def _lock_run_dir(run_dir: Path, dist_info: DistributedInfo) -> RunLock:
    """Rank 0 locks the run folder; every process raises the same one-sentence error if it cannot."""
    lock = RunLock(run_dir)
    problem = None
    if dist_info.is_main:
        try:
            lock.acquire()
        except TrainwiseError as exc:
            problem = str(exc)
    if dist_info.enabled:
        problem = broadcast_object(problem)
    if problem is not None:
        lock.release()
        raise TrainwiseError(problem)
    return lock


def _read_resume_checkpoint(
    resume: Any, run_dir: Path, progress: PlainProgress, log: Any, dist_info: DistributedInfo
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from, read. Under several processes rank 0 chooses it and every process reads
    that same file: a node that cannot see it (no shared file system) stops every process with one sentence,
    instead of one process starting from scratch while the others resume."""
    if not dist_info.enabled:
        return _choose_resume_checkpoint(resume, run_dir, progress, log)
    found, problem = None, None
    if dist_info.is_main:
        try:
            found = _choose_resume_checkpoint(resume, run_dir, progress, log)
        except TrainwiseError as exc:
            problem = str(exc)
    chosen, problem = broadcast_object((None if found is None else str(found[0]), problem))
    if chosen is not None and not dist_info.is_main:
        try:
            found = Path(chosen), read_checkpoint(chosen)
        except TrainwiseError as exc:
            problem = (
                f"process {dist_info.rank} cannot read {chosen}, the checkpoint process 0 resumes from ({exc}); "
                "put the run folder on a file system every node shares."
            )
    problem = _first_problem(problem)
    if problem is not None:
        raise TrainwiseError(problem)
    return found


def _first_problem(problem: str | None) -> str | None:
    """The first process's problem, on every process (one all_gather), so that all stop together."""
    import torch.distributed as dist

    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p is not None), None)


def _choose_resume_checkpoint(
    resume: Any, run_dir: Path, progress: PlainProgress, log: Any
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from, read; with ``"auto"`` or a folder, damaged newer files are skipped (said)."""
    path = find_resume_checkpoint(resume, run_dir)
    if path is None:
        return None
    if resume != "auto" and not Path(resume).is_dir():  # an explicit file: that one or an error
        verify_checksums(path)
        return path, read_checkpoint(path)
    found = CheckpointManager(path.parent.parent).read_latest() if path.parent.name == CHECKPOINT_FOLDER else None
    if found is None:
        raise TrainwiseError(f"no intact checkpoint in {path.parent}; start without resume or pass another file.")
    chosen, checkpoint, skipped = found
    for reason in skipped:
        progress.message(f"{reason} Resuming from the previous good checkpoint, {chosen}.")
        log.write({"kind": "damaged_checkpoint", "reason": reason, "using": str(chosen)})
    return chosen, checkpoint


def _checkpoint_write_failure(manager: CheckpointManager, step: int, exc: OSError) -> str:
    latest = manager.latest()
    good = f"the latest good checkpoint is {latest}" if latest is not None else "no checkpoint was written before"
    return f"{write_failure(manager.folder / checkpoint_name(step), exc)} at step {step}; {good}."


def _without_model(resumable: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint entries an FSDP run keeps in the plain file (model and optimizer are sharded)."""
    return {k: v for k, v in resumable.items() if k not in ("model", "optimizer")}


def _prune_sharded(manager: CheckpointManager) -> None:
    """Delete sharded folders whose checkpoint file the manager no longer keeps (rank 0)."""
    import shutil

    kept = {path.name.removeprefix("ckpt-").removesuffix(".pt") for path in manager.checkpoints()}
    for folder in manager.folder.glob("sharded-step*"):
        if folder.is_dir() and folder.name.removeprefix("sharded-") not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def _check_finite(state: _LoopState) -> None:
    """Raise NonFiniteLossError on every process when any process saw a NaN/inf loss (decided together)."""
    step = state.accumulator.optimizer_steps
    if not state.dist.enabled:
        state.guard.check(step)
        return
    try:
        state.guard.check(step)
        found = None
    except NonFiniteLossError as exc:
        found = exc
    if any_rank(found is not None, device=state.device):
        raise found or NonFiniteLossError(
            state.guard.restore_and_explain("the training loss became non-finite on another process"),
            step=step + 1,
        )


class _NullLog:
    """The run log of a process other than rank 0: same calls, nothing written."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"

    def write(self, record: dict[str, Any]) -> None:
        pass

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        return self.run_dir / name

    def close(self) -> None:
        pass


def _close(progress: PlainProgress, log: RunLog) -> None:
    progress.close()
    log.close()


@dataclasses.dataclass
class _Outcome:
    stopped: Literal["completed", "interrupted", "nonfinite"] = "completed"
    message: str = ""
    stopped_early: bool = False
    overfitting: OverfittingReport | None = None


def _best(history: list[dict[str, Any]], monitor: str, mode: str) -> tuple[int | None, float | None]:
    scored = [(r[monitor], r["epoch"]) for r in history if isinstance(r.get(monitor), (int, float))]
    if not scored:
        return None, None
    direction = metric_mode(monitor) if mode == "auto" else mode
    value, epoch = (min if direction == "min" else max)(scored, key=lambda pair: pair[0])
    return epoch, value


@dataclasses.dataclass
class _LoopState:
    """What one ``fit`` carries between epochs and steps; ``loop`` holds the plain values a checkpoint saves."""

    device: torch.device
    metrics: MetricSet
    guard: NonFiniteLossGuard
    accumulator: GradientAccumulator
    log: RunLog
    progress: PlainProgress
    manager: CheckpointManager | None = None
    window_loss: Mean | None = None  # nonfinite="skip": the current window's loss, added once its step is taken
    dist: DistributedInfo = dataclasses.field(default_factory=DistributedInfo)
    resumable: dict[str, Any] = dataclasses.field(default_factory=dict)
    loop: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"epoch": 1, "history": [], "accuracy": None, "overfitting": None}
    )


def _overfitting_from(loop: dict[str, Any]) -> OverfittingReport | None:
    saved = loop.get("overfitting")
    return OverfittingReport(**saved) if saved else None


def _cpu_threads_beside_workers(device: torch.device, loader: Any) -> int | None:
    """On CPU, leave one core per DataLoader worker; returns the thread count to restore, if changed.

    OpenMP threads spin while they wait: with as many compute threads as cores, workers starve and a
    2-core machine trains about 15 times slower with 2 workers than with none (measured on the demo).
    """
    workers = getattr(loader, "num_workers", 0)
    if device.type != "cpu" or workers == 0:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    before = torch.get_num_threads()
    wanted = max(1, min(before, cores - workers))
    if wanted == before:
        return None
    torch.set_num_threads(wanted)
    return before


def _determinism_flags() -> tuple[bool, bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


def _restore_determinism(flags: tuple[bool, bool, bool]) -> None:
    torch.use_deterministic_algorithms(flags[0])
    torch.backends.cudnn.deterministic = flags[1]
    torch.backends.cudnn.benchmark = flags[2]
