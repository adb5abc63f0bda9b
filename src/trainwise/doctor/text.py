"""Lines as Python's tokenizer sees them: only ``\\n``, ``\\r\\n`` and a lone ``\\r`` end a line.

``str.splitlines`` also splits on ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029, which may
sit inside string literals (and ``\\f`` in indentation) without ending a line; splitting on them shifts every
later line number and column.
"""

from __future__ import annotations

import re

LINE_BREAK = re.compile(r"\r\n|\r|\n")
# A text longer than this (in characters, a notebook's code cells joined) is not checked: one TW900 finding says
# so. Real files stay far below it (the largest of torch and transformers are under 1 MB); the analysis takes
# seconds per megabyte, so a generated file of hundreds of megabytes would hold the run for minutes.
MAX_SOURCE = 10_000_000
_LINE_WITH_END = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def split_lines(text: str, *, keepends: bool = False) -> list[str]:
    """``text.splitlines(keepends)``, but split only at ``\\n``, ``\\r\\n`` and ``\\r``."""
    if keepends:
        return _LINE_WITH_END.findall(text)
    lines = LINE_BREAK.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


__all__ = ["LINE_BREAK", "MAX_SOURCE", "split_lines"]
