"""Applying fixes with libcst, so that formatting and comments survive; libcst is imported only here, lazily.

A finding's ``Fix`` names an ``ast`` node; the libcst node with the same source range and kind is handed to
the fix's transform. A file that does not parse is never modified, and neither is a result that would not.
"""

from __future__ import annotations

import ast
import difflib
import errno
import os
import stat
from collections.abc import Sequence
from typing import Any

from trainwise.doctor.rule import Finding, Fix
from trainwise.doctor.text import LINE_BREAK, split_lines
from trainwise.errors import TrainwiseError, printable

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

    # libcst drops a final lone "\r" (old-Mac line ends): it gets "\n" there, and the "\r" comes back after.
    # A file of "\r" only gets "\n" everywhere (the same lines to Python). libcst takes the newline it inserts
    # from the first line, so a fix follows the file's own style.
    text, restore = source, None
    if source.endswith("\r"):
        if "\n" not in source:
            text, restore = source.replace("\r", "\n"), "all"
        elif not source.endswith("\r\r"):
            text, restore = source[:-1] + "\n", "last"
        else:
            return source, 0
    try:
        ast.parse(text)
        module = cst.parse_module(text)
        if module.code != text:  # libcst would not give the same bytes back (a form feed on line 1): leave it
            return source, 0
    except (SyntaxError, ValueError, RecursionError, MemoryError, cst.ParserSyntaxError):
        return source, 0
    lines = LINE_BREAK.split(text)
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
    if restore == "all":
        new = new.replace("\n", "\r")
    elif restore == "last":
        if not new.endswith("\n") or new.endswith("\r\n"):
            return source, 0
        new = new[:-1] + "\r"
    return new, applied


def fixes_to_apply(findings: Sequence[Finding], *, unsafe: bool) -> list[Fix]:
    """The fixes of ``findings`` that the flags allow (safe ones, and unsafe ones with ``--unsafe-fixes``)."""
    return [f.fix for f in findings if f.fix is not None and (f.fix.safe or unsafe)]


def unified_diff(path: str, before: str, after: str) -> str:
    """A unified diff of one file's fix."""
    return "".join(
        difflib.unified_diff(
            split_lines(before, keepends=True), split_lines(after, keepends=True), fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


# ------------------------------------------------------------------------------------------------ writing
_AGAIN = "run `trainwise doctor --fix` again"
# errno -> (what happened, what to do)
_WRITE_ERRORS = {
    errno.ENOSPC: ("the disk is full", f"free some space and {_AGAIN}"),
    getattr(errno, "EDQUOT", -1): ("the disk quota is exceeded", f"free some space and {_AGAIN}"),
    errno.EFBIG: ("the file size limit was reached", f"raise the limit (ulimit -f) and {_AGAIN}"),
    errno.EROFS: ("the file system is read-only", f"copy the files to a writable disk and {_AGAIN} there"),
    errno.EACCES: ("the folder is not writable (a fix writes a new file beside the old one and renames it over "
                   "it)", f"make the folder writable and {_AGAIN}"),
    errno.EPERM: ("the folder is not writable (a fix writes a new file beside the old one and renames it over "
                  "it)", f"make the folder writable and {_AGAIN}"),
}


def refusal_to_rewrite(path: str, given: Sequence[str]) -> str | None:
    """Why ``--fix`` must leave ``path`` alone, as a clause ("it is a symbolic link (to ...)"), or None when it
    may rewrite it: a regular file (not a link) named in ``given`` (the paths on the command line) or inside
    one of its folders once links are resolved, so that no fix lands outside what the user named. Asked again
    just before the write, which renames a new file over the name and so never follows a link either."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            return f"it is a symbolic link (to {printable(os.readlink(path))})"
        if not stat.S_ISREG(mode):
            return "it is no longer a regular file"
        real = os.path.realpath(path)
        for named in given:
            if os.path.normpath(named) == os.path.normpath(path):
                return None  # a file named on the command line (itself not a link)
            folder = os.path.realpath(named)
            if os.path.isdir(folder) and os.path.commonpath([folder, real]) == folder:
                return None
    except (OSError, ValueError) as exc:
        return f"it cannot be looked at ({getattr(exc, 'strerror', None) or type(exc).__name__})"
    return f"it is reached through a symbolic link, outside {printable(', '.join(given))}"


def write_fixed(path: str, data: bytes, *, fixed_before: int = 0) -> None:
    """Replace the content of ``path`` with ``data`` atomically, with ``trainwise.files.atomic_write``:
    a new file beside it with its permission bits, fsynced, renamed over the name, so a symbolic link there is
    replaced, never written through (``--fix`` skips links before: :func:`refusal_to_rewrite`). On any failure
    (a full disk, ``ulimit -f``, a read-only folder) the file keeps its old content and a one-line
    ``TrainwiseError`` names the file, the cause and what to do."""
    from trainwise.errors import TrainwiseError
    from trainwise.files import atomic_write_bytes  # imports no torch

    done = f" ({fixed_before} other file{'s' if fixed_before != 1 else ''} fixed before it)" if fixed_before else ""
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:  # DiskWriteError is an OSError with the errno
        reason, hint = _WRITE_ERRORS.get(exc.errno or 0) or (
            (exc.strerror or type(exc).__name__).lower(), f"check the disk and {_AGAIN}")
        raise TrainwiseError(f"could not rewrite {path}: {reason}; the file is unchanged{done}; {hint}.") from None
    except TrainwiseError as exc:  # the folder vanished, or the path became a folder
        raise TrainwiseError(f"could not rewrite {path}: {str(exc).rstrip('.')}; the file is unchanged{done}.") \
            from None
