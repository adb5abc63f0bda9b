"""The rule API: a ``Rule`` subclass per check, the ``Finding`` it reports and the ``Fix`` it may carry.

A rule is a class in ``trainwise/doctor/rules/twNNN_<name>.py`` with ``visit_<NodeType>`` methods; the engine
creates one instance per file and calls those methods for every node of that type, all rules in one pass.
See docs/doctor-internals.md.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from trainwise.doctor.context import Context


class FixAvailability(enum.Enum):
    """Whether a rule's findings come with a fix: never, for some findings, or always."""

    NONE = "none"
    SOMETIMES = "sometimes"
    ALWAYS = "always"


# A transform gets the libcst node at the fix's position and the libcst module itself (so that rule modules
# never import libcst), and returns the replacement node.
Transform = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Fix:
    """An edit of one node: ``transform(cst_node, libcst)`` returns the node that replaces ``node``'s source.

    ``safe`` fixes keep the program's meaning (``--fix``); unsafe ones may change it (``--unsafe-fixes``).
    """

    node: ast.AST
    transform: Transform
    description: str
    safe: bool = True


@dataclass(frozen=True)
class Related:
    """Another place a finding names (a finding across files: the line that freezes a backbone, the helper in
    another file whose ``model.train()`` undoes it): 1-based line and column, the cell in a notebook, and what
    happens there."""

    path: str
    line: int
    column: int
    message: str
    cell: int | None = None

    def where(self) -> str:
        """``path:line``, or ``path:cell N:line`` inside a notebook: how a message names the place."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.path}:{cell}{self.line}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"path": self.path, "line": self.line, "column": self.column, "message": self.message}
        if self.cell is not None:
            data["cell"] = self.cell
        return data


@dataclass
class Finding:
    """One diagnostic: where (1-based line and column; ``cell`` for notebooks), which rule, and what to do;
    ``related``: the other places it names (in other files, or elsewhere in this one)."""

    path: str
    line: int
    column: int
    code: str
    name: str
    message: str
    fix: Fix | None = field(default=None, compare=False, repr=False)
    cell: int | None = None
    end_line: int | None = None
    end_column: int | None = None
    related: tuple[Related, ...] = field(default=(), compare=False)

    @property
    def fixable(self) -> bool:
        """Whether a fix (safe or unsafe) comes with the finding."""
        return self.fix is not None

    def sort_key(self) -> tuple[str, int, int, int, str]:
        """Order of the report: by path, then cell, line, column and code."""
        return (self.path, self.cell or 0, self.line, self.column, self.code)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--format json``."""
        data: dict[str, Any] = {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "code": self.code,
            "name": self.name,
            "message": self.message,
            "fixable": self.fixable,
        }
        if self.cell is not None:
            data["cell"] = self.cell
        if self.related:
            data["related"] = [r.to_dict() for r in self.related]
        return data


class Rule:
    """Base class of the doctor's rules. Subclasses set the class attributes and define ``visit_<Node>``
    methods (``visit_Call(self, node)``) and optionally ``finish()``; they call ``self.report(...)``.

    The class docstring is the rule's documentation: a one-line summary, then the ruff-style sections
    ``## What it does``, ``## Why is this bad?``, ``## Example``, ``## Use instead``, ``## Fix safety``.
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""  # kebab-case name of the pattern it finds
    message: ClassVar[str] = ""  # default message of its findings
    fix_availability: ClassVar[FixAvailability] = FixAvailability.NONE
    fix_safe: ClassVar[bool] = True  # default safety of its fixes
    default_enabled: ClassVar[bool] = True  # 4xx (performance) rules are off unless selected
    runtime_only: ClassVar[bool] = False  # found only by trainwise.guard while a run goes (documented here)

    def __init__(self, ctx: Context, sink: list[Finding]) -> None:
        self.ctx = ctx
        self._sink = sink

    def report(self, node: ast.AST, message: str | None = None, *, fix: Fix | None = None,
               related: tuple[Related, ...] = ()) -> None:
        """Report a finding at ``node`` (its first line and column), with an optional fix and the other places
        it names (``self.ctx.program.place(ctx, node, message)``)."""
        self._sink.append(
            Finding(
                path=self.ctx.path,
                line=getattr(node, "lineno", 1),
                column=column_of(self.ctx, node),
                code=self.code,
                name=self.name,
                message=message or self.message,
                fix=fix,
                end_line=getattr(node, "end_lineno", None),
                related=tuple(related),
            )
        )

    def make_fix(self, node: ast.AST, transform: Transform, description: str, *, safe: bool | None = None) -> Fix:
        """A ``Fix`` of ``node``, safe or not as the rule's ``fix_safe`` says unless given."""
        return Fix(node, transform, description, self.fix_safe if safe is None else safe)

    def finish(self) -> None:
        """Called once after every node of the file has been visited (for rules that compare places)."""

    @classmethod
    def summary(cls) -> str:
        """The first line of the documentation."""
        return cls.documentation().split("\n", 1)[0]

    @classmethod
    def documentation(cls) -> str:
        """The whole documentation, dedented."""
        import inspect

        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def visited_types(cls) -> dict[type, str]:
        """``ast`` node types this rule visits, mapped to the method names that handle them (looked up once
        per class: every file of a run asks)."""
        found = cls.__dict__.get("_visited_types")
        if found is None:
            found = {}
            for attr in dir(cls):
                if attr.startswith("visit_"):
                    node_type = getattr(ast, attr[len("visit_") :], None)
                    if isinstance(node_type, type) and issubclass(node_type, ast.AST):
                        found[node_type] = attr
            cls._visited_types = found  # type: ignore[attr-defined]
        return dict(found)


def column_of(ctx: Context, node: ast.AST) -> int:
    """1-based column in characters (``ast`` counts UTF-8 bytes)."""
    offset = getattr(node, "col_offset", 0)
    line_no = getattr(node, "lineno", 1)
    if 0 < line_no <= len(ctx.lines):
        line = ctx.lines[line_no - 1]
        if not line.isascii():
            return len(line.encode("utf-8")[:offset].decode("utf-8", errors="replace")) + 1
    return offset + 1
