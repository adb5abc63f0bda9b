"""Writing files safely: a kill, a full disk or a crash never leaves a half-written file under its name.

A write goes to a hidden temporary file in the target's folder, is flushed and fsynced, then renamed over
the target (a rename within one folder is atomic), and the folder is fsynced so that the rename survives a
power cut. A kill at any moment leaves the old complete file or the new complete one, never a mix. The new
file keeps the permission bits of the file it replaces. A full disk, a file size limit, a quota, a
read-only or missing folder is a :class:`~trainwise.errors.DiskWriteError` that names the file, never a
half-written one, in the one sentence :func:`write_failure` words for every writer.

Every writer in the project (checkpoints, logs, plots, trackers, ``doctor --fix``) goes through here; this
module imports no torch, so the doctor can use it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from trainwise.errors import DiskWriteError, TrainwiseError

_TEMP_MARK = ".tmp-"


def is_temp_file(path: str | os.PathLike[str]) -> bool:
    """True for the hidden temporary files that :func:`atomic_write` leaves behind when it is killed."""
    name = Path(path).name
    return name.startswith(".") and _TEMP_MARK in name


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    If ``write`` raises, or the process dies, ``path`` keeps its previous content (or stays absent); the
    temporary file is removed on an exception and ignored by every trainwise loader if it is left behind.
    The new file gets the permission bits of the file it replaces (a new file gets ``0o666 & ~umask``, as
    ``open()`` gives). A write that fails because the disk is full, a file size limit or quota is reached or
    the folder is read-only raises :class:`~trainwise.errors.DiskWriteError` (a ``TrainwiseError`` and an
    ``OSError``), also when ``torch.save`` wrapped the ``OSError`` in a ``RuntimeError``.
    """
    return write_temporary(path, write).commit()


