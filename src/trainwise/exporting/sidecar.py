"""The JSON sidecar ``<artifact>.json`` that export writes beside an artifact: where it is, and reading it back
checked, since it may come with an artifact from elsewhere."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import torch

from trainwise.errors import TrainwiseError, first_line
from trainwise.exporting.common import FORMATS

SIDECAR_VERSION = 1
_SIDECAR_LIMIT = 1 << 20  # bytes: export writes a few KiB
_SIDECAR_MAX_SPECS = 1024  # inputs or outputs


def _sidecar_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".json")


def refuse_replacing_another_file(artifact: Path, suffix: str) -> None:
    """Before anything is written: the sidecar path of ``artifact`` must be free or hold a sidecar that export
    wrote (an earlier export of the same artifact), never a user's file that happens to have its name
    (``--output model`` would write ``model.json``); ``suffix`` is the format's, for the advice."""
    sidecar = _sidecar_path(artifact)
    try:
        mode = os.lstat(sidecar).st_mode
    except FileNotFoundError:
        return
    except OSError:
        mode = 0  # cannot be looked at: refused below, as another file
    if stat.S_ISREG(mode):
        try:
            if _sidecar_problem(_read_sidecar(artifact)) is None:
                return
        except TrainwiseError:
            pass
    fix = f"give the artifact a suffix, such as {artifact}{suffix}" if not artifact.suffix else \
        "export to another path"
    raise TrainwiseError(f"the sidecar of {artifact} would be {sidecar}, which exists and is not a sidecar trainwise "
                         f"export wrote; {fix}, or move {sidecar} away.")


def _read_sidecar(artifact: Path) -> dict[str, Any]:
    """The sidecar's metadata, checked (it may come with an artifact from elsewhere); {} when there is none."""
    sidecar = _sidecar_path(artifact)
    if not sidecar.is_file():
        return {}
    try:
        if sidecar.stat().st_size > _SIDECAR_LIMIT:
            raise TrainwiseError(
                f"sidecar {sidecar} is over 1 MiB, far more than export writes; delete it or export again."
            )
        data = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise TrainwiseError(
            f"sidecar {sidecar} is unreadable ({type(exc).__name__}: {first_line(exc)}); delete it or export again."
        ) from None
    problem = _sidecar_problem(data)
    if problem:
        raise TrainwiseError(f"sidecar {sidecar} is malformed ({problem}); delete it or export the model again.")
    return data


def _sidecar_problem(data: Any) -> str | None:
    """What is wrong with a sidecar's structure, as a clause; None when it is what :func:`export` writes."""
    if not isinstance(data, dict):
        return f"its top level is a JSON {type(data).__name__}, not an object"
    for key in ("format", "inputs", "outputs"):
        if key not in data:
            return f"the key {key!r} is missing"
    if data["format"] not in FORMATS:
        return f"format is {str(data['format'])[:40]!r}, not one of {', '.join(FORMATS)}"
    for key in ("single_output", "dynamic_batch"):
        if key in data and not isinstance(data[key], bool):
            return f"{key} must be true or false"
    for key in ("inputs", "outputs"):
        specs = data[key]
        if not isinstance(specs, list) or len(specs) > _SIDECAR_MAX_SPECS:
            return f"{key} must be a list of at most {_SIDECAR_MAX_SPECS} tensor specs"
        for position, spec in enumerate(specs):
            where = f"{key}[{position}]"
            if not isinstance(spec, dict):
                return f"{where} must be an object with name, shape and dtype"
            name, shape, dtype = spec.get("name"), spec.get("shape"), spec.get("dtype")
            if not isinstance(name, str) or not 0 < len(name) <= 200:
                return f"{where}.name must be a non-empty string"
            if not isinstance(dtype, str) or not isinstance(vars(torch).get(dtype), torch.dtype):
                return f"{where}.dtype must name a torch dtype such as 'float32'"
            sizes_ok = isinstance(shape, list) and len(shape) <= 64
            if not sizes_ok or not all((isinstance(size, str) and size.isidentifier() and len(size) <= 40)
                                       or (type(size) is int and size >= 0) for size in shape):
                return f"{where}.shape must be a list of sizes and names of free dimensions ('batch')"
    return None
