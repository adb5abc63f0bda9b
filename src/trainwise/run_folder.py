"""The run folder's names, in one place: every path trainwise writes under ``run_dir`` comes from
:class:`RunFolder`, which refuses (one sentence naming the entry) a symlink, FIFO, directory or other
non-regular file where it writes a file, so that nothing we write lands outside the folder.

``checkpoints/`` and ``tensorboard/`` may be symlinks to folders elsewhere (a bigger disk): that is a
set-up, not an attack; what is resumed from or deleted there is decided by the run id every checkpoint
records (see :mod:`trainwise.checkpoint.manager`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwise.errors import TrainwiseError
from trainwise.files import settle

LOCK = ".trainwise.lock"
CONFIG = "config.json"
LOG = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
BEST_WEIGHTS = "best-weights.pt"
FINAL_WEIGHTS = "final-weights.pt"
CURVES_SVG = "learning_curves.svg"
CURVES_PNG = "learning_curves.png"
MLFLOW = "mlflow.json"
TENSORBOARD = "tensorboard"
FIT = "fit.json"
RUN_ID_KEY = "run_id"  # in config.json, every checkpoint's meta and mlflow.json

FILES = (LOCK, CONFIG, LOG, BEST_WEIGHTS, FINAL_WEIGHTS, CURVES_SVG, CURVES_PNG, MLFLOW, FIT)
FOLDERS = (CHECKPOINTS, TENSORBOARD)  # a symlink to a folder is allowed here
HOLDS_RUN = (LOG, CONFIG, CHECKPOINTS)  # any of these: the folder holds a run

# -- inside checkpoints/ (see trainwise.checkpoint.manager) ------------------------------------------------
MANIFEST = "manifest.json"  # each checkpoint's monitored metric
OWNER = "owner.json"  # the run folder whose checkpoints these are
SHARDED_OWNER = ".trainwise-run.json"  # in a sharded folder: the run id of the run that wrote it
CHECKPOINT_NAME = re.compile(r"^ckpt-step(\d+)\.pt$")
CHECKPOINT_TEMP = re.compile(r"^\.ckpt-step\d+\.pt\.tmp-(\d+)-[0-9a-f]+$")  # group 1: the writer's pid
SHARDED_NAME = re.compile(r"^sharded-step(\d+)$")


def checkpoint_name(step: int) -> str:
    """The checkpoint file of ``step`` in ``checkpoints/``."""
    return f"ckpt-step{step:09d}.pt"


def sharded_name(step: int) -> str:
    """The folder of ``step``'s shards (an FSDP run) in ``checkpoints/``, beside its checkpoint file."""
    return f"sharded-step{step:09d}"


def exported_name(suffix: str) -> str:
    """What ``trainwise export`` writes in the run folder of a checkpoint given without ``--output``."""
    return f"model{suffix}"


def new_run_id() -> str:
    """A fresh run id: 16 hex digits, recorded in config.json when a run folder is first opened."""
    return secrets.token_hex(8)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def refusal(path: Path, what: str, mode: int) -> TrainwiseError:
    """The one sentence for a non-regular entry where a run writes the file ``what``."""
    return TrainwiseError(
        f"{path} ({what}) is {_kind(mode)}, not a regular file, so trainwise will not write it; remove it or "
        "choose another run_dir."
    )


