"""Jupyter notebooks: the code cells joined into one module (imports of cell 1 count in cell 5), IPython
magics blanked out, and findings mapped back to (cell, line)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from trainwise.doctor.analysis import analyse, parse, parse_error, too_large
from trainwise.doctor.rule import Finding, Rule

if TYPE_CHECKING:
    from trainwise.doctor.program import Program
from trainwise.doctor.text import split_lines

# Line magics, shell escapes, `?obj` help and `x = !cmd` / `x = %magic` assignments: not Python. Only a line
# that starts a statement is one (see `_Scanner`); `obj?` help is found by the scanner, which knows where the
# code of a line ends and its comment begins.
_MAGIC_LINE = re.compile(r"^(\s*)(?:[%!?]|\w+\s*=\s*[%!])")
_PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun", "%%debug")


@dataclass
class NotebookSource:
    """The joined Python source and, for each of its lines, the (cell number, line in cell) it came from."""

    source: str
    origin: list[tuple[int, int]]  # index: virtual line - 1

    def locate(self, line: int) -> tuple[int, int]:
        """Cell number (1-based, counting every cell) and line within that cell of a virtual line."""
        if 0 < line <= len(self.origin):
            return self.origin[line - 1]
        return self.origin[-1] if self.origin else (1, 1)


def cell_sources(data: bytes) -> list[tuple[int, str]]:
    """(cell number, source) of each code cell; raises ValueError for a file that is not a notebook."""
    try:
        notebook = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not a notebook (invalid JSON: {exc})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise ValueError("not a notebook (no list of cells)")
    out = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(str(part) for part in source)
        if isinstance(source, str):
            out.append((number, source))
    return out


def join_cells(cells: Sequence[tuple[int, str]]) -> NotebookSource:
    """One module from the code cells, magics replaced by ``pass`` so that line numbers stay put."""
    lines: list[str] = []
    origin: list[tuple[int, int]] = []
    for number, source in cells:
        cell_lines = split_lines(source) or [""]  # not str.splitlines, which splits at U+2028 too
        skip_cell = cell_lines[0].lstrip().startswith("%%") and not cell_lines[0].lstrip().startswith(
            _PYTHON_CELL_MAGICS
        )
        scanner = _Scanner()
        for i, text in enumerate(cell_lines, start=1):
            if skip_cell or (i == 1 and text.lstrip().startswith("%%")):
                text = ""
            elif scanner.at_statement_start():
                match = _MAGIC_LINE.match(text)
                if match is not None or scanner.help_line(text):
                    text = f"{text[: len(text) - len(text.lstrip())]}pass"
                else:
                    scanner.feed(text)
            else:
                scanner.feed(text)  # continues a bracket, a string or a backslash: never a magic
            lines.append(text)
            origin.append((number, i))
    return NotebookSource("\n".join(lines) + "\n", origin)


class _Scanner:
    """Where a cell's code stands at the end of each line: inside brackets, inside a string that goes on to
    the next line (triple-quoted, or a backslash before the newline), after a line-continuing backslash. A line
    that starts while any of these is open continues a statement and is never an IPython magic or help line,
    whatever it ends with (``nn.Linear(512, 10),  # how many classes?``)."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""  # the delimiter of the open string (a quote, or three), empty when none
        self.backslash = False

    def at_statement_start(self) -> bool:
        return self.depth == 0 and not self.quote and not self.backslash

    def help_line(self, text: str) -> bool:
        """``obj?``, ``obj.attr??`` or ``?obj`` (``%pinfo obj`` is a magic): at statement start, the code of
        the line (its comment left out, strings skipped) begins or ends with ``?``, which no Python line does."""
        if "?" not in text:
            return False  # most lines: no need to scan them
        probe = _Scanner()
        last = probe.feed(text)
        return last == "?" and probe.at_statement_start()

    def feed(self, text: str) -> str:
        """Advance over one line; return its last character of code (outside strings and comments). Runs of
        characters that change nothing but the last one are skipped at once (a regular expression)."""
        last = ""
        i, n = 0, len(text)
        self.backslash = False
        plain = _PLAIN_RUN.match
        while i < n:
            if not self.quote:
                run = plain(text, i)
                if run is not None:
                    code = run.group().rstrip()
                    if code:
                        last = code[-1]
                    i = run.end()
                    if i >= n:
                        break
            if self.quote:
                end = self._string_end(text, i)
                if end < 0:
                    if len(self.quote) == 1 and not text.endswith("\\"):
                        self.quote = ""  # an unterminated one-line string: Python's error, not ours to follow
                    return last
                i = end
                self.quote = ""
                last = '"'
                continue
            ch = text[i]
            if ch == "#":
                break
            if ch in "'\"":
                self.quote = ch * 3 if text.startswith(ch * 3, i) else ch
                i += len(self.quote)
                continue
            if ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                self.depth = max(0, self.depth - 1)
            elif ch == "\\" and i == n - 1:
                self.backslash = True
                return last
            if not ch.isspace():
                last = ch
            i += 1
        return last

    def _string_end(self, text: str, i: int) -> int:
        """Index just past the closing delimiter of the open string, or -1 if it goes on past this line."""
        quote = self.quote
        search = _STRING_STOPS[quote[0]].search
        while True:
            stop = search(text, i)
            if stop is None:
                return -1
            i = stop.start()
            if text[i] == "\\":
                i += 2  # an escaped character, whatever it is
                continue
            if text.startswith(quote, i):
                return i + len(quote)
            i += 1


# Characters the scanner passes over one by one to no effect but to be the last of the line's code; and, inside a
# string, where it may end (its quote, or a backslash escaping what follows).
_PLAIN_RUN = re.compile(r"[^#'\"()\[\]{}\\]+")
_STRING_STOPS = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}


