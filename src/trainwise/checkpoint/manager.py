"""A run's checkpoints: atomic saves named by step, the last N and the best kept, the newest complete found.

Files are ``<run_dir>/checkpoints/ckpt-step000000123.pt``. The folder listing is the source of truth: a
file with that name exists only once it is complete (it is renamed into place after an fsync), temporary
files are hidden (``.ckpt-...tmp-...``) and never considered, and ``manifest.json`` (written atomically)
only remembers each checkpoint's monitored metric. Old checkpoints are deleted only after the new one is in
place and reads back as complete, so the only good checkpoint is never deleted.

A manager given a ``run_id`` (the Trainer's) records it in every checkpoint's meta and treats as its own
only checkpoints with that id: it resumes from no other (another run's newest is refused in one sentence)
and deletes no other when pruning, so a ``checkpoints/`` symlinked to a shared disk is safe. Without one (a
hand-written loop) every checkpoint in the folder is the run's, as before.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import threading
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal

from trainwise.checkpoint.io import is_complete
from trainwise.checkpoint.state import read_checkpoint, restore_checkpoint, write_checkpoint_temporary
from trainwise.errors import TrainwiseError
from trainwise.files import atomic_write_json, is_temp_file
from trainwise.run_folder import (
    CHECKPOINT_NAME,
    CHECKPOINT_TEMP,
    CHECKPOINTS,
    MANIFEST,
    OWNER,
    RUN_ID_KEY,
    checkpoint_name,
    open_regular,
)

CHECKPOINT_FOLDER = CHECKPOINTS  # the name this module exported before run_folder named every file

ANY_RUN: Any = object()  # CheckpointManager(run_id=ANY_RUN): no run id written or checked


class CheckpointManager:
    """Save, keep and find the checkpoints of one run.

    >>> manager = CheckpointManager("runs/exp1", keep_last=3, monitor="val_loss", mode="min")
    >>> manager.save(state, step=step, metric=val_loss, config=config)   # atomic; prunes old ones
    >>> manager.latest()        # newest complete checkpoint, or None
    >>> manager.load_latest(state)   # restores in place; falls back to an older one if the newest is unreadable
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        keep_last: int = 3,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        run_id: Any = ANY_RUN,
        tidy: bool = True,
    ) -> None:
        if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1:
            raise TrainwiseError(
                f"keep_last must be a positive integer (at least the newest is kept), got {keep_last!r}."
            )
        if mode not in ("min", "max"):
            raise TrainwiseError(f"mode must be 'min' or 'max', got {mode!r}.")
        run_dir = Path(run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise TrainwiseError(f"run folder {run_dir} is a file; pass a folder for the run's checkpoints.")
        self.run_dir = run_dir
        self.folder = run_dir / CHECKPOINTS
        self.run_id = run_id  # a str, None (a folder from a trainwise before run ids) or ANY_RUN
        # name -> (size, mtime_ns, the run id and the step its meta records): read once per file version
        self._recorded: dict[str, tuple[int, int, str | None, int | None]] = {}
        self._misnamed: set[str] = set()  # files whose name claims another step than they hold (said once)
        self.pruned: set[str] = set()  # names this manager deleted (their sharded folders may go too)
        self.keep_last = keep_last
        self.monitor = monitor
        self.mode = mode
        self._commit: threading.Thread | None = None  # a background save's commit (fsync, rename, prune)
        self._commit_step: int | None = None
        self._commit_error: BaseException | None = None
        self._complete: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) of a file read whole
        self._tidied = False  # whether a save has pruned what an earlier, killed run left over
        if tidy:  # tidy=False: only looking (nothing removed)
            self._remove_stale_temp_files()

    # -- finding -------------------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint files, oldest (lowest step) first; temporary and partial files never appear."""
        self.wait()
        if not self.folder.is_dir():
            return []
        found = []
        for entry in self.folder.iterdir():
            match = CHECKPOINT_NAME.match(entry.name)
            if match and self._is_complete(entry) and self._holds_its_step(entry, int(match.group(1))):
                found.append((int(match.group(1)), entry))
        return [path for _, path in sorted(found)]

    def _holds_its_step(self, entry: Path, step: int) -> bool:
        """Whether the checkpoint holds the step its name says (or records none: another writer's format). One
        that claims a later step than it holds would win every resume and never be pruned: it is damaged (a
        rename, a copy over it), so it is never used and never deleted, and said once."""
        recorded = self._facts(entry)[1]
        if recorded is None or recorded == step:
            return True
        if entry.name not in self._misnamed:
            self._misnamed.add(entry.name)
            warnings.warn(f"{entry} holds step {recorded}, not the step {step} its name says: it was renamed or "
                          "overwritten, so it is not used (move it away to silence this).", UserWarning, stacklevel=3)
        return False

    def _is_complete(self, entry: Path) -> bool:
        """:func:`is_complete`, remembered for a file of the same size and modification time (a save lists
        the folder several times; reopening every kept zip each time would cost more than the save)."""
        try:
            info = entry.lstat()  # a symlink among the checkpoints is never one of them
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode):
            return False
        if self._complete.get(entry.name) == (info.st_size, info.st_mtime_ns):
            return True
        complete = is_complete(entry)
        if complete:  # only a whole file is remembered: a failed read (EIO, too many open files) is retried
            self._complete[entry.name] = (info.st_size, info.st_mtime_ns)
        return complete

    def owns(self, path: Path) -> bool:
        """Whether the checkpoint at ``path`` is this run's: its meta records this manager's run id (always
        true without one); read once per file (only its small meta matters; tensors are memory-mapped), and not
        at all for a file this manager has just saved, while its size and modification time are the saved ones."""
        if self.run_id is ANY_RUN:
            return True
        try:
            path.lstat()
        except OSError:
            return False
        return self._facts(path)[0] == self.run_id

    def _facts(self, path: Path) -> tuple[str | None, int | None]:
        """The run id and the step a checkpoint's meta records, read once per size and modification time."""
        try:
            info = path.lstat()
        except OSError:
            return "unreadable", None
        known = self._recorded.get(path.name)
        if known is not None and known[:2] == (info.st_size, info.st_mtime_ns):
            return known[2], known[3]
        run_id, step = _recorded_facts(path)
        self._recorded[path.name] = (info.st_size, info.st_mtime_ns, run_id, step)
        return run_id, step

    def latest(self) -> Path | None:
        """The newest complete checkpoint (highest step), or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    @property
    def best(self) -> Path | None:
        """The kept checkpoint with the best monitored metric (None without a metric)."""
        return self._best_of(self.checkpoints(), self._metrics())

    # -- ownership -----------------------------------------------------------------------------------

    def claim(self, *, write: bool = True) -> None:
        """Make the checkpoints folder this run folder's (``owner.json`` inside it names the run folder), or refuse
        in one sentence when another run folder that still exists points at the same folder (a run folder copied
        with its ``checkpoints/`` link: resuming the copy would write into the original's checkpoints and prune
        them). A run folder that was moved, or no longer points there, gives the folder up to this one when this
        one first saves (``write=False``: only the check, as a run does before it resumes)."""
        if not self.folder.is_dir():
            return  # nothing to share yet: the first save creates the folder, and claims it
        here = os.path.realpath(self.run_dir)
        owner = _recorded_owner(self.folder / OWNER)
        if owner is not None and owner != here:
            theirs = Path(owner) / CHECKPOINTS
            with contextlib.suppress(OSError):
                if theirs.is_dir() and os.path.samefile(theirs, self.folder):
                    raise TrainwiseError(
                        f"{self.folder} is the checkpoints folder of the run folder {owner} too (a copied run folder "
                        f"whose checkpoints/ points where the original's does), so this run would overwrite and "
                        "prune that run's checkpoints; give this run a checkpoints/ folder of its own (replace "
                        f"{self.folder} by a new folder, or a link to another place)."
                    )
        if owner != here and write:
            atomic_write_json(self.folder / OWNER, {"run_dir": here})

    # -- saving --------------------------------------------------------------------------------------

    def save(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        metric: float | None = None,
        config: Mapping[str, Any] | None = None,
        background: bool = False,
    ) -> Path:
        """Save ``state`` (see :func:`save_checkpoint`) as the checkpoint of optimizer step ``step``, then prune.

        With ``background=True`` the state is serialised now, into a hidden temporary file (so later changes
        to the model do not reach this checkpoint), and the disk-bound rest (fsync, rename, pruning, the
        manifest) runs on a thread while training goes on. Every other method, the next save included, first
        waits for it and raises its error (a full disk: :class:`~trainwise.errors.DiskWriteError`, with the
        failed ``step`` attribute); :meth:`wait` does only that. A kill before the commit leaves the previous
        checkpoints as they were.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise TrainwiseError(f"step must be a non-negative integer, got {step!r}.")
        if metric is not None:
            metric = float(metric)
            if math.isnan(metric):
                metric = None  # a NaN is never the best
        self.wait()
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self._tidied:  # a run killed between a save and its pruning; later saves prune after themselves
            self.claim()  # before anything is pruned: never another run folder's checkpoints
            self._tidied = True
            if len(self.checkpoints()) > self.keep_last + 1:
                self._prune(self._metrics())
        path = self.folder / checkpoint_name(step)
        meta = {"step": step, "metric": metric, "monitor": self.monitor}
        if isinstance(self.run_id, str):
            meta[RUN_ID_KEY] = self.run_id
        if path.exists() and not self.owns(path):
            raise TrainwiseError(
                f"{path} is a checkpoint another run wrote, in this run's {self.folder}; give this run a "
                "checkpoints/ folder of its own, or choose another run_dir."
            )
        pending = write_checkpoint_temporary(path, state, config=config, meta=meta)

        def commit() -> None:
            pending.commit()
            written = pending.stat  # this run's file: no need to read its meta back to know it
            assert written is not None, "a commit that returned has the written file's stat"
            run_id = self.run_id if isinstance(self.run_id, str) else None
            self._recorded[path.name] = (written.st_size, written.st_mtime_ns, run_id, step)
            found = self.checkpoints()  # listed once for the metrics and the pruning
            metrics = self._metrics({path.name: metric}, found)
            if self._is_complete(path):  # delete nothing unless the new checkpoint reads back
                self._prune(metrics, keep=path, found=found)

        if not background:
            commit()
            return path
        self._commit_step = step
        self._commit = threading.Thread(target=self._run_commit, args=(commit,), name="trainwise-checkpoint")
        self._commit.start()
        return path

    def _run_commit(self, commit: Callable[[], None]) -> None:
        try:
            commit()
        except BaseException as exc:  # handed to the thread that waits; a thread's own exception is lost
            self._commit_error = exc

    def wait(self) -> None:
        """Wait for a background save to be on disk; raise its error, if it failed, once."""
        thread = self._commit
        if thread is None or thread is threading.current_thread():
            return
        thread.join()
        self._commit = None
        error, self._commit_error = self._commit_error, None
        if error is not None:
            if isinstance(error, OSError):
                error.step = self._commit_step  # type: ignore[attr-defined]
            raise error

    def _prune(self, metrics: dict[str, float | None], keep: Path | None = None,
               found: list[Path] | None = None) -> None:
        found = [path for path in (self.checkpoints() if found is None else found)
                 if self.owns(path)]  # never another run's files
        # the newest by step, the best, and the one just written (files of a later step are another run's)
        kept = set(found[-self.keep_last:]) | ({keep} if keep is not None else set())
        best = self._best_of(found, metrics)
        if best is not None:
            kept.add(best)
        for path in found:
            if path not in kept:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                self.pruned.add(path.name)
        names = {path.name for path in found if path in kept}
        self._write_manifest({name: metric for name, metric in metrics.items() if name in names})

    def _best_of(self, paths: list[Path], metrics: Mapping[str, float | None]) -> Path | None:
        scored = [(m, p) for p in paths if (m := metrics.get(p.name)) is not None]
        if not scored:
            return None
        pick = min if self.mode == "min" else max
        return pick(scored, key=lambda item: item[0])[1]  # ties: the earliest (paths are sorted by step)

    # -- loading -------------------------------------------------------------------------------------

    def read_latest(self) -> tuple[Path, dict[str, Any], list[str]] | None:
        """The newest checkpoint that is intact: ``(path, checkpoint, why_newer_ones_were_skipped)``, or None.

        Each file's zip checksums are verified before it is read (torch itself does not check them, so a
        flipped byte in a tensor would load as a wrong weight); a damaged file is skipped, with the reason,
        in favour of the next older one.
        """
        skipped: list[str] = []
        for path in reversed(self.checkpoints()):
            try:
                verify_checksums(path)
                checkpoint = read_checkpoint(path)
            except TrainwiseError as exc:
                skipped.append(str(exc))
                continue
            recorded = checkpoint.get("meta", {}).get(RUN_ID_KEY) if isinstance(checkpoint.get("meta"), dict) else None
            if self.run_id is not ANY_RUN and recorded != self.run_id:
                raise TrainwiseError(
                    f"{self.folder} holds {path}, a checkpoint of another run (run id {recorded or 'none'}, this "
                    f"run's is {self.run_id or 'none'}), so this run will not resume from it; point checkpoints/ "
                    "at this run's own folder, or choose another run_dir."
                )
            return path, checkpoint, skipped
        return None

    def load_latest(
        self, state: MutableMapping[str, Any], *, strict: bool = True, rng: bool = True
    ) -> tuple[Path, dict[str, Any]] | None:
        """Restore ``state`` from the newest checkpoint that reads back; None if there is none.

        A damaged newest file (it cannot be, unless the disk or a copy damaged it) is skipped with a warning
        and the next older one is used. Errors restoring into ``state`` (a different model) raise.
        """
        found = self.read_latest()
        if found is None:
            return None
        path, checkpoint, skipped = found
        for reason in skipped:
            warnings.warn(f"skipping unreadable checkpoint: {reason}", UserWarning, stacklevel=2)
        return path, restore_checkpoint(checkpoint, state, strict=strict, rng=rng)

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _metrics(self, known_now: Mapping[str, float | None] | None = None,
                 found: list[Path] | None = None) -> dict[str, float | None]:
        try:
            text = _read_manifest(self.folder / MANIFEST)  # a link, FIFO or huge file there: refused
        except OSError:
            text = ""  # none yet (or unreadable): the files' own metas say the metrics
        try:
            data = json.loads(text)
            metrics = data["metrics"]
            if not isinstance(metrics, dict):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            metrics = {}
        known = {name: (float(v) if isinstance(v, (int, float)) else None) for name, v in metrics.items()}
        known.update(known_now or {})
        for path in self.checkpoints() if found is None else found:  # a lost or stale manifest: read the file
            if path.name not in known:
                try:
                    known[path.name] = read_checkpoint(path)["meta"].get("metric")
                except (TrainwiseError, KeyError, AttributeError):
                    known[path.name] = None
        return known

    def _write_manifest(self, metrics: Mapping[str, float | None]) -> None:
        atomic_write_json(
            self.folder / MANIFEST,
            {"monitor": self.monitor, "mode": self.mode, "keep_last": self.keep_last, "metrics": dict(metrics)},
        )

    def _remove_stale_temp_files(self) -> None:
        if not self.folder.is_dir():
            return
        for entry in self.folder.iterdir():
            match = CHECKPOINT_TEMP.match(entry.name)
            if match and is_temp_file(entry) and not _alive(int(match.group(1))):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _recorded_facts(path: Path) -> tuple[str | None, int | None]:
    """The run id and the step a checkpoint's meta records (None for none; ``"unreadable"`` for a file that cannot
    be read); memory-mapped, so that the tensors are not read, and with ``weights_only=True``: nothing runs."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        meta = checkpoint.get("meta") if isinstance(checkpoint, dict) else None
    except Exception:  # unreadable: not provably this run's, so never deleted
        return "unreadable", None
    if not isinstance(meta, dict):
        return None, None
    run_id, step = meta.get(RUN_ID_KEY), meta.get("step")
    return (run_id if isinstance(run_id, str) else None,
            step if isinstance(step, int) and not isinstance(step, bool) else None)


_MANIFEST_BYTES = 1 << 20  # a manifest of thousands of checkpoints is a few hundred kB


def _recorded_owner(path: Path) -> str | None:
    """The run folder ``owner.json`` names (None when there is none, or it says nothing usable); a link, FIFO
    or huge file there is refused in one sentence, as for the manifest."""
    try:
        data = json.loads(_read_manifest(path, "the checkpoints folder's owner record"))
    except OSError:
        return None
    except ValueError as exc:
        if isinstance(exc, TrainwiseError):
            raise
        return None
    owner = data.get("run_dir") if isinstance(data, dict) else None
    return owner if isinstance(owner, str) and owner else None


def _read_manifest(path: Path, what: str = "the checkpoint manifest") -> str:
    """The text of a small JSON file of the checkpoints folder, read as every run-folder entry is: a regular file
    only (a link, a FIFO or a directory there is refused in one sentence), never more than it could hold (a link
    to /dev/zero)."""
    fd = open_regular(path, os.O_RDONLY, what)
    with os.fdopen(fd, "rb") as file:
        data = file.read(_MANIFEST_BYTES + 1)
    if len(data) > _MANIFEST_BYTES:
        raise TrainwiseError(f"{path} is over {_MANIFEST_BYTES:,} bytes, more than {what} holds; move it away.")
    return data.decode("utf-8", errors="replace")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def verify_checksums(path: str | os.PathLike[str]) -> None:
    """Raise a one-sentence TrainwiseError if any member of the zip checkpoint at ``path`` fails its CRC-32."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise TrainwiseError(f"{path} is damaged and cannot be read ({exc}).") from None
    if bad is not None:
        raise TrainwiseError(f"{path} is damaged: its member {bad} fails its checksum.")


