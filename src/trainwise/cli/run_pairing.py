"""Which static finding a runtime one confirms in ``trainwise run``'s report: by the code path that ran.

A pair has the same code in the same file. The closest pairs are taken first: the same line; then a static
finding in the function the run saw it in (the nearest line first); then one in a function of the user's that
called it (the frames on the stack when it was found); then the nearest line of the file, the doctor naming the
cause where the run sees it show (``self.blocks = [...]`` in ``__init__`` and the first ``model(x)``). A static
finding in a function that never ran is so never taken over one on the path that ran (docs/run.md).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainwise.doctor.rule import Finding

Scope = tuple[int, int]  # the first and last line of the innermost function or class; (0, 0) for module level
MODULE: Scope = (0, 0)


def pair(static: Sequence[Finding], rows: Sequence[dict[str, Any]],
         absolute: Callable[[str], str]) -> list[tuple[Finding, dict[str, Any]]]:
    """The (static finding, runtime row) pairs, each taken at most once, closest first. ``absolute`` turns a
    static finding's path into the rows' absolute form."""
    scopes: dict[str, Callable[[int], Scope]] = {}
    ranked = []
    for i, finding in enumerate(static):
        path = absolute(finding.path)
        scope_of = scopes.get(path) or scopes.setdefault(path, scopes_of(path))
        for j, row in enumerate(rows):
            if row["code"] == finding.code and row["path"] == path:
                ranked.append((*_closeness(row, finding.line, scope_of), finding.line, row["line"], i, j))
    pairs, taken_static, taken_rows = [], set(), set()
    for *_, i, j in sorted(ranked):
        if i not in taken_static and j not in taken_rows:
            taken_static.add(i)
            taken_rows.add(j)
            pairs.append((static[i], rows[j]))
    return pairs


def _closeness(row: dict[str, Any], line: int, scope_of: Callable[[int], Scope]) -> tuple[int, int]:
    """(rank, distance): 0 the same line, 1 the same function as the run's line, 2 the same function as a
    caller's line, 3 elsewhere in the file; the distance in lines to the line of that rank."""
    if row["line"] == line:
        return 0, 0
    own = scope_of(line)
    if scope_of(row["line"]) == own:
        return 1, abs(row["line"] - line)
    callers = [n for path, n in row.get("callers", ()) if path == row["path"] and scope_of(n) == own]
    if callers:
        return 2, min(abs(n - line) for n in callers)
    return 3, abs(row["line"] - line)


def scopes_of(path: str) -> Callable[[int], Scope]:
    """A function telling the innermost function or class that holds a line of ``path`` (every line is at module
    level when the file cannot be read or parsed)."""
    try:
        with open(path, "rb") as fh:  # bytes: the encoding cookie is read as python reads it
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return lambda line: MODULE
    spans = sorted((node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    def scope_of(line: int) -> Scope:
        inside = [span for span in spans if span[0] <= line <= span[1]]
        return max(inside) if inside else MODULE  # the one that starts last is the innermost

    return scope_of