def check_notebook(data: bytes, path: str, *, rules: Sequence[type[Rule]],
                   program: Program | None = None) -> tuple[list[Finding], bool]:
    """Findings of a notebook's code cells, located by cell and line. A cell that does not parse gets one
    TW900 finding and is left out; the other cells are still checked. ``program``: the files of the run."""
    try:
        cells = cell_sources(data)
    except ValueError as exc:
        return [parse_error(path, f"cannot read notebook: {exc}")], False
    errors: list[Finding] = []
    alone_checked = False
    taken_out = 0
    reparsed = 0  # characters parsed again after taking cells out
    while True:
        joined = join_cells(cells)
        skipped = too_large(path, len(joined.source))
        if skipped is not None:
            return [skipped], False
        findings, parsed = analyse(joined.source, path, rules=rules, program=program)
        broken = [f for f in findings if f.code == "TW900"] if not parsed else []
        for finding in findings:
            finding.cell, finding.line = joined.locate(finding.line)
            finding.fix = None  # --fix does not rewrite notebooks (yet): their findings are reported only
            finding.related = tuple(replace(r, cell=c, line=n) if r.path == path and r.cell is None else r
                                    for r in finding.related for c, n in [joined.locate(r.line)])
        if not broken:
            return sorted(errors + findings, key=Finding.sort_key), not errors
        if not alone_checked:
            # Jupyter runs one cell at a time, so a cell must parse on its own: find every such broken cell in
            # one pass (taking them out one by one, parsing the rest again each time, is quadratic).
            alone_checked = True
            alone = _broken_cells(cells, path)
            if alone:
                errors.extend(alone)
                bad = {f.cell for f in alone}
                cells = [(n, s) for n, s in cells if n not in bad]
                continue
        errors.extend(broken)
        bad_cell = broken[0].cell
        remaining = [(n, s) for n, s in cells if n != bad_cell]
        taken_out += 1
        reparsed += len(joined.source)
        if len(remaining) == len(cells) or taken_out > _MAX_TAKEN_OUT or reparsed > _MAX_REPARSED:
            return sorted(errors, key=Finding.sort_key), False  # cannot tell which cell, or too many: give up
        cells = remaining


# Cells that parse alone but not together, should there be any, are taken out one at a time; past this many
# the rest of the notebook is left unchecked rather than parsed again and again.
_MAX_TAKEN_OUT = 100
_MAX_REPARSED = 50_000_000  # nor parsed again past this many characters in all (a huge notebook: fewer times)


def _broken_cells(cells: Sequence[tuple[int, str]], path: str) -> list[Finding]:
    """A TW900 finding for each cell that does not parse on its own, located in that cell."""
    out = []
    for number, source in cells:
        single = join_cells([(number, source)])
        result = parse(single.source, path)
        if isinstance(result, Finding):
            result.cell, result.line = single.locate(result.line)
            out.append(result)
    return out