class PendingWrite:
    """A file written in full to its hidden temporary name, not yet durable or visible under its own name.

    :meth:`commit` makes it so (fsync, rename over the target, fsync of the folder: the slow, disk-bound
    part, which may run on another thread); :meth:`discard` removes it. Until then the target is unchanged.
    """

    def __init__(self, path: Path, temp: Path, file: IO[bytes]) -> None:
        self.path, self.temp, self._file = path, temp, file
        self.stat: os.stat_result | None = None  # the written file's, once committed (a rename keeps it)

    def commit(self) -> Path:
        """fsync the temporary file, rename it over the target and fsync the folder; a failure removes it and
        raises :class:`~trainwise.errors.DiskWriteError` with the target unchanged."""
        try:
            try:
                os.fsync(self._file.fileno())
                self.stat = os.fstat(self._file.fileno())
            finally:
                self._file.close()
            os.replace(self.temp, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                self.temp.unlink()
            if isinstance(exc, OSError):
                raise write_failure(self.path, exc.errno, exc.strerror or str(exc)) from None
            raise
        _fsync_folder(self.path.parent)
        return self.path

    def discard(self) -> None:
        """Remove the temporary file; the target stays as it was."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self.temp.unlink()


# Commits running on a thread (commit_beside), by target path: every reader or writer of that file in this process
# settles it first, so nothing here ever sees the file before it is whole, or writes it out of order.
_BESIDE: dict[str, tuple[threading.Thread, list[BaseException]]] = {}


def commit_beside(pending: PendingWrite) -> None:
    """Commit ``pending`` (fsync, rename, fsync of the folder) on a thread while the caller goes on: the disk's
    wait moves off the caller's path. The target appears when the commit is done; :func:`settle` waits for it."""
    settle(pending.path)  # one commit per file at a time, in order
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            pending.commit()
        except BaseException as exc:  # handed to whoever settles: a thread's own exception would be lost
            errors.append(exc)

    thread = threading.Thread(target=commit, name="trainwise-commit")
    _BESIDE[os.path.abspath(pending.path)] = (thread, errors)
    thread.start()


def settle(path: str | os.PathLike[str]) -> None:
    """Wait until a :func:`commit_beside` of ``path`` is on disk (nothing when there is none); its error (a
    :class:`~trainwise.errors.DiskWriteError`, the target unchanged) is raised here, once."""
    entry = _BESIDE.pop(os.path.abspath(path), None)
    if entry is None:
        return
    thread, errors = entry
    thread.join()
    if errors:
        raise errors[0]


def write_temporary(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> PendingWrite:
    """The first half of :func:`atomic_write`: ``write(file)`` to a temporary file beside ``path``, flushed;
    ``path`` itself is untouched until :meth:`PendingWrite.commit`. Errors as for :func:`atomic_write`."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise TrainwiseError(f"{path} is a directory; give a file name to write to.")
    if not folder.is_dir():
        raise write_failure(path, errno.ENOENT)
    mode = _existing_mode(path)
    temp = folder / f".{path.name[:200]}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        file = _open_temp(temp, mode)
    except OSError as exc:
        raise write_failure(path, exc.errno, exc.strerror) from None
    raw = file.raw if isinstance(file, io.BufferedWriter) else None
    written = False  # after write(): every OSError is ours (the flush)
    try:
        write(file)
        written = True
        file.flush()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            file.close()
        with contextlib.suppress(OSError):
            temp.unlink()
        if written and isinstance(exc, OSError):
            failure: tuple[int | None, str] | None = (exc.errno, exc.strerror or str(exc))
        else:
            failure = _failure_of(exc, getattr(raw, "failure", None), folder)
        if failure is None:
            raise
        raise write_failure(path, *failure) from None
    return PendingWrite(path, temp, file)


class _TempRaw(io.FileIO):
    """The temporary file under its buffer: remembers the first OSError a write raised, because ``torch.save``
    may turn it into a ``RuntimeError`` that no longer says why ("unexpected pos 64 vs 0")."""

    failure: OSError | None = None
    write_to_disk = io.FileIO.write  # tests replace it to fill the disk after N bytes

    def write(self, data: Any) -> int | None:
        try:
            return self.write_to_disk(data)
        except OSError as exc:
            if self.failure is None:
                self.failure = exc
            raise


def _open_temp(temp: Path, mode: int | None) -> IO[bytes]:
    """A new temporary file; created private when it will replace a file, then given that file's mode."""

    def opener(name: str, flags: int) -> int:
        return os.open(name, flags, 0o600 if mode is not None else 0o666)

    raw = _TempRaw(temp, "xb", opener=opener)
    try:
        if mode is not None:
            with contextlib.suppress(OSError):  # file systems without permission bits (FAT, some mounts)
                if hasattr(os, "fchmod"):
                    os.fchmod(raw.fileno(), mode)
                else:  # pragma: no cover - Windows before Python 3.13
                    os.chmod(temp, mode)
        return io.BufferedWriter(raw)
    except BaseException:
        raw.close()
        raise


def _existing_mode(path: Path) -> int | None:
    """The permission bits of the file ``path`` names (set-id bits left out), or None if there is none."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode) & 0o777
    except OSError:
        return None


# errno -> (what happened, what to do): the one table of how trainwise words a file it could not write (an
# atomic write here, the run's log, its lock, a checkpoint); anything else is reported with its strerror.
_WRITE_REASONS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", "free some space or write to another disk"),
    errno.EFBIG: ("the file size limit was reached", "raise the limit (ulimit -f) or write to another file system"),
    errno.EROFS: ("the folder is on a read-only file system", "write to another folder"),
    errno.EACCES: ("the folder is not writable", "make it writable or write to another folder"),
    errno.EPERM: ("the folder is not writable", "make it writable or write to another folder"),
    errno.ENOENT: ("its folder does not exist", "create the folder or write to another one"),
}
if hasattr(errno, "EDQUOT"):
    _WRITE_REASONS[errno.EDQUOT] = ("the disk quota is exceeded", "free some space or write to another disk")


def write_failure(path: str | os.PathLike[str], code: int | None, strerror: str | None = None) -> DiskWriteError:
    """The one sentence for ``path`` not written (errno ``code``): what happened and what to do, the same
    whichever writer failed; the OS's own words in brackets when they differ."""
    strerror = strerror or (os.strerror(code) if code else "the write failed")
    reason, fix = _WRITE_REASONS.get(code or 0, (strerror, "check the disk and the folder, then try again"))
    shown = f"{reason} ({strerror})" if reason != strerror else reason
    return DiskWriteError(f"could not write {path}: {shown}; {fix}.", path=path, errno=code, strerror=strerror)


# Disk conditions recognised in an error that did not come from the temporary file's own writes (an OSError
# raised by ``write`` itself, or torch's RuntimeError after it wrote to the file descriptor directly).
_DISK_ERRNOS = tuple(code for code in _WRITE_REASONS if code not in (errno.EACCES, errno.EPERM, errno.ENOENT))


def _failure_of(exc: BaseException, recorded: OSError | None, folder: Path) -> tuple[int | None, str] | None:
    """``(errno, strerror)`` when ``exc`` (or what it wraps) is the file failing to be written, else None."""
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not a write failure
        return None
    if recorded is not None:
        return recorded.errno, recorded.strerror or str(recorded)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_ERRNOS:
            return current.errno, current.strerror or os.strerror(current.errno)
        if isinstance(current, RuntimeError):
            text = str(current)
            if "write" in text.lower():
                # the legacy format writes storages to the file descriptor: "write(): fd 3 failed with File too large"
                for code in _DISK_ERRNOS:
                    if os.strerror(code) in text:
                        return code, os.strerror(code)
                if "file write failed" in text or "failed writing file" in text:  # PytorchStreamWriter, no errno
                    return _guess_write_failure(folder)
        current = current.__cause__ or current.__context__
    return None


def _guess_write_failure(folder: Path) -> tuple[int | None, str]:
    try:
        usage = os.statvfs(folder)
        if usage.f_bavail * usage.f_frsize < 1 << 20:
            return errno.ENOSPC, os.strerror(errno.ENOSPC)
    except (OSError, AttributeError):
        pass
    return errno.EIO, "the write failed"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    return write_temporary_bytes(path, data).commit()


def write_temporary_bytes(path: str | os.PathLike[str], data: bytes) -> PendingWrite:
    """:func:`write_temporary` of ``data``: written in full, not yet committed."""
    return write_temporary(path, lambda file: file.write(data))


def atomic_write_json(path: str | os.PathLike[str], value: Any, *, sort_keys: bool = True) -> Path:
    """Write ``value`` as indented JSON to ``path`` atomically (values JSON lacks are written as strings)."""
    return atomic_write_bytes(path, json_bytes(value, sort_keys=sort_keys))


def json_bytes(value: Any, *, sort_keys: bool = True) -> bytes:
    """``value`` as the indented JSON :func:`atomic_write_json` writes (values JSON lacks as strings)."""
    return (json.dumps(value, indent=2, sort_keys=sort_keys, default=str) + "\n").encode()


def _fsync_folder(folder: Path) -> None:
    # Makes the rename itself durable; not possible on Windows, where os.replace is durable enough.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "PendingWrite",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "commit_beside",
    "is_temp_file",
    "json_bytes",
    "settle",
    "write_failure",
    "write_temporary",
    "write_temporary_bytes",
]
