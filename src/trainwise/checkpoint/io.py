"""Checkpoint files: atomic writes, format detection, and loading that never runs code from the file.

A write goes to a hidden temporary file in the target's folder, is flushed and fsynced, then renamed over
the target (a rename within one folder is atomic), and the folder is fsynced so that the rename survives a
power cut. A kill at any moment leaves the old complete file or the new complete one, never a mix.

Every torch file is read with ``weights_only=True``: a file that needs a class outside torch's allowlist is
refused before anything in it runs, with the class named and how to allow it if the file is trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from trainwise.errors import TrainwiseError

# What `detect_format` returns for a readable file.
TORCH_ZIP = "torch-zip"  # torch.save since 1.6
TORCH_LEGACY = "torch-legacy"  # torch.save(..., _use_new_zipfile_serialization=False)
SAFETENSORS = "safetensors"

_ZIP_MAGIC = b"PK\x03\x04"
# torch's legacy format starts with a pickled magic number: \x80 <protocol> then these bytes.
_LEGACY_MAGIC = b"\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"
_TEMP_MARK = ".tmp-"
_UNSAFE_GLOBAL = re.compile(r"GLOBAL ([\w.]+) was not an allowed global")


def is_temp_file(path: str | os.PathLike[str]) -> bool:
    """True for the hidden temporary files that :func:`atomic_write` leaves behind when it is killed."""
    name = Path(path).name
    return name.startswith(".") and _TEMP_MARK in name


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    If ``write`` raises, or the process dies, ``path`` keeps its previous content (or stays absent); the
    temporary file is removed on an exception and ignored by every trainwise loader if it is left behind.
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise TrainwiseError(f"{path} is a directory; give a file name to write to.")
    if not folder.is_dir():
        raise TrainwiseError(f"folder {folder} does not exist; create it first or choose another path.")
    temp = folder / f".{path.name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(temp, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    _fsync_folder(folder)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda file: file.write(data))


def atomic_write_json(path: str | os.PathLike[str], value: Any, *, sort_keys: bool = True) -> Path:
    """Write ``value`` as indented JSON to ``path`` atomically (values JSON lacks are written as strings)."""
    text = json.dumps(value, indent=2, sort_keys=sort_keys, default=str) + "\n"
    return atomic_write_bytes(path, text.encode())


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, path)`` done atomically (see :func:`atomic_write`)."""
    import torch

    return atomic_write(path, lambda file: torch.save(obj, file))


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


def check_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it is a non-empty regular file; otherwise one sentence saying what it is."""
    path = Path(path)
    if not path.exists():
        raise TrainwiseError(f"{path} does not exist; check the path.")
    if path.is_dir():
        raise TrainwiseError(f"{path} is a directory, not a checkpoint file; pass a file inside it.")
    if not path.is_file():
        raise TrainwiseError(f"{path} is not a regular file; pass a checkpoint file.")
    if path.stat().st_size == 0:
        raise TrainwiseError(f"{path} is empty (0 bytes), probably from an interrupted write; use another checkpoint.")
    return path


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"torch-zip"``, ``"torch-legacy"`` or ``"safetensors"``; anything else is a :class:`TrainwiseError`.

    Only the first bytes are read (and, for safetensors, the JSON header): nothing is unpickled.
    """
    path = check_file(path)
    size = path.stat().st_size
    with open(path, "rb") as file:
        head = file.read(16)
        if head.startswith(_ZIP_MAGIC):
            return TORCH_ZIP
        if len(head) >= 14 and head[0] == 0x80 and head[2:14] == _LEGACY_MAGIC:
            return TORCH_LEGACY
        if len(head) >= 9 and head[8:9] == b"{":
            (header_len,) = struct.unpack("<Q", head[:8])
            if 8 + header_len <= size and header_len < 100_000_000:
                return SAFETENSORS
            raise TrainwiseError(
                f"{path} looks like a safetensors file but is truncated ({size} bytes, header says "
                f"{8 + header_len} at least); use another copy."
            )
    if head[:1] == b"\x80":
        raise TrainwiseError(
            f"{path} is a plain Python pickle, not a torch or safetensors checkpoint, and unpickling it could "
            "run arbitrary code; re-save the weights with torch.save(model.state_dict(), path) where it came from."
        )
    if head.lstrip()[:1] in (b"{", b"["):
        raise TrainwiseError(
            f"{path} is a JSON/text file, not a checkpoint; pass a .pt, .pth, .bin or .safetensors file."
        )
    raise TrainwiseError(
        f"{path} is not a checkpoint in any format trainwise reads (torch zip, torch legacy, safetensors); "
        "check that the file is complete and is the right one."
    )


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Cheap check that a torch zip checkpoint is whole (its zip directory, at the end, reads back)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") or name == "data.pkl" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _safetensors_torch() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise TrainwiseError(
            "reading or writing .safetensors files needs the safetensors package; install it with "
            "pip install trainwise[safetensors]."
        ) from None
    return safetensors.torch


def safe_load(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> Any:
    """Load a torch or safetensors file without ever unpickling arbitrary objects.

    torch files are read with ``weights_only=True``. A file that needs any other class is refused with a
    :class:`TrainwiseError` that names the class and how to allow it (``torch.serialization.add_safe_globals``)
    if, and only if, the file is trusted. Corrupt, truncated, empty, foreign or missing files are refused with
    one sentence each.
    """
    import pickle

    import torch

    path = Path(path)
    kind = detect_format(path)
    if kind == SAFETENSORS:
        st = _safetensors_torch()
        try:
            return st.load_file(str(path), device=str(map_location) if map_location is not None else "cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError for corrupt files
            raise TrainwiseError(f"{path} is a corrupt or truncated safetensors file ({_first_line(exc)}).") from None
    if kind == TORCH_ZIP and not is_complete(path):
        if zipfile.is_zipfile(path):
            raise TrainwiseError(f"{path} is a zip archive but not a torch checkpoint (it has no data.pkl).")
        raise TrainwiseError(
            f"{path} is truncated or corrupt (its zip directory is missing), probably from an interrupted copy "
            "or write; use another checkpoint."
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TrainwiseError(_refusal(path, kind, exc)) from None
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError, TypeError) as exc:
        raise TrainwiseError(
            f"{path} could not be read as a torch checkpoint ({_first_line(exc)}); it is probably truncated or "
            "corrupt, so use another copy."
        ) from None


def unsafe_globals(path: str | os.PathLike[str]) -> list[str]:
    """The classes and functions a torch zip file needs beyond torch's ``weights_only`` allowlist (none run)."""
    import torch

    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception:
        return []


def _refusal(path: Path, kind: str, exc: BaseException) -> str:
    names = unsafe_globals(path) if kind == TORCH_ZIP else []
    if not names:
        names = _UNSAFE_GLOBAL.findall(str(exc))
    if not names:
        return (
            f"{path} needs arbitrary unpickling to load ({_first_line(exc)[-120:]}), which could run code, so it "
            "was refused; load only the weights from a trusted copy or re-save them as a state dict."
        )
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"{path} needs arbitrary unpickling to load (it holds {shown}), which could run code, so nothing from it "
        f"was loaded; if you trust this file, allow the class first with "
        f"torch.serialization.add_safe_globals([{names[0]}])."
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = [
    "SAFETENSORS",
    "TORCH_LEGACY",
    "TORCH_ZIP",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_file",
    "detect_format",
    "is_complete",
    "is_temp_file",
    "safe_load",
    "unsafe_globals",
]
