"""What every part of export shares: the formats and their suffixes, the warning, optional imports, and the
wording of its one-sentence errors."""

from __future__ import annotations

import contextlib
import importlib
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Literal

from trainwise.errors import TrainwiseError

Format = Literal["torch.export", "torchscript", "onnx"]
FORMATS: tuple[str, ...] = ("torch.export", "torchscript", "onnx")
SUFFIXES = {"torch.export": ".pt2", "torchscript": ".torchscript", "onnx": ".onnx"}  # what the CLI writes
ONNX_INSTALL = "pip install trainwise[onnx]"


class ExportWarning(UserWarning):
    """An export that works but may not mean what the user expects (TorchScript fell back to tracing)."""


def _shape_text(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """Hide torch's "torch.jit.* is deprecated" warnings: the user asked for TorchScript (docs/export.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        yield


def _require(package: str, purpose: str) -> types.ModuleType:
    """Import an optional dependency, or say in one sentence how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise TrainwiseError(
            f"{purpose} needs the {package} package, which is not installed; {ONNX_INSTALL}."
        ) from None


def _installed(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True
