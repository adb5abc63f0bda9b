"""The run folder: a JSON-lines log of every logged metric, flushed line by line so a kill keeps it, and a
lock so that one run folder has one writer.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from trainwise.errors import TrainwiseError, show
from trainwise.files import write_failure
from trainwise.run_folder import (
    CHECKPOINTS,
    CONFIG,
    HOLDS_RUN,
    LOCK,
    LOG,
    RUN_ID_KEY,
    RunFolder,
    new_run_id,
    open_regular,
)

# Records that describe training progress; after a resume the steps redone after the checkpoint repeat them.
_PROGRESS_KINDS = ("train", "epoch")


def default_run_dir(root: str | os.PathLike[str] = "runs") -> Path:
    """``runs/YYYYmmdd-HHMMSS`` (with a suffix if that folder already exists)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / f"{stamp}-{suffix}"
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable
    return value


class RunLock:
    """An advisory lock on a run folder for the life of one run: a second writer is refused, naming the holder.

    >>> with RunLock("runs/exp1"):   # refused with one sentence while another process holds it
    ...     train()

    The lock is ``flock`` on ``<run_dir>/.trainwise.lock`` (the file holds the holder's pid): the operating
    system drops it when the holder exits, even after ``kill -9``, so a stale file never blocks a new run.
    Taking it also checks that the folder exists (or can be made) and is writable, before anything is written.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            return self
        folder = self.run_dir
        try:
            if folder.exists() and not folder.is_dir():
                raise TrainwiseError(f"run_dir {folder} is a file, not a folder; choose another run_dir.")
            folder.mkdir(parents=True, exist_ok=True)
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT, "the run folder's lock file")  # never a link
        except (FileExistsError, NotADirectoryError):
            raise TrainwiseError(
                f"run_dir {folder} cannot be created because a part of its path is a file; choose another run_dir."
            ) from None
        except OSError as exc:
            raise write_failure(self.path, exc.errno, exc.strerror) from None
        if not _lock(fd):
            holder = _read_holder(fd)
            os.close(fd)
            raise TrainwiseError(
                f"run_dir {folder} is in use by another run (pid {holder}); wait for it to finish or choose "
                "another run_dir."
            )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _probe_writable(folder)
        except OSError as exc:
            _unlock(fd)
            os.close(fd)
            raise write_failure(self.path, exc.errno, exc.strerror) from None
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        _unlock(fd)
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _probe_writable(folder: Path) -> None:
    """Create and remove a small file: the folder takes new files (root ignores permission bits, not EROFS)."""
    probe = folder / f".trainwise-probe-{os.getpid()}-{secrets.token_hex(4)}"
    with open(probe, "wb") as file:
        file.write(b"0")
    probe.unlink()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


try:
    import fcntl

    def _lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:  # a file system without flock (some network mounts): no lock, but no refusal
            return exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        return True

    def _unlock(fd: int) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)

except ImportError:  # pragma: no cover - Windows
    import msvcrt

    def _lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        with contextlib.suppress(OSError):
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


class RunLog:
    """Append-only ``metrics.jsonl``; each record is written and flushed immediately.

    With ``deferred=True`` nothing is written until :meth:`begin`: the records meanwhile are kept in memory,
    so that a run refused before it begins (a resume that does not match) leaves the folder as it was.
    The file is opened with ``O_NOFOLLOW``: a symlink, FIFO or directory there is refused, never appended through.
    """

    run_id: str | None = None  # the run's id, set by open_run

    def __init__(self, run_dir: str | os.PathLike[str], *, deferred: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOG
        self._file: Any = None
        self._pending: list[dict[str, Any]] | None = [] if deferred else None
        self._json: list[tuple[str, dict[str, Any]]] = []
        self._committing: list[Path] = []  # JSON files begin() is committing on a thread
        if not deferred:
            self._open()

    def _open(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "the run's log")
            self._file = os.fdopen(fd, "a", encoding="utf-8")
        except OSError as exc:
            raise write_failure(self.path, exc.errno, exc.strerror) from None

    def begin(self) -> None:
        """Write what a deferred log kept: the JSON files first (config.json), then the records. The JSON files
        are written now and made durable beside the first steps (:func:`~trainwise.files.commit_beside`: their
        fsyncs are the set-up's longest wait); :meth:`settle` waits for them and raises a failed one."""
        if self._pending is None:
            return
        from trainwise.files import commit_beside, json_bytes, write_temporary_bytes

        pending, self._pending = self._pending, None
        for name, payload in self._json:
            path = RunFolder(self.run_dir).file(name)
            commit_beside(write_temporary_bytes(path, json_bytes(payload, sort_keys=False)))
            self._committing.append(path)
        self._json = []
        self._open()
        for record in pending:
            self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        if self._pending is not None:
            self._pending.append(dict(record))
            return
        line = json.dumps({k: _jsonable(v) for k, v in record.items()}, sort_keys=False)
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as exc:
            raise write_failure(self.path, exc.errno, exc.strerror) from None

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        """Write a small JSON file in the run folder atomically (temp file, then rename)."""
        from trainwise.files import atomic_write_json

        path = RunFolder(self.run_dir).file(name)  # a symlink or FIFO there: refused
        if self._pending is not None:
            self._json.append((name, payload))
            return path
        self.settle()
        return atomic_write_json(path, payload, sort_keys=False)

    def settle(self) -> None:
        """Wait until the JSON files :meth:`begin` wrote are on disk; a failed one raises its
        :class:`~trainwise.errors.DiskWriteError` here (the Trainer settles after its first optimizer step)."""
        from trainwise.files import settle

        committing, self._committing = self._committing, []
        for path in committing:
            settle(path)

    def close(self) -> None:
        with contextlib.suppress(TrainwiseError, OSError):  # a run that ends before settling has its own error
            self.settle()
        if self._file is not None and not self._file.closed:
            with contextlib.suppress(OSError):  # a full disk: the records written so far are flushed already
                self._file.close()


class NullRunLog:
    """The run log of a process other than rank 0: the same calls, nothing written."""

    run_id: str | None = None

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOG

    def begin(self) -> None:
        pass

    def write(self, record: dict[str, Any]) -> None:
        pass

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        return self.run_dir / name

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_run_log(
    run_dir: str | os.PathLike[str], *, writer: bool = True, deferred: bool = False
) -> RunLog | NullRunLog:
    """The run folder's log; a :class:`NullRunLog` for a process that must not write (``writer=False``)."""
    return RunLog(run_dir, deferred=deferred) if writer else NullRunLog(run_dir)


def lock_run_folder(run_dir: str | os.PathLike[str]) -> RunLock:
    """Lock the run folder for this run (rank 0 under several processes); every process raises the same
    one-sentence error when it cannot, so that none goes on alone."""
    from trainwise.distributed import run_on_main

    lock = RunLock(run_dir)
    run_on_main(lock.acquire)
    return lock


def open_run(
    run_dir: str | os.PathLike[str] | None,
    config: dict[str, Any],
    *,
    resume: Any = None,
    overwrite: bool = False,
    deferred: bool = False,
) -> tuple[Path, RunLock, RunLog | NullRunLog]:
    """Open a run folder for one run: rank 0's name for it (``runs/<time>`` by default), its lock, its log
    with a start record, and ``config.json`` (with the run id: the folder's own when ``resume`` continues it,
    else a new one); every process calls it, only rank 0 writes.

    A folder that already holds another run is refused in one sentence unless ``resume`` continues it (or
    ``overwrite=True``, which moves the old run into a sibling folder, never deleting it): otherwise the new
    run's checkpoints and log would mix with the old one's. Any entry that is not what a run writes there (a
    symlink, FIFO or directory for a file) is refused in one sentence naming it. With ``deferred=True`` the
    start record and config.json wait for ``log.begin()``: a resume is compared first and written after.
    """
    import time

    from trainwise.distributed import broadcast_object, is_main_process, run_on_main

    folder = Path(broadcast_object(str(Path(run_dir) if run_dir else default_run_dir())))  # rank 0's clock
    if overwrite:
        refuse_overwriting_the_current_folder(folder)  # before the lock: nothing written yet
    lock = lock_run_folder(folder)  # one writer per run folder; checks it is writable
    try:
        moved = run_on_main(lambda: _make_room(folder, resume, overwrite))
        run_id = broadcast_object(run_on_main(lambda: _run_id(folder, resume)))
        log = open_run_log(folder, writer=is_main_process(), deferred=deferred)
        log.write({"kind": "start", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resume": resume,
                   **({"previous_run_moved_to": str(moved)} if moved else {})})
        log.write_json(CONFIG, {RUN_ID_KEY: run_id, **config} if run_id is not None else dict(config))
        log.run_id = run_id
    except BaseException:
        lock.release()
        raise
    return folder, lock, log


def _run_id(folder: Path, resume: Any) -> str | None:
    """This run's id: the folder's own when the run continues it (None for a folder an older trainwise wrote,
    which keeps working as before), else a new one. Checks every name the run writes first (one sentence)."""
    names = RunFolder(folder)
    names.check()
    if resume is not None and names.has_config():
        return names.run_id()
    return new_run_id()


def holds_run(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a run's log, config or checkpoints (a symlink there counts, dangling or not;
    an empty ``checkpoints/``, such as a symlink made beforehand to a bigger disk, does not)."""
    for name in HOLDS_RUN:
        path = Path(folder) / name
        if name == CHECKPOINTS and path.is_dir():
            with contextlib.suppress(OSError):
                if not any(path.iterdir()):
                    continue
        if os.path.lexists(path):
            return True
    return False


def prepare_run_folder(
    folder: str | os.PathLike[str], *, resume: Any = None, overwrite: bool = False
) -> Path | None:
    """Before writing anything into ``folder``: refuse another run in it (one sentence), or with
    ``overwrite`` move that run into a sibling folder (returned); holds the folder's lock meanwhile."""
    if overwrite:
        refuse_overwriting_the_current_folder(folder)
    with RunLock(folder):
        return _make_room(Path(folder), resume, overwrite)


def refuse_overwriting_the_current_folder(run_dir: str | os.PathLike[str]) -> None:
    """Refuse ``overwrite=True`` for a ``run_dir`` that is the current folder or holds it (``"."``, ``".."``,
    ``"/"``): moving the old run aside would move every file there, the user's own scripts too."""
    try:
        folder, here = Path(run_dir).resolve(), Path.cwd().resolve()
    except (OSError, RuntimeError):  # no current folder (deleted), a symlink loop: nothing to protect here
        return
    if folder == here or folder in here.parents:
        relation = "is" if folder == here else "holds"
        raise TrainwiseError(
            f"run_dir={show(str(run_dir))} {relation} the current folder, and overwrite=True would move everything "
            "in it aside, your own files too; pass a run_dir of its own, such as run_dir='runs/exp1'."
        )


def _make_room(folder: Path, resume: Any, overwrite: bool) -> Path | None:
    """Refuse, or with ``overwrite`` move aside, another run in ``folder``; returns where it went."""
    if not holds_run(folder) or _continues(folder, resume):
        return None
    if not overwrite:
        raise TrainwiseError(
            f"run folder {folder} already holds a run; pass resume='auto' to continue it, another run_dir, or "
            "overwrite=True to move the old run aside."
        )
    # named after the folder with its ".." parts taken out ("runs/a/.." is "runs"); the current folder and those
    # holding it were refused before the lock was taken
    named = Path(os.path.normpath(folder))
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = named.with_name(f"{named.name}.previous-{stamp}")
    suffix = 1
    while aside.exists():
        suffix += 1
        aside = named.with_name(f"{named.name}.previous-{stamp}-{suffix}")
    aside.mkdir(parents=True)
    for entry in folder.iterdir():
        if entry.name != LOCK:
            os.replace(entry, aside / entry.name)  # a rename: nothing is copied or deleted
    return aside


def _continues(folder: Path, resume: Any) -> bool:
    """``resume`` continues the run in ``folder``: "auto", the folder itself, or a file inside it."""
    if resume is None:
        return False
    if resume == "auto":
        return True
    try:
        target = Path(resume).resolve()
        return target == folder.resolve() or folder.resolve() in target.parents
    except (OSError, ValueError):
        return False


def read_log(path: str | os.PathLike[str], *, raw: bool = False) -> list[dict[str, Any]]:
    """Read back a ``metrics.jsonl`` file (a run folder or the file itself).

    A resumed run redoes the steps after its checkpoint and logs them again after a ``"resumed"`` record;
    by default the records those redone steps replace are dropped, so each step and epoch appears once, as
    the run that continued logged it. ``raw=True`` returns every line as written.
    """
    path = Path(path)
    if path.is_dir():
        path = path / LOG
    records: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if not raw and record.get("kind") == "resumed":
            records = [r for r in records if not _superseded(r, record)]
        records.append(record)
    return records


def _superseded(record: dict[str, Any], resumed: dict[str, Any]) -> bool:
    """True for a progress record logged after the checkpoint a run resumed from (it is redone)."""
    if record.get("kind") not in _PROGRESS_KINDS:
        return False
    if record.get("kind") == "epoch":
        return _number(record.get("epoch")) >= _number(resumed.get("epoch"))
    return _number(record.get("step")) > _number(resumed.get("step"))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.inf
