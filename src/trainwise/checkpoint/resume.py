"""What a training checkpoint holds, as a typed object (:class:`RunState`: model, optimizer, scheduler, scaler,
accumulator, loader, metrics, the loop's counters and early stopping), and resuming it: the checkpoint
``resume`` names, compared with this run's configuration, restored into the live objects in place.

    >>> state = RunState(model=model, optimizer=optimizer, accumulator=accumulator, loader=loader, metrics=metrics)
    >>> step = resume(state, "auto", folder, config=config, facts=facts)    # None: nothing to resume
    >>> save_training_checkpoint(manager, state.entries(), step=state.accumulator.optimizer_steps)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainwise.checkpoint.compat import check_resume, describe, resume_changes
from trainwise.checkpoint.training import read_resume_checkpoint, restore_training_checkpoint
from trainwise.progress import plural


@dataclasses.dataclass
class LoopCounters:
    """The loop's plain values, saved as a checkpoint's ``loop`` entry and restored in place."""

    epoch: int = 1  # the epoch training is in (or last was in); in a checkpoint, the one a resume starts in
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one record per finished epoch
    accuracy: bool | None = None  # whether outputs are class logits: decided by the first batch
    overfitting: dict[str, Any] | None = None  # the overfitting report, once there is one
    threads: int | None = None  # the intra-op threads the run computes with (float sums depend on them)
    micro_batch: int | None = None  # batch_size="auto": the micro-batch size that fitted
    stopped_early: bool = False  # a resumed run that had stopped stays stopped

    def state_dict(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def next_epoch(self) -> LoopCounters:
        """These counters as a checkpoint written at an epoch's end records them: in the next epoch, where a
        resume of it starts (the history and the rest shared, not copied)."""
        return dataclasses.replace(self, epoch=self.epoch + 1)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """A checkpoint's ``loop`` entry; one from an older trainwise may lack the newer counters."""
        for field in dataclasses.fields(self):
            if field.name in saved:
                setattr(self, field.name, saved[field.name])
        self.epoch = int(self.epoch)


@dataclasses.dataclass(eq=False)
class RunState:
    """Everything a training checkpoint holds, each object restored in place on resume."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    accumulator: Any  # GradientAccumulator: optimizer steps taken, the DDP reference count
    loader: Any  # ResumableLoader: the epoch's order and the batches already trained
    metrics: Any  # MetricSet: the epoch's running sums
    counters: LoopCounters = dataclasses.field(default_factory=LoopCounters)
    scheduler: Any = None
    early_stopping: Any = None  # EarlyStopping: the best value and weights so far

    def entries(self) -> dict[str, Any]:
        """The checkpoint's entries by name (as written since the first trainwise: ``loop`` for the counters)."""
        entries = {"model": self.model, "optimizer": self.optimizer, "accumulator": self.accumulator,
                   "loader": self.loader, "metrics": self.metrics, "loop": self.counters}
        for name, item in (("scheduler", self.scheduler), ("scaler", self.accumulator.scaler),
                           ("early_stopping", self.early_stopping)):
            if item is not None:
                entries[name] = item
        return entries


def resume(
    state: RunState,
    resume: Any,
    folder: Any,
    *,
    config: dict[str, Any],
    facts: dict[str, Any],
    mismatch: str = "refuse",
    sharded: bool = False,
    is_main: bool = True,
    before_restore: Callable[[int, bool], None] | None = None,
) -> int | None:
    """Continue from the checkpoint ``resume`` names (``"auto"``, a folder or a file; None: start fresh): its
    configuration and run facts compared with this run's (``mismatch="refuse"`` raises one sentence naming
    each change; ``"allow"`` announces them), ``before_restore(epoch, mid_epoch)`` called first (the unfreezing
    done by then, so the optimizer has its groups), then every object restored in place. ``folder`` is the
    opened :class:`~trainwise.run_folder.RunFolder`, told of damaged newer checkpoints passed over and of the
    resume. Returns the optimizer step resumed from, or None."""

    def skipped(reason: str, chosen: Path) -> None:
        folder.announce("damaged_checkpoint", f"{reason} Resuming from the previous good checkpoint, {chosen}.",
                        reason=reason, using=str(chosen))

    found = read_resume_checkpoint(resume, folder.run_dir, on_skipped=skipped, run_id=folder.log.run_id)
    if found is None:
        return None
    path, checkpoint = found
    saved = checkpoint["state"]
    changes = resume_changes(checkpoint.get("meta", {}).get("config"), config, facts)
    fresh = check_resume(changes, mismatch=mismatch, checkpoint=path)
    if changes:  # resume_mismatch="allow"
        folder.announce("resume_mismatch", describe(changes),
                        changes={k: [str(o), str(n)] for k, (o, n) in changes.items()})
    if before_restore is not None:
        before_restore(int(saved["loop"]["epoch"]), bool(saved.get("loader", {}).get("batches_done")))
    entries = state.entries()
    restoring = {k: v for k, v in entries.items() if k not in fresh}  # what the new run replaced
    restore_training_checkpoint(path, checkpoint, restoring, fsdp=sharded)
    if not is_main:
        state.metrics.reset()  # the checkpoint holds the sums over all processes: rank 0 carries them
    step, offset = state.accumulator.optimizer_steps, state.loader.resume_offset
    folder.announce("resumed", f"resumed from {path} at epoch {state.counters.epoch}, step {step}"
                    + (f" ({plural(offset, 'batch')} into the epoch)." if offset else "."),
                    checkpoint=str(path), epoch=state.counters.epoch, step=step)
    return step


__all__ = ["LoopCounters", "RunState", "resume"]
