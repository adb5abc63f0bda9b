"""Checkpoint files: atomic torch saves, format detection, and loading that never runs code from the file.

Writes go through :mod:`trainwise.files` (a kill or a full disk never leaves a half-written checkpoint).
Every torch file is read with ``weights_only=True``: a file that needs a class outside torch's allowlist is
refused before anything in it runs, with the class named and how to allow it if the file is trusted.
"""

from __future__ import annotations

import os
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

from trainwise.errors import TrainwiseError, printable
from trainwise.files import atomic_write

# What `detect_format` returns for a readable file.
TORCH_ZIP = "torch-zip"  # torch.save since 1.6
TORCH_LEGACY = "torch-legacy"  # torch.save(..., _use_new_zipfile_serialization=False)
SAFETENSORS = "safetensors"

_ZIP_MAGIC = b"PK\x03\x04"
# torch's legacy format starts with a pickled magic number: \x80 <protocol> then these bytes.
_LEGACY_MAGIC = b"\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"
_UNSAFE_GLOBAL = re.compile(r"GLOBAL ([\w.]+) was not an allowed global")


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, path)`` done atomically (see :func:`trainwise.files.atomic_write`)."""
    import torch

    return atomic_write(path, lambda file: torch.save(obj, file))


def check_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it is a non-empty regular file; otherwise one sentence saying what it is."""
    path = Path(path)
    try:
        if not path.exists():
            raise TrainwiseError(f"{path} does not exist; check the path.")
        if path.is_dir():
            raise TrainwiseError(f"{path} is a directory, not a checkpoint file; pass a file inside it.")
        if not path.is_file():
            raise TrainwiseError(f"{path} is not a regular file; pass a checkpoint file.")
        size = path.stat().st_size
    except OSError as exc:  # a folder on the way that may not be searched, a name too long...
        raise _unreadable(path, exc) from None
    if size == 0:
        raise TrainwiseError(f"{path} is empty (0 bytes), probably from an interrupted write; use another checkpoint.")
    return path


