"""A training run's checkpoints on one process or many: the checkpoint a resume starts from (rank 0 chooses,
every rank reads that same file), the full state saved at an optimizer-step boundary (under FSDP the model
and optimizer as shards beside the file) and restored in place.

    >>> state = {"model": model, "optimizer": opt, "loader": loader, "metrics": metrics, "loop": loop}
    >>> found = read_resume_checkpoint("auto", run_dir)        # (path, checkpoint) or None
    >>> if found: restore_training_checkpoint(*found, state)
    >>> save_training_checkpoint(manager, state, step=step)   # every rank calls it; rank 0 writes the file
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from trainwise.checkpoint.manager import ANY_RUN, CheckpointManager, find_resume_checkpoint, verify_checksums
from trainwise.checkpoint.state import read_checkpoint, restore_checkpoint
from trainwise.distributed import (
    barrier,
    broadcast_object,
    first_problem,
    get_rank,
    is_distributed,
    is_main_process,
    is_sharded,
    load_sharded,
    run_on_main,
    save_sharded,
)
from trainwise.errors import TrainwiseError
from trainwise.files import atomic_write_json, write_failure
from trainwise.run_folder import (
    CHECKPOINT_NAME,
    CHECKPOINTS,
    RUN_ID_KEY,
    SHARDED_NAME,
    SHARDED_OWNER,
    checkpoint_name,
    sharded_name,
)

Skipped = Callable[[str, Path], None]  # told each damaged newer checkpoint passed over, and the one used


def read_resume_checkpoint(
    resume: Any, run_dir: str | Path | None, *, on_skipped: Skipped | None = None, run_id: Any = ANY_RUN
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint ``resume`` names (a file, a folder, ``"auto"``, or None for none), read and checked.

    With ``"auto"`` or a folder, damaged newer files are passed over (``on_skipped`` is told). Under several
    processes rank 0 chooses and every process reads that same file: a node that cannot see it (no shared
    file system) stops every process with one sentence, instead of one starting over while the others resume.
    With a ``run_id`` (the Trainer's), ``"auto"`` and a folder continue only a checkpoint of that run: another
    run's newest is refused in one sentence; an explicit file is read as named (starting from another run's).
    """
    if not is_distributed():
        return _choose(resume, run_dir, on_skipped, run_id)
    found = run_on_main(lambda: _choose(resume, run_dir, on_skipped, run_id))
    chosen, problem = broadcast_object(None if found is None else str(found[0])), None
    if chosen is not None and not is_main_process():
        try:
            found = Path(chosen), read_checkpoint(chosen)
        except TrainwiseError as exc:
            problem = (
                f"process {get_rank()} cannot read {chosen}, the checkpoint process 0 resumes from ({exc}); "
                "put the run folder on a file system every node shares."
            )
    problem = first_problem(problem)
    if problem is not None:
        raise TrainwiseError(problem)
    return found


def _choose(resume: Any, run_dir: Any, on_skipped: Skipped | None, run_id: Any = ANY_RUN) -> tuple[
        Path, dict[str, Any]] | None:
    path = find_resume_checkpoint(resume, run_dir)
    if path is None:
        return None
    if resume != "auto" and not Path(resume).is_dir():  # an explicit file: that one or an error
        verify_checksums(path)
        return path, read_checkpoint(path)
    in_folder = path.parent.name == CHECKPOINTS
    found = CheckpointManager(path.parent.parent, run_id=run_id).read_latest() if in_folder else None
    if found is None:
        raise TrainwiseError(f"no intact checkpoint in {path.parent}; start without resume or pass another file.")
    chosen, checkpoint, skipped = found
    for reason in skipped:
        if on_skipped is not None:
            on_skipped(reason, chosen)
    return chosen, checkpoint


def restore_training_checkpoint(
    path: str | Path, checkpoint: dict[str, Any], state: MutableMapping[str, Any], *, fsdp: bool = False
) -> None:
    """Restore ``state`` in place from a checkpoint :func:`read_resume_checkpoint` returned; plain values
    (numbers, dicts) come back as new entries of ``state``. An FSDP checkpoint's model and optimizer are read
    from the sharded folder beside the file (every rank calls this; only on an FSDP run)."""
    saved = checkpoint["state"]
    if "sharded" not in saved:
        restore_checkpoint(checkpoint, state)  # in place; the RNG states last
        return
    from trainwise.checkpoint.dcp import sharded_folder

    folder = sharded_folder(path, saved["sharded"], fsdp=fsdp)  # only a plain sharded-stepN folder beside it
    load_sharded(folder, state["model"], state["optimizer"])  # collective
    rest = {**_without_model(state), "sharded": None}
    restore_checkpoint(checkpoint, rest)
    state.update({k: v for k, v in rest.items() if k != "sharded"})


