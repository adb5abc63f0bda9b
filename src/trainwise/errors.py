"""The one exception type for user mistakes: its message is a single sentence that names the fix."""

from __future__ import annotations

import os
import re
import reprlib
from pathlib import Path
from typing import Any


class TrainwiseError(ValueError):
    """A user mistake (bad input, bad configuration). The CLI prints it without a traceback and exits 2."""


class UnknownOptionError(TrainwiseError, TypeError):
    """An option name that does not exist (``Trainer(epocs=3)``): a ``TypeError``, as Python's own unexpected
    keyword is, whose sentence names the closest option."""


class NonFiniteLossError(TrainwiseError):
    """The training loss became NaN or infinite; carries the global step where it first happened."""

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


class DiskWriteError(TrainwiseError, OSError):
    """A file could not be written: the disk is full, a file size limit or a quota was reached, the folder is
    read-only, not writable or missing. ``.path`` is the file that was being written, ``.errno`` the OS error number.

    It is also an :class:`OSError` (with ``errno``, ``strerror`` and ``filename``), so code that handles a
    failed write as an OSError keeps working; its message is still one sentence.
    """

    def __init__(self, message: str, *, path: os.PathLike[str] | str, errno: int | None, strerror: str = "") -> None:
        OSError.__init__(self, errno, strerror or message, str(path))
        self.args = (message,)
        self.message = message
        self.path = Path(path)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (multiprocessing, distributed error reporting)
        return (_disk_write_error, (self.message, str(self.path), self.errno, self.strerror or ""))


def _disk_write_error(message: str, path: str, errno: int | None, strerror: str) -> DiskWriteError:
    return DiskWriteError(message, path=path, errno=errno, strerror=strerror)


# C0 and C1 control characters, DEL, line and paragraph separators, bidirectional overrides, lone surrogates
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: Any, limit: int | None = 200) -> str:
    """``text`` safe to print on a terminal: control characters escaped (``\\x1b``), at most ``limit`` characters.

    For values that come from a file or a user (names, versions, keys, option values) and end up in a message:
    a crafted file must not be able to clear the screen, move the cursor or fake lines of output, and a huge
    value (a 10,000-digit integer, a megabyte string, a tensor) must not make the message huge or fail.
    Anything that is not a string is shown by a repr that cannot fail.
    """
    if not isinstance(text, str):
        text = _safe_repr(text)
    text = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}... ({len(text):,} characters)"
    return text


class _ShortRepr(reprlib.Repr):
    """reprlib with integers of any size (repr() refuses over 4300 digits) and tensors shown by their shape."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 3, 160, 80, 60
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = 8

    def repr1(self, x: Any, level: int) -> str:
        if type(x).__module__.startswith("torch"):
            shape = getattr(x, "shape", None)
            return f"<{type(x).__name__}{'' if shape is None else ' of shape ' + str(tuple(shape))}>"
        return super().repr1(x, level)

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<{'negative ' if x < 0 else ''}integer of {x.bit_length()} bits>"
        return repr(x)


def _safe_repr(value: Any) -> str:
    """repr() that cannot fail or explode: huge integers, long strings, deep containers, tensors."""
    try:
        return _ShortRepr().repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def show(value: Any, limit: int = 200) -> str:
    """``repr(value)`` for a message: safe to print (see :func:`printable`), short, and never failing."""
    return printable(_safe_repr(value), limit)

_VOWEL_SOUND_LETTERS = "AEFHILMNORSX"  # the letters whose names start with a vowel sound: an MLP, an LSTM, a CNN


def with_article(word: str) -> str:
    """``word`` after its indefinite article, chosen by sound: an ImageClassifierOutput, a SequenceClassifierOutput,
    an int, a dict, an MLP, a USBDevice, a UnionType (the one helper every message uses)."""
    if word[:2].isupper() and word[:2].isalpha():  # an acronym is spelled out letter by letter
        return f"{'an' if word[0] in _VOWEL_SOUND_LETTERS else 'a'} {word}"
    lower = word.lower()
    if lower.startswith(("uni", "use", "usu", "uti", "eu", "one")):
        return f"a {word}"
    if lower.startswith(("hour", "honest", "honor", "heir")):
        return f"an {word}"
    return f"{'an' if lower[:1] in tuple('aeiou') else 'a'} {word}"


def first_line(exc: BaseException | None, limit: int = 300) -> str:
    """The first non-empty line of an exception's message, without its final period, at most ``limit``
    characters (its type's name when it has no message): how a message quotes an error it caught."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] if exc is not None else []
    return (lines[0] if lines else type(exc).__name__).rstrip(".")[:limit]