def _unreadable(path: Path, exc: OSError) -> TrainwiseError:
    return TrainwiseError(f"{path} could not be read ({exc.strerror or exc}); check the path and its permissions.")


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"torch-zip"``, ``"torch-legacy"`` or ``"safetensors"``; anything else is a :class:`TrainwiseError`.

    Only the first bytes are read (and, for safetensors, the JSON header): nothing is unpickled.
    """
    path = check_file(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            head = file.read(16)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if head.startswith(_ZIP_MAGIC):
        return TORCH_ZIP
    if len(head) >= 14 and head[0] == 0x80 and head[2:14] == _LEGACY_MAGIC:
        return TORCH_LEGACY
    if len(head) >= 9 and head[8:9] == b"{":
        (header_len,) = struct.unpack("<Q", head[:8])
        if 8 + header_len <= size and header_len < 100_000_000:
            return SAFETENSORS
        if 8 + header_len <= size:
            raise TrainwiseError(
                f"{path} looks like a safetensors file but is corrupt (its header claims {header_len:,} bytes, "
                "more than safetensors allows); use another copy."
            )
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

    The format is found from the content, not the name (a file whose name says otherwise loads, with a
    warning). torch files are read with ``weights_only=True``. A file that needs any other class is refused
    with a :class:`TrainwiseError` that names the class and how to allow it
    (``torch.serialization.add_safe_globals``) if, and only if, the file is trusted and the class can be
    allowed at all. Corrupt, truncated, empty, foreign or missing files, zip directories that declare more
    data than the file holds, and every other failure to read are refused with one sentence each.
    """
    import pickle

    import torch

    path = Path(path)
    kind = detect_format(path)
    mismatch = name_mismatch(path, kind)
    if mismatch:
        warnings.warn(f"{path} {mismatch}; it was read by its content.", UserWarning, stacklevel=2)
    if kind == SAFETENSORS:
        st = _safetensors_torch()
        try:
            return st.load_file(str(path), device=str(map_location) if map_location is not None else "cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError for corrupt files
            raise TrainwiseError(
                f"{path} is a corrupt or truncated safetensors file ({_reason(exc)}); use another copy."
            ) from None
    if kind == TORCH_ZIP:
        _check_zip(path)
    try:
        if path.suffix.lower() == ".safetensors":  # torch.load would pick safetensors by the name
            with open(path, "rb") as file:
                return torch.load(file, map_location=map_location, weights_only=True)
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TrainwiseError(_refusal(path, kind, exc)) from None
    except Exception as exc:  # anything else a damaged or crafted file makes torch raise
        what = "torch checkpoint" if mismatch is None else f"torch checkpoint ({mismatch})"
        raise TrainwiseError(
            f"{path} could not be read as a {what} ({_reason(exc)}); it is probably truncated or corrupt, so "
            "use another copy."
        ) from None


_FORMAT_NAMES = {TORCH_ZIP: "torch zip checkpoint", TORCH_LEGACY: "torch checkpoint in the legacy format",
                 SAFETENSORS: "safetensors file"}
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def name_mismatch(path: str | os.PathLike[str], kind: str) -> str | None:
    """``"is a torch zip checkpoint, although it is named .safetensors"`` when the suffix says another format."""
    suffix = Path(path).suffix.lower()
    claims_safetensors = suffix == ".safetensors"
    if claims_safetensors == (kind == SAFETENSORS) or (not claims_safetensors and suffix not in _TORCH_SUFFIXES):
        return None
    return f"is a {_FORMAT_NAMES[kind]}, although it is named {suffix}"


def _check_zip(path: Path) -> None:
    """Refuse a torch zip whose directory is missing, has no data.pkl, or declares more than the file holds."""
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except Exception:  # BadZipFile, and whatever a crafted directory makes zipfile raise
        raise TrainwiseError(
            f"{path} is truncated or corrupt (its zip directory is missing or unreadable), probably from an "
            "interrupted copy or write; use another checkpoint."
        ) from None
    if not any(m.filename.endswith("/data.pkl") or m.filename == "data.pkl" for m in members):
        raise TrainwiseError(f"{path} is a zip archive but not a torch checkpoint (it has no data.pkl).")
    declared = sum(m.file_size for m in members)
    beyond = [m for m in members if m.header_offset + m.compress_size > size]
    if beyond or declared > 16 * size + (1 << 20):  # torch stores members uncompressed: never more than the file
        raise TrainwiseError(
            f"{path} is corrupt: its zip directory declares {declared:,} bytes of content in a {size:,}-byte file, "
            "so nothing was loaded; use another copy."
        )


def unsafe_globals(path: str | os.PathLike[str]) -> list[str]:
    """The classes and functions a torch zip file needs beyond torch's ``weights_only`` allowlist (none run)."""
    import torch

    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception:
        return []


_BLOCKED_GLOBAL = re.compile(r"GLOBAL (\S+) whose module \S+ is blocked")
# Words in the weights_only unpickler's refusal when the file asks for code to run (anything else it refuses,
# such as "Unsupported operand" or "String is too long", is malformed data).
_UNSAFE_REASONS = ("GLOBAL", "reduce", "create new object", "build")


def _blocked_modules() -> tuple[str, ...]:
    try:
        from torch._weights_only_unpickler import _blocklisted_modules
    except ImportError:  # pragma: no cover - a future torch
        return ("sys", "os", "posix", "nt")
    return tuple(_blocklisted_modules)


# Globals that run code or reach the system by design: a checkpoint that needs one is an attack or a mistake,
# and the advice to allow it with add_safe_globals must never be given.
_CODE_MODULES = ("subprocess", "shutil", "importlib", "pickle", "_pickle", "marshal", "runpy", "ctypes", "code",
                 "codeop", "pty", "socket", "multiprocessing", "webbrowser", "commands", "popen2")
_CODE_NAMES = ("exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr", "open", "breakpoint",
               "input", "globals", "locals", "vars", "exit", "quit", "io.open", "_io.open", "codecs.open",
               "operator.attrgetter", "operator.methodcaller", "types.FunctionType", "types.CodeType",
               "types.LambdaType", "types.MethodType")


def _runs_code(name: str) -> bool:
    module = name.split(".")[0]
    if module in _blocked_modules() or module in _CODE_MODULES:
        return True
    return name.removeprefix("builtins.").removeprefix("__builtin__.") in _CODE_NAMES


def _refusal(path: Path, kind: str, exc: BaseException) -> str:
    text = str(exc)
    reason = _reason(exc)
    names = unsafe_globals(path) if kind == TORCH_ZIP else []
    names = names or _UNSAFE_GLOBAL.findall(text) + _BLOCKED_GLOBAL.findall(text)
    names = [printable(name, 120) for name in dict.fromkeys(names)]
    dangerous = [name for name in names if _runs_code(name)]
    if dangerous:
        return (
            f"{path} holds {_listed(dangerous)}, from a module or function that can run arbitrary code (torch "
            "refuses os, sys, posix and nt even when allowed), so nothing from it was loaded and it must not be "
            "loaded unsafely; get the weights from a trusted source as a state dict or a .safetensors file."
        )
    if names:
        return (
            f"{path} needs arbitrary unpickling to load (it holds {_listed(names)}), which could run code, so "
            f"nothing from it was loaded; if you trust this file, allow the class first with "
            f"torch.serialization.add_safe_globals([{names[0]}])."
        )
    if not any(word in reason for word in _UNSAFE_REASONS):  # Unsupported operand, String is too long...
        return (
            f'{path} is corrupt or was not written by torch.save (weights_only loading stopped at "{reason}"), so '
            "nothing from it was loaded; use another copy."
        )
    return (
        f'{path} needs arbitrary unpickling to load (weights_only loading stopped at "{reason}"), which could '
        "run code, so nothing from it was loaded; load only the weights from a trusted copy or re-save them as "
        "a state dict."
    )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


# torch's own framing around the unpickler's message (see torch.load's _get_wo_message)
_TORCH_FRAMING = ("(1)", "(2)", "Check the documentation", "Please file an issue", "In PyTorch 2.6",
                  "This file can still be loaded", "Re-running `torch.load`")


def _reason(exc: BaseException) -> str:
    """The first whole sentence of what went wrong, with torch's advice around it left out, made printable."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line.startswith("WeightsUnpickler error:"):
            line = line.removeprefix("WeightsUnpickler error:").strip()
        if line.startswith("Weights only load failed."):
            line = line.removeprefix("Weights only load failed.").strip()
        if not line or line.startswith(_TORCH_FRAMING):
            continue
        sentence = _shorten_tokens(printable(_first_sentence(line), None))
        if len(sentence) > 600:  # no real message is this long: cut a crafted one at a word
            sentence = sentence[:sentence.rfind(" ", 0, 500) if " " in sentence[:500] else 500] + " ..."
        return sentence
    return type(exc).__name__


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.!?])(?=\s|$)", text)
    return match.group(1) if match else text


def _shorten_tokens(text: str, longest: int = 120) -> str:
    """Whole sentences stay whole; only a single word longer than ``longest`` (a crafted name) is shortened."""
    return re.sub(rf"\S{{{longest + 1},}}", lambda m: f"{m.group()[:longest - 20]}...({len(m.group())} chars)", text)


__all__ = [
    "SAFETENSORS",
    "TORCH_LEGACY",
    "TORCH_ZIP",
    "atomic_torch_save",
    "check_file",
    "detect_format",
    "is_complete",
    "name_mismatch",
    "printable",
    "safe_load",
    "unsafe_globals",
]
