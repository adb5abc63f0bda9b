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


_VOWEL_SOUND_LETTERS = "AEFHILMNORSX"  # the letters whose names start with a vowel sound: an MLP, an LSTM, a CNN


def _a(word: str) -> str:
    """``word`` after its indefinite article, chosen by sound: an ImageClassifierOutput, a SequenceClassifierOutput,
    an int, a dict, an MLP, a USBDevice, a UnionType."""
    if word[:2].isupper() and word[:2].isalpha():  # an acronym is spelled out letter by letter
        return f"{'an' if word[0] in _VOWEL_SOUND_LETTERS else 'a'} {word}"
    lower = word.lower()
    if lower.startswith(("uni", "use", "usu", "uti", "eu", "one")):
        return f"a {word}"
    if lower.startswith(("hour", "honest", "honor", "heir")):
        return f"an {word}"
    return f"{'an' if lower[:1] in tuple('aeiou') else 'a'} {word}"


def _shape_text(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__).rstrip(".")[:300]


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