def latest_in(run_dir: str | os.PathLike[str] | None) -> Path | None:
    """The newest complete checkpoint in ``run_dir/checkpoints`` (None for none, or no such folder), found
    without writing or deleting anything: for naming the latest good checkpoint in an error."""
    if run_dir is None:
        return None
    with contextlib.suppress(OSError, TrainwiseError):
        return CheckpointManager(run_dir, tidy=False).latest()
    return None


def find_resume_checkpoint(
    resume: Any, run_dir: str | os.PathLike[str] | None, *, run_id: Any = ANY_RUN
) -> Path | None:
    """The checkpoint ``resume`` points at: ``"auto"`` (the newest complete one in ``run_dir``, or None to
    start fresh), an explicit file, or a run/checkpoint folder (its newest); ``None``/``False``: None."""
    if resume is None or resume is False:
        return None
    if resume == "auto":
        if run_dir is None:
            return None
        return CheckpointManager(run_dir, run_id=run_id).latest()
    if not isinstance(resume, (str, os.PathLike)):
        raise TrainwiseError(f"resume must be 'auto', a checkpoint path or None, got {type(resume).__name__}.")
    path = Path(resume)
    if path.is_dir():
        folder = path.parent if path.name == CHECKPOINTS else path
        latest = CheckpointManager(folder).latest()
        if latest is None:
            raise TrainwiseError(f"no complete checkpoint in {path}; pass a checkpoint file or resume='auto'.")
        return latest
    if not path.exists():
        raise TrainwiseError(f"resume checkpoint {path} does not exist; check the path or use resume='auto'.")
    return path


__all__ = ["ANY_RUN", "CHECKPOINT_FOLDER", "CheckpointManager", "checkpoint_name", "find_resume_checkpoint",
           "latest_in", "verify_checksums"]