def save_training_checkpoint(
    manager: CheckpointManager | None,
    state: MutableMapping[str, Any],
    *,
    step: int,
    metric: float | None = None,
    config: dict[str, Any] | None = None,
    run_dir: str | Path | None = None,
    background: bool = False,
) -> None:
    """Save ``state`` at an optimizer-step boundary; every process calls it, rank 0 (the one holding a
    ``manager``) writes the file. Under several processes the running metrics are summed first, so that a
    resume (rank 0 loads them) stays exact; under FSDP every rank writes its shards of the model and
    optimizer (``torch.distributed.checkpoint``) beside the file, which names their folder. A full disk
    or a read-only folder is one sentence naming the latest good checkpoint. ``run_dir`` (default: the
    manager's) is where every rank writes its shards under FSDP. ``background``: the file's fsync, rename
    and pruning go on while training does (see :meth:`CheckpointManager.save`; FSDP saves stay in the
    foreground); :func:`finish_checkpoint_writes` waits for them."""
    to_save: dict[str, Any] = dict(state)
    if is_distributed():
        if "metrics" in to_save:
            metrics = to_save["metrics"]
            reduced = type(metrics)(metrics.device)
            reduced.load_state_dict(metrics.state_dict())
            reduced.all_reduce()
            to_save["metrics"] = reduced
        if is_sharded(to_save["model"]):
            folder = sharded_name(step)
            if run_dir is None:
                if manager is None:
                    raise TrainwiseError("under FSDP every process must pass run_dir= to save its shards.")
                run_dir = manager.run_dir
            shards = Path(run_dir) / CHECKPOINTS / folder
            problem = first_problem(_unsafe_shard_folder(shards))  # every rank writes there: all refuse together
            if problem is not None:
                raise TrainwiseError(problem)
            owner = manager.run_id if manager is not None and isinstance(manager.run_id, str) else None
            run_on_main(lambda: owner and _mark_shards(shards, owner, step))  # this run's folder from now on
            save_sharded(shards, to_save["model"], to_save["optimizer"])
            to_save = {**_without_model(to_save), "sharded": folder}
    if manager is not None:
        with _disk_failures(manager, step):
            manager.save(to_save, step=step, metric=metric, config=config,
                         background=background and "sharded" not in to_save)
        if "sharded" in to_save:
            _prune_sharded(manager, saved=step)
    barrier()  # nobody goes on before the checkpoint is written (in the background: serialised)


def finish_checkpoint_writes(manager: CheckpointManager | None) -> None:
    """Wait until a background checkpoint save is on disk; its failure is the sentence a save would raise."""
    if manager is not None:
        with _disk_failures(manager, None):
            manager.wait()


@contextlib.contextmanager
def _disk_failures(manager: CheckpointManager, step: int | None) -> Iterator[None]:
    """A full disk, a file size limit, a folder made read-only during the run: one sentence naming the
    latest good checkpoint (the failed step is the background save's when that one failed)."""
    try:
        yield
    except OSError as exc:
        failed_step = getattr(exc, "step", None)
        failed_step = step if failed_step is None else failed_step
        latest = manager.latest()
        good = "no checkpoint was written before" if latest is None else f"the latest good checkpoint is {latest}"
        failed = write_failure(manager.folder / checkpoint_name(failed_step or 0), exc.errno, exc.strerror)
        raise TrainwiseError(f"{str(failed).removesuffix('.')}; {good}.") from None


def _without_model(state: MutableMapping[str, Any]) -> dict[str, Any]:
    """The entries an FSDP run keeps in the plain file (model and optimizer are sharded)."""
    return {k: v for k, v in state.items() if k not in ("model", "optimizer")}


def _unsafe_shard_folder(folder: Path) -> str | None:
    """Why the sharded folder of a step may not be written (a symlink or a file there), or None."""
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{folder} cannot be read ({exc.strerror}); choose another run_dir."
    if stat.S_ISDIR(mode):
        return None
    kind = "a symlink" if stat.S_ISLNK(mode) else "not a folder"
    return (f"{folder} (a sharded checkpoint's folder) is {kind}, so trainwise will not write shards into it; "
            "remove it or choose another run_dir.")


def _mark_shards(folder: Path, run_id: str, step: int) -> None:
    """Record the run id in a sharded folder before its shards are written: a folder a kill left without its
    checkpoint file is then known to be this run's, and removed by its next save."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / SHARDED_OWNER, {RUN_ID_KEY: run_id, "step": step})


def _shards_owner(folder: Path) -> str | None:
    """The run id a sharded folder records (None: none, or unreadable)."""
    marker = folder / SHARDED_OWNER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode) or os.lstat(marker).st_size > 4096:
            return None
        value = json.loads(marker.read_text(encoding="utf-8")).get(RUN_ID_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _step_of(name: re.Pattern[str], entry: str) -> int | None:
    """The step a checkpoint file's or sharded folder's name says (None: another name)."""
    match = name.match(entry)
    return int(match.group(1)) if match else None


def _prune_sharded(manager: CheckpointManager, *, saved: int) -> None:
    """Delete this run's sharded folders whose checkpoint file is not kept (rank 0): those the manager pruned,
    and those a kill left without their file (their marker names this run). ``saved``: the step just saved."""
    kept = {_step_of(CHECKPOINT_NAME, path.name) for path in manager.checkpoints()}
    pruned = {_step_of(CHECKPOINT_NAME, name) for name in manager.pruned}  # this run's only
    for folder in manager.folder.iterdir() if manager.folder.is_dir() else ():
        step = _step_of(SHARDED_NAME, folder.name)
        if step is None or step in kept or step == saved or folder.is_symlink() or not folder.is_dir():
            continue
        orphan = isinstance(manager.run_id, str) and _shards_owner(folder) == manager.run_id
        if step in pruned or orphan:
            shutil.rmtree(folder, ignore_errors=True)