class RunFolder:
    """Every path of one run folder, checked before it is written.

    >>> folder = RunFolder("runs/exp1")
    >>> folder.file(CONFIG)        # runs/exp1/config.json; refused if it is a symlink, FIFO or directory
    >>> folder.check()             # every name at once, before a run writes anything
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)

    def file(self, name: str) -> Path:
        """``run_dir/name``, refused in one sentence unless it is absent or a regular file (not a symlink)."""
        path = self.run_dir / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path
        except OSError:
            return path  # unreadable: the write itself reports it
        if not stat.S_ISREG(mode):
            raise refusal(path, name, mode)
        return path

    def folder(self, name: str) -> Path:
        """``run_dir/name`` for a subfolder: absent, a folder, or a symlink to a folder; anything else refused."""
        path = self.run_dir / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return path
        if stat.S_ISDIR(mode):
            return path
        if stat.S_ISLNK(mode) and path.is_dir():
            return path  # a folder on another disk: a legitimate set-up
        raise TrainwiseError(
            f"{path} ({name}) is {_kind(mode) if not stat.S_ISLNK(mode) else 'a symlink that leads to no folder'}"
            ", not a folder, so trainwise will not write into it; remove it or choose another run_dir."
        )

    def check(self) -> None:
        """Refuse, before anything is written, any name of :data:`FILES` or :data:`FOLDERS` that is not what
        a run writes there (the lock is checked when it is taken)."""
        for name in FILES:
            if name != LOCK:
                self.file(name)
        for name in FOLDERS:
            self.folder(name)

    @property
    def lock(self) -> Path:
        return self.run_dir / LOCK  # opened with O_NOFOLLOW and checked by RunLock itself

    @property
    def config(self) -> Path:
        return self.file(CONFIG)

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG  # opened with O_NOFOLLOW and checked by RunLog itself

    @property
    def checkpoints(self) -> Path:
        return self.folder(CHECKPOINTS)

    @property
    def tensorboard(self) -> Path:
        return self.folder(TENSORBOARD)

    def run_id(self) -> str | None:
        """The run id config.json recorded; None when there is no config.json, it is unreadable, or it was
        written by a trainwise from before run ids (such a folder keeps working as it did: see
        docs/checkpoints.md, Run folder)."""
        settle(self.run_dir / CONFIG)  # a config.json this process is still committing: read once it is whole
        try:
            path = self.file(CONFIG)
            saved: Any = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        value = saved.get(RUN_ID_KEY) if isinstance(saved, dict) else None
        return value if isinstance(value, str) else None

    def amend_config(self, **fields: Any) -> None:
        """Add ``fields`` to ``config.json`` (what the run decided after it started: the count chosen); nothing
        when there is no readable config.json or this process does not write (another rank)."""
        settle(self.run_dir / CONFIG)  # the file being committed: amended once it is whole (a failure raises)
        try:
            saved: Any = json.loads(self.file(CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError, TrainwiseError):
            return
        if isinstance(saved, dict) and self.log is not None:
            self.log.write_json(CONFIG, {**saved, **fields})

    def has_config(self) -> bool:
        settle(self.run_dir / CONFIG)
        return os.path.lexists(self.run_dir / CONFIG)

    # -- what a run says: the progress line, the log record and the trackers together ------------------------

    log: Any = None  # the run's log (RunLog, NullRunLog off rank 0, or TrackedLog with trackers): see attach
    progress: Any = None  # the progress display (lines, a bar, or off)

    def attach(self, *, log: Any, progress: Any) -> RunFolder:
        """The run's log (records, and the trackers behind it) and progress display: where :meth:`announce` goes."""
        self.log, self.progress = log, progress
        return self

    def announce(self, kind: str, text: str | None = None, **fields: Any) -> None:
        """One event of the run: ``text`` printed on the progress display (when given), and the record
        ``{"kind": kind, **fields}`` written to ``metrics.jsonl`` and the trackers."""
        if text is not None:
            self.progress.message(text)
        self.log.write({"kind": kind, **fields})

    def record(self, record: dict[str, Any]) -> None:
        """A record for ``metrics.jsonl`` (and the trackers' metrics) that prints nothing."""
        self.log.write(record)

    def say(self, text: str) -> None:
        """A line on the progress display only (what config.json or the error already records)."""
        self.progress.message(text)

    def finish(self, status: str, record: dict[str, Any], *, artifacts: list[Path],
               final_weights: Callable[[Path], Path] | None = None) -> None:
        """The run's end ``record``, written as it is (a full disk is not raised over the run's own error), then the
        trackers' end state with ``artifacts`` and the final weights, which ``final_weights(path)`` writes when
        given."""
        with contextlib.suppress(TrainwiseError):
            self.log.write(record)
        if getattr(self.log, "trackers", None):
            if final_weights is not None:
                artifacts = [*artifacts, final_weights(self.file(FINAL_WEIGHTS))]
            self.log.finish(status, artifacts)

    def draw_curves(self, history: list[dict[str, Any]], *, monitor: str, best_epoch: int | None,
                    overfitting_epoch: int | None, format: str) -> Path | None:
        """The learning curves of ``history``: an SVG written directly (a few milliseconds), or a PNG through
        matplotlib (None, said once, when it is not installed)."""
        from trainwise.plots import PLOT_HINT, plot_learning_curves, write_learning_curves_svg

        curves = {"history": history, "monitor": monitor, "best_epoch": best_epoch,
                  "overfitting_epoch": overfitting_epoch}
        if format == "svg":
            return write_learning_curves_svg(path=self.file(CURVES_SVG), **curves)
        try:
            return plot_learning_curves(path=self.file(CURVES_PNG), **curves)
        except ImportError:
            self.say(PLOT_HINT)
            return None

    def close(self) -> None:
        """Close the progress display and the log (the records written so far are on disk)."""
        try:
            if self.progress is not None:
                self.progress.close()
        finally:
            if self.log is not None:
                self.log.close()


def open_regular(path: Path, flags: int, what: str, *, mode: int = 0o644) -> int:
    """``os.open`` with ``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a FIFO cannot block), then refuse in one sentence
    anything but a regular file; the descriptor is in blocking mode again when returned."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise refusal(path, what, info.st_mode)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    nonblock = getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | nofollow | nonblock, mode)
    except OSError as exc:
        try:
            now = os.lstat(path).st_mode
        except OSError:
            raise exc from None
        if not stat.S_ISREG(now):  # replaced between the check and the open
            raise refusal(path, what, now) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise refusal(path, what, info.st_mode)
    if nonblock:
        os.set_blocking(fd, True)
    return fd


__all__ = ["RunFolder", "checkpoint_name", "exported_name", "new_run_id", "open_regular", "sharded_name"]
