"""One source text checked: ``ast.parse`` (a ``TW900`` finding when it fails), every selected rule run in one
pass over the tree, ``# noqa`` applied. The engine (files, folders, configuration) and the notebook reader (cells
joined into one source) both check their text here.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Sequence

from trainwise.doctor.context import Context
from trainwise.doctor.program import Program
from trainwise.doctor.rule import Finding, Rule
from trainwise.doctor.text import LINE_BREAK, MAX_SOURCE

PARSE_ERROR = "TW900"
_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
# Set by the tests: a rule that raises makes the run fail instead of becoming a TW900 finding.
STRICT = os.environ.get("TRAINWISE_DOCTOR_STRICT") == "1"


def too_large(path: str, size: int) -> Finding | None:
    """The ``TW900`` finding that skips a text of ``size`` characters, or None when it is not too large."""
    if size <= MAX_SOURCE:
        return None
    return parse_error(path, f"skipped: {size:,} characters of code, more than the {MAX_SOURCE:,} the doctor "
                             f"checks in one file")


def parse_error(path: str, message: str, line: int = 1, column: int = 1, cell: int | None = None) -> Finding:
    """A ``TW900`` finding: the file could not be read or parsed."""
    return Finding(path, max(line, 1), max(column, 1), PARSE_ERROR, "unreadable-file", message, cell=cell)


def parse(source: str, path: str) -> ast.Module | Finding:
    """The ``ast`` of ``source``, or the ``TW900`` finding that says why it does not parse."""
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        return parse_error(path, f"syntax error: {exc.msg}", exc.lineno or 1, exc.offset or 1)
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes; too deeply nested to parse
        return parse_error(path, f"cannot parse: {_describe(exc)}")


def analyse(source: str, path: str, *, rules: Sequence[type[Rule]],
            program: Program | None = None) -> tuple[list[Finding], bool]:
    """Parse and run ``rules`` in one pass; returns the findings and whether the source parsed. ``program``:
    the other files of the run, for the questions that cross files (a program of this file alone if None)."""
    skipped = too_large(path, len(source))
    if skipped is not None:
        return [skipped], False
    program = Program() if program is None else program
    ctx = program.parsed(path, source)
    if ctx is None:
        tree = parse(source, path)
        if isinstance(tree, Finding):
            return [tree], False
        ctx = program.adopt(Context(tree, source, path))
    findings: list[Finding] = []
    try:
        run_rules(ctx, rules, findings)
    except (RecursionError, MemoryError) as exc:
        return [parse_error(path, f"cannot analyse: {_describe(exc)}")], True
    except Exception as exc:  # a bug in a rule must not stop the other files
        if STRICT:
            raise
        return [parse_error(path, f"internal error while checking this file: {type(exc).__name__}: {exc}")], True
    if not findings:
        return findings, True  # nothing to look up: the text is not split into lines for noqa
    findings.sort(key=Finding.sort_key)
    return apply_noqa(findings, LINE_BREAK.split(source)), True


def run_rules(ctx: Context, rules: Sequence[type[Rule]], sink: list[Finding]) -> None:
    """Instantiate the rules for this file and dispatch every node to every rule that visits its type."""
    handlers: dict[type, list] = {}
    instances = []
    for rule_cls in rules:
        rule = rule_cls(ctx, sink)
        instances.append(rule)
        for node_type, method in rule_cls.visited_types().items():
            handlers.setdefault(node_type, []).append(getattr(rule, method))
    for node_type, methods in handlers.items():
        for node in ctx.nodes(node_type):
            for method in methods:
                method(node)
    for rule in instances:
        rule.finish()


def apply_noqa(findings: list[Finding], lines: list[str]) -> list[Finding]:
    """Drop findings whose line carries ``# noqa`` (all codes) or ``# noqa: TW101, TW302`` (those codes)."""
    kept = []
    for finding in findings:
        text = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        if "noqa" in text.lower():
            match = _NOQA.search(text)
            if match is not None:
                codes = match.group("codes")
                if codes is None or finding.code in {c.upper() for c in re.split(r"[,\s]+", codes)}:
                    continue
        kept.append(finding)
    return kept


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "too deeply nested (RecursionError)"
    if isinstance(exc, MemoryError):
        return "too large or too deeply nested (MemoryError)"
    return str(exc) or type(exc).__name__
