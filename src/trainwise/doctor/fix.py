"""Applying fixes with libcst, so that formatting and comments survive; libcst is imported only here, lazily.

A finding's ``Fix`` names an ``ast`` node; the libcst node with the same source range and kind is handed to
the fix's transform. A file that does not parse is never modified, and neither is a result that would not.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Sequence
from typing import Any

from trainwise.doctor.rule import Finding, Fix
from trainwise.errors import TrainwiseError

# ast node class -> libcst node class name, where they differ or where several libcst nodes share a range.
_CST_KIND = {"Expr": "Expr", "Assign": "Assign", "Call": "Call", "Name": "Name", "Attribute": "Attribute",
             "Subscript": "Subscript", "keyword": "Arg", "Constant": "Name"}


def import_libcst() -> Any:
    """The libcst module, or a ``TrainwiseError`` that says how to install it."""
    try:
        import libcst
        import libcst.metadata
    except ImportError:
        raise TrainwiseError("--fix and --diff need libcst: pip install 'trainwise[fix]'.") from None
    return libcst


def _char_column(lines: list[str], line: int, byte_offset: int) -> int:
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    if text.isascii():
        return byte_offset
    return len(text.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace"))


def _key(node: ast.AST, lines: list[str]) -> tuple[int, int, int, int]:
    start, end = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
    return (start, _char_column(lines, start, node.col_offset),  # type: ignore[attr-defined]
            end, _char_column(lines, end, node.end_col_offset or 0))  # type: ignore[attr-defined]


def apply_fixes(source: str, fixes: Sequence[Fix]) -> tuple[str, int]:
    """Source with ``fixes`` applied, and how many applied. Unchanged if the source (or the result) does
    not parse, or a fix's node cannot be found."""
    if not fixes:
        return source, 0
    cst = import_libcst()
    from libcst.metadata import MetadataWrapper, PositionProvider

    try:
        ast.parse(source)
        module = cst.parse_module(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, cst.ParserSyntaxError):
        return source, 0
    lines = re.split(r"\r\n|\r|\n", source)
    wanted: dict[tuple[tuple[int, int, int, int], str], Fix] = {}
    for fix in fixes:
        kind = _CST_KIND.get(type(fix.node).__name__, type(fix.node).__name__)
        wanted.setdefault((_key(fix.node, lines), kind), fix)
    applied = 0

    class _Applier(cst.CSTTransformer):  # type: ignore[misc,name-defined]
        METADATA_DEPENDENCIES = (PositionProvider,)

        def on_leave(self, original: Any, updated: Any) -> Any:
            nonlocal applied
            pos = self.get_metadata(PositionProvider, original, None)
            if pos is None:
                return updated
            fix = wanted.pop(((pos.start.line, pos.start.column, pos.end.line, pos.end.column),
                              type(original).__name__), None)
            if fix is None:
                return updated
            try:
                replacement = fix.transform(updated, cst)
            except Exception:  # a transform that does not fit this node: leave the code as it is
                return updated
            applied += 1
            return replacement

    try:
        new = MetadataWrapper(module, unsafe_skip_copy=True).visit(_Applier()).code
        ast.parse(new)
    except (SyntaxError, ValueError, RecursionError, MemoryError, cst.CSTValidationError):
        return source, 0
    return new, applied


def fixes_to_apply(findings: Sequence[Finding], *, unsafe: bool) -> list[Fix]:
    """The fixes of ``findings`` that the flags allow (safe ones, and unsafe ones with ``--unsafe-fixes``)."""
    return [f.fix for f in findings if f.fix is not None and (f.fix.safe or unsafe)]


def unified_diff(path: str, before: str, after: str) -> str:
    """A unified diff of one file's fix."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
        )
    )
