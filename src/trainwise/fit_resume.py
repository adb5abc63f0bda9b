"""Resuming a fit: the checkpoint ``resume`` names, checked against this run's configuration, restored into
its objects in place (with the unfreezing it had done replayed first, so the optimizer has its groups); only
then is the run folder written (config.json, the start record), so a refused resume changes no file."""

from __future__ import annotations

from pathlib import Path

from trainwise.checkpoint.compat import check_resume, describe, resume_changes
from trainwise.checkpoint.training import read_resume_checkpoint, restore_training_checkpoint
from trainwise.config import TrainerConfig
from trainwise.diagnosis import OverfittingReport
from trainwise.fit_run import Run
from trainwise.freezing import unfreeze_into
from trainwise.progress import plural


def resume_run(run: Run, config: TrainerConfig, *, is_main: bool) -> None:
    """Continue from the checkpoint ``resume`` names, if any: every object restored in place."""
    def skipped(reason: str, chosen: Path) -> None:
        run.progress.message(f"{reason} Resuming from the previous good checkpoint, {chosen}.")
        run.log.write({"kind": "damaged_checkpoint", "reason": reason, "using": str(chosen)})

    found = read_resume_checkpoint(config.resume, run.run_dir, on_skipped=skipped, run_id=run.log.run_id)
    if found is not None:
        path, checkpoint = found
        saved = checkpoint["state"]
        changes = resume_changes(checkpoint.get("meta", {}).get("config"), config.to_dict(), run.facts)
        fresh = check_resume(changes, mismatch=config.resume_mismatch, checkpoint=path)
        if changes:  # resume_mismatch="allow"
            run.progress.message(describe(changes))
            run.log.write({"kind": "resume_mismatch", "changes": {k: [str(o), str(n)] for k, (o, n) in
                                                                  changes.items()}})
        replay_unfreezing(run, config, saved["loop"]["epoch"], mid_epoch=bool(saved.get("loader", {}).get(
            "batches_done")))
        restoring = {k: v for k, v in run.resumable.items() if k not in fresh}  # what the new run replaced
        restore_training_checkpoint(path, checkpoint, restoring, fsdp=run.fsdp)
        run.resumable.update(restoring)
        if not is_main:
            run.metrics.reset()  # the checkpoint holds the sums over all processes: rank 0 carries them
        run.loop = run.resumable["loop"]
        saved_report = run.loop.get("overfitting")
        run.outcome.overfitting = OverfittingReport(**saved_report) if saved_report else None
        offset = run.train_loader.resume_offset
        run.progress.message(
            f"resumed from {path} at epoch {run.loop['epoch']}, step {run.accumulator.optimizer_steps}"
            + (f" ({plural(offset, 'batch')} into the epoch)." if offset else ".")
        )
        run.log.write({"kind": "resumed", "checkpoint": str(path), "epoch": run.loop["epoch"],
                       "step": run.accumulator.optimizer_steps})
        run.resumed_step = run.accumulator.optimizer_steps
    if run.guard.model is not None:
        run.guard.keep(run.accumulator.optimizer_steps)  # a NaN before the first check returns the model here
    run.log.begin()  # compared first, written after: a refused resume has left the run folder as it was


def replay_unfreezing(run: Run, config: TrainerConfig, epoch: int, *, mid_epoch: bool) -> None:
    """The optimizer must have the groups it had when saved: redo the unfreezing done by then."""
    cfg = config
    for at in sorted(cfg.unfreeze_at or {}):
        if at < epoch or (mid_epoch and at == epoch):
            unfreeze_into(run.model, run.optimizer, *cfg.unfreeze_at[at],  # type: ignore[index]
                          lr_by_pattern=cfg.lr_by_pattern, scheduler=run.scheduler)
