"""Lines as Python's tokenizer sees them: only ``\\n``, ``\\r\\n`` and a lone ``\\r`` end a line.

``str.splitlines`` also splits on ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029, which may
sit inside string literals (and ``\\f`` in indentation) without ending a line; splitting on them shifts every
later line number and column.
"""

from __future__ import annotations

import re

LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_WITH_END = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def split_lines(text: str, *, keepends: bool = False) -> list[str]:
    """``text.splitlines(keepends)``, but split only at ``\\n``, ``\\r\\n`` and ``\\r``."""
    if keepends:
        return _LINE_WITH_END.findall(text)
    lines = LINE_BREAK.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


__all__ = ["LINE_BREAK", "split_lines"]
