"""The program a run checks: every file of the run, its imports resolved to the other files, and the questions
that cross files.

A training project is laid out in files (``train.py``, ``utils/utils_fit.py``, ``eval.py``, ``models/``): the
backbone is frozen in one, ``model.train()`` runs in a helper of another; a state dict is saved by one script
and loaded by the next. ``Program`` holds the files of one run (what ``trainwise doctor PATH ...`` checks) and
answers, for a rule that checks one of them:

- ``resolve(ctx, expr)``: what an imported name or attribute chain is in the run (``fit_one_epoch`` from
  ``from utils.utils_fit import fit_one_epoch``, ``U.fit`` from ``import utils as U``, relative imports,
  packages with or without ``__init__.py``, names a package's ``__init__.py`` imports again);
- ``callee(ctx, call)``: the function of another file a call calls, with that file's ``Context``;
- ``callers(ctx, fn)``: the calls of a module-level function from the other files of the run;
- ``constant(ctx, expr)``: a literal, also through an import (``from config import CKPT``);
- ``remember(key, compute)``: an answer about another file that many files ask for (is this base class a
  module?), computed once per run, so that a file dropped from memory is not parsed again for each asker;
- ``context(path)``: any file's ``Context`` (parsed once, kept within a memory budget, parsed again when
  asked after it was dropped); ``place(ctx, node, message)``: a ``Related`` place for a finding.

Everything is computed when first asked and cached; nothing is imported or run, and a file that cannot be
read or parsed simply answers nothing. What each file knows about itself (bindings, roles, the same-file
call graph, function summaries) stays in its ``Context``; this module only connects files. A file checked
alone (``check_source``, ``check_file``) is a program of one file: every cross-file answer is empty.
"""

from __future__ import annotations

import ast
import builtins
import heapq
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from trainwise.doctor.context import Context, dotted, position
from trainwise.doctor.rule import Related, column_of
from trainwise.doctor.text import MAX_SOURCE

if TYPE_CHECKING:
    from trainwise.doctor.notebook import NotebookSource

# Source text kept parsed at once (an ast with its index takes about 30 times its text): enough for real
# projects; a larger run parses a file again when a later question needs it.
_BUDGET = 4 << 20
_TEXT_BUDGET = 16 << 20  # characters of source text kept read (a text takes a fiftieth of its parsed file)
_REEXPORT_DEPTH = 5  # `from .utils_fit import fit` in a package's __init__.py, followed this many times
_BUILTINS = frozenset(dir(builtins))  # names a star import cannot have given a file (print, len, range)
_MAX_SITES = 64  # call sites of one function from other files, at most
# An import statement in a file's text (a cheap filter before parsing: it may match inside a string too).
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+[.\w]+[ \t]+import[ \t]*(?:\([^)]*\)|[^\n;#]*)|import[ \t]+[^\n;#]*)",
                     re.MULTILINE)
_WORD = re.compile(r"\w+")
# A method defined in a class body, or an attribute set on ``self``: where a class may define a member.
_MEMBER = re.compile(r"^[ \t]+(?:async[ \t]+)?def[ \t]+(\w+)|\bself\.(\w+)[ \t]*(?::[^=\n]*)?=(?!=)", re.MULTILINE)


@dataclass(frozen=True)
class SourceText:
    """What the program parses for a file: its text (a notebook's code cells joined) and, for a notebook, the
    map from joined lines to cells."""

    text: str
    notebook: NotebookSource | None = None


Reader = Callable[[str], "SourceText | None"]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Symbol:
    """A module of the run (``name`` None) or a name defined at the top of one (``fit_one_epoch``, a class
    ``Trainer``, ``Trainer.fit`` for a method)."""

    path: str
    name: str | None


@dataclass
class _ModuleInfo:
    """What a file offers the others, small and kept for the whole run: its top-level functions and classes,
    its imports (local name -> (folders a relative import starts from, dotted target)), its module-level
    constants and the names of the classes it knows to be ``nn.Module`` subclasses."""

    functions: dict[str, int] = field(default_factory=dict)  # name -> how many top-level defs have it
    classes: dict[str, int] = field(default_factory=dict)
    imports: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    constants: dict[str, object] = field(default_factory=dict)
    module_classes: frozenset[str] = frozenset()
    stars: list[tuple[tuple[str, ...], str]] = field(default_factory=list)  # `from .base import *`, in order
    variables: set[str] = field(default_factory=set)  # names assigned at the top (`MODELS = {...}`)


class Program:
    """The files of one run and the questions that cross them (see the module docstring)."""

    def __init__(self, paths: Sequence[str] = (), reader: Reader | None = None, *, budget: int = _BUDGET) -> None:
        self.paths: list[str] = list(dict.fromkeys(paths))
        self._reader = reader
        self._budget = budget
        self._files: dict[str, str] = {}  # absolute path of an importable .py file -> its path in the run
        self._absolute: dict[str, str] = {}  # path in the run -> absolute path
        for path in self.paths:
            absolute = _absolute(path)
            self._absolute[path] = absolute
            if path.endswith(".py"):
                self._files.setdefault(absolute, path)
        folders = [os.path.dirname(a) for a in self._absolute.values()]
        self._top = os.path.commonpath(folders) if folders else ""
        self._folders: set[str] = set()  # folders holding .py files of the run (namespace packages too)
        for absolute in self._files:
            folder = os.path.dirname(absolute)
            while folder not in self._folders and len(folder) >= len(self._top):
                self._folders.add(folder)
                parent = os.path.dirname(folder)
                if parent == folder:
                    break
                folder = parent
        self._contexts: OrderedDict[str, Context] = OrderedDict()
        self._rank = {path: i for i, path in enumerate(self.paths)}  # the order the run checks its files in
        self._checked: set[str] = set()  # files whose own check has started
        self._kept_checked: OrderedDict[str, None] = OrderedDict()  # kept files of _checked, as _contexts orders them
        self._unchecked: list[tuple[int, str]] = []  # heap of (-rank, path) of kept files not checked yet (stale too)
        self._kept = 0
        self._texts: dict[str, SourceText] = {}  # texts read: notebooks' (with cell maps), others' within a budget
        self._text_room = _TEXT_BUDGET  # characters of texts that are not notebooks' still to keep
        self._unreadable: set[str] = set()
        self._infos: dict[str, _ModuleInfo] = {}
        self._bases: dict[str, tuple[str, ...]] = {}
        self._resolved: dict[tuple[str, str], Symbol | None] = {}
        # (file, function) -> its calls from other files: (indexing order of the calling file, order of the call
        # there, calling file, line, column); sorted when read, since a file may be indexed after its turn
        self._callers: dict[tuple[str, str], list[tuple[int, int, str, int, int, tuple[int, int]]]] = {}
        self._pending: dict[str, int] = {}  # files whose turn to be indexed came, not indexed yet: their turn
        self._turns = 0  # files given a turn to be indexed so far
        self._call_indexed: set[str] = set()  # files whose calls are in _callers
        self._module_importers_indexed: set[str] = set()  # files whose module's importers are all in _callers
        self._sealed: dict[str, str | None] = {}  # path -> _sealed_folder(path)
        self._imported: dict[str, set[str]] | None = None
        self._gathered: dict[str, list[object]] = {}
        self._remembered: dict[Hashable, object] = {}
        self._holding: dict[tuple[str, str], bool] = {}  # (path, needle) -> whether its text holds it
        self._members: dict[str, set[str]] | None = None  # member name -> files that may define it in a class
        self._member_kinds: dict[tuple[str | None, str, str], frozenset[str]] = {}  # (project, fact, name)

    # ------------------------------------------------------------------------------------------------ files
    def adopt(self, ctx: Context) -> Context:
        """Make ``ctx`` (a file parsed by the caller) a file of this program; returns it."""
        ctx.program = self
        if ctx.path not in self._absolute:
            self.paths.append(ctx.path)
            self._absolute[ctx.path] = _absolute(ctx.path)
        self._keep(ctx)
        self._index_while_kept(ctx.path)
        return ctx

    def parsed(self, path: str, source: str) -> Context | None:
        """The ``Context`` of ``path`` if the program holds one for this very text, else None. Asked when the
        file's own check starts: from then on it is the first to be dropped (see ``_keep``)."""
        self._checked.add(path)
        ctx = self._contexts.get(path)
        if ctx is not None:
            self._kept_checked[path] = None
        if ctx is not None and ctx.source == source:
            self._contexts.move_to_end(path)
            self._kept_checked.move_to_end(path)
            self._index_while_kept(path)
            return ctx
        return None

    def context(self, path: str) -> Context | None:
        """The ``Context`` of a file of the run (parsed now if it is not kept); None when it cannot be read or
        parsed, or when the program has no reader (a file checked alone)."""
        ctx = self._contexts.get(path)
        if ctx is not None:
            self._contexts.move_to_end(path)
            if path in self._kept_checked:
                self._kept_checked.move_to_end(path)
            return ctx
        if path in self._unreadable or self._reader is None or path not in self._absolute:
            return None
        text = self._source(path)
        tree = None
        if text is not None and len(text.text) <= MAX_SOURCE:  # a larger one is skipped by its own check
            try:
                tree = ast.parse(text.text, filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                tree = None
        if text is None or tree is None:
            self._unreadable.add(path)
            return None
        if text.notebook is not None:
            self._texts[path] = text
        ctx = Context(tree, text.text, path)
        ctx.program = self
        self._keep(ctx)
        return ctx

    def _keep(self, ctx: Context) -> None:
        old = self._contexts.pop(ctx.path, None)
        self._kept_checked.pop(ctx.path, None)
        if old is not None:
            self._kept -= len(old.source)
            if old is not ctx:
                _release(old)  # the same file parsed again (a notebook without its broken cells)
        self._contexts[ctx.path] = ctx
        if ctx.path in self._checked:
            self._kept_checked[ctx.path] = None
        else:
            heapq.heappush(self._unchecked, (-self._rank.get(ctx.path, len(self._rank)), ctx.path))
        self._kept += len(ctx.source)
        while self._kept > self._budget and len(self._contexts) > 1:
            victim = self._victim(ctx.path)
            dropped = self._contexts.pop(victim)
            self._kept_checked.pop(victim, None)
            self._kept -= len(dropped.source)
            _release(dropped)

    def _victim(self, newest: str) -> str:
        """The kept file to drop: the least recently used of those already checked, else the one checked last
        in the run. A question across files parses many files at once (every file that saves a state dict):
        dropping the least recently used would keep those checked last and drop, one by one, each file just
        before its own check parsed it again; this keeps the next ones (the runs of the dev sets parsed a
        third fewer files)."""
        for path in self._kept_checked:  # least recently used first
            if path != newest:
                return path
        heap, held, found = self._unchecked, [], newest
        while heap:
            _, path = heap[0]
            if path not in self._contexts or path in self._checked:
                heapq.heappop(heap)  # dropped or checked since: a stale entry
            elif path == newest:
                held.append(heapq.heappop(heap))  # kept: it is the file asked for now
            else:
                found = path
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return found

    def close(self) -> None:
        """Drop every kept context (a run that ends), so that their memory is freed without waiting for the
        garbage collector."""
        for ctx in self._contexts.values():
            _release(ctx)
        self._contexts.clear()
        self._kept_checked.clear()
        self._unchecked.clear()
        self._kept = 0

    def place(self, ctx: Context, node: ast.AST, message: str) -> Related:
        """A ``Related`` place at ``node`` of the file of ``ctx`` (a notebook's line mapped to its cell)."""
        line = getattr(node, "lineno", 1)
        column = column_of(ctx, node)
        text = self._texts.get(ctx.path)
        if text is None and ctx.path.endswith(".ipynb") and self._reader is not None:
            text = self._reader(ctx.path)  # a notebook parsed by its own check: read its cells again for the map
            if text is not None:
                self._texts[ctx.path] = text
        if text is not None and text.notebook is not None and text.text == ctx.source:
            cell, line = text.notebook.locate(line)
            return Related(ctx.path, line, column, message, cell)
        return Related(ctx.path, line, column, message)

    def where(self, ctx: Context, node: ast.AST) -> str:
        """How a message names a place in another file: ``utils/utils_fit.py:12``."""
        return self.place(ctx, node, "").where()

    # ---------------------------------------------------------------------------------------------- imports
    def _info(self, path: str) -> _ModuleInfo | None:
        info = self._infos.get(path)
        if info is None:
            ctx = self.context(path)
            if ctx is None:
                return None
            info = self._infos[path] = self._module_info(ctx)
        return info

    def _module_info(self, ctx: Context) -> _ModuleInfo:
        info = _ModuleInfo(module_classes=frozenset(ctx.module_classes))
        tree = ctx.tree
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.functions[stmt.name] = info.functions.get(stmt.name, 0) + 1
            elif isinstance(stmt, ast.ClassDef):
                info.classes[stmt.name] = info.classes.get(stmt.name, 0) + 1
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                name = stmt.targets[0].id
                info.variables.add(name)
                value = ctx.constant(stmt.targets[0])
                if value is not ... and len(ctx.bindings.get((tree, name), ())) == 1:
                    info.constants[name] = value
        folder = os.path.dirname(self._absolute.get(ctx.path) or _absolute(ctx.path))
        for node in ctx.nodes(ast.Import):
            for alias in node.names:  # type: ignore[attr-defined]
                if alias.asname:
                    info.imports[alias.asname] = ((), alias.name)
                else:
                    top = alias.name.split(".")[0]
                    info.imports.setdefault(top, ((), top))
        for node in sorted(ctx.nodes(ast.ImportFrom), key=position):  # in source order: a later import wins
            level, module = node.level, node.module  # type: ignore[attr-defined]
            if level:
                base = folder
                for _ in range(level - 1):
                    base = os.path.dirname(base)
                bases: tuple[str, ...] = (base,)
            elif module:
                bases = ()
            else:
                continue
            for alias in node.names:  # type: ignore[attr-defined]
                if alias.name != "*":
                    target = f"{module}.{alias.name}" if module else alias.name
                    info.imports[alias.asname or alias.name] = (bases, target)
                elif module:
                    info.stars.append((bases, module))
        return info

    def _search_bases(self, path: str) -> tuple[str, ...]:
        """Folders an absolute import of ``path`` is looked up from, nearest first: its own folder and those
        above it within the run (and above the packages it sits in), as a script run from any of them sees."""
        bases = self._bases.get(path)
        if bases is None:
            found = []
            folder = os.path.dirname(self._absolute.get(path) or _absolute(path))
            for _ in range(32):
                found.append(folder)
                parent = os.path.dirname(folder)
                inside = self._top and (folder + os.sep).startswith(self._top.rstrip(os.sep) + os.sep)
                if parent == folder or not (inside or os.path.join(folder, "__init__.py") in self._files):
                    break
                folder = parent
            bases = self._bases[path] = tuple(found)
        return bases

    def _module_file(self, parts: Sequence[str], bases: Sequence[str]) -> str | None:
        for base in bases:
            stem = os.path.join(base, *parts)
            for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
                found = self._files.get(candidate)
                if found is not None:
                    return found
        return None

    def _lookup(self, parts: list[str], bases: Sequence[str], depth: int) -> Symbol | None:
        """The longest leading run of ``parts`` that is a module file, then the rest as names inside it."""
        for k in range(len(parts), 0, -1):
            found = self._module_file(parts[:k], bases)
            if found is not None:
                return Symbol(found, None) if k == len(parts) else self._member(found, parts[k:], depth)
        return None

    def _member(self, path: str, rest: list[str], depth: int) -> Symbol | None:
        info = self._info(path)
        if info is None:
            return None
        name = rest[0]
        if name in info.functions or name in info.classes or (name in info.variables and len(rest) == 1):
            return Symbol(path, ".".join(rest))
        imported = info.imports.get(name)
        if imported is not None and depth < _REEXPORT_DEPTH:
            bases, target = imported
            return self._lookup([*target.split("."), *rest[1:]], bases or self._search_bases(path), depth + 1)
        return self._through_stars(path, info, rest, depth) if imported is None else None

    def _through_stars(self, path: str, info: _ModuleInfo, rest: list[str], depth: int) -> Symbol | None:
        """A name a module takes with ``from .base import *`` (the last such import that has it wins, as
        in Python); None when none of them defines it."""
        if depth >= _REEXPORT_DEPTH:
            return None
        for bases, module in reversed(info.stars):
            found = self._lookup([*module.split("."), *rest], bases or self._search_bases(path), depth + 1)
            if found is not None and found.name is not None and found.path != path:
                return found
        return None

    def resolve(self, ctx: Context, expr: ast.AST) -> Symbol | None:
        """What a name or attribute chain of ``ctx`` refers to in another file of the run, through the file's
        imports; None for anything else (a local name, a library, a file outside the run)."""
        text = dotted(expr)
        if text is None or not self._files:
            return None
        root, *attrs = text.split(".")
        if _shadowed(ctx, expr, root):
            return None  # before the cache: the same text may name a local in one function, an import in another
        key = (ctx.path, text)
        if key in self._resolved:
            return self._resolved[key]
        found = None
        info = self._info(ctx.path) if ctx.path in self._absolute else self._module_info(ctx)
        imported = info.imports.get(root) if info is not None else None
        if imported is not None:
            bases, target = imported
            found = self._lookup([*target.split("."), *attrs], bases or self._search_bases(ctx.path), 0)
        elif info is not None and info.stars:
            found = self._through_stars(ctx.path, info, [root, *attrs], 0)  # `from utils import *`, then `fit(...)`
        if found is not None and found.path == ctx.path:
            found = None
        self._resolved[key] = found
        return found

    # -------------------------------------------------------------------------------------------- functions
    def function(self, symbol: Symbol) -> tuple[Context, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """The one top-level function (or method, ``Class.name``) a symbol names, with its file's context."""
        if symbol.name is None:
            return None
        ctx = self.context(symbol.path)
        if ctx is None:
            return None
        body: list[ast.stmt] = ctx.tree.body
        *owners, name = symbol.name.split(".")
        for owner in owners:
            classes = [s for s in body if isinstance(s, ast.ClassDef) and s.name == owner]
            if len(classes) != 1:
                return None
            body = classes[0].body
        found = [s for s in body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name]
        return (ctx, found[0]) if len(found) == 1 else None

    def callee(self, ctx: Context, call: ast.Call) -> tuple[Context, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """The function of another file of the run that ``call`` calls (``fit_one_epoch(...)`` imported,
        ``utils.seed_everything(...)``), with that file's context; None for anything else."""
        symbol = self.resolve(ctx, call.func)
        return self.function(symbol) if symbol is not None else None

    def class_of(self, ctx: Context, expr: ast.AST) -> tuple[Context, ast.ClassDef] | None:
        """The class of another file of the run that ``expr`` names (``YoloBody`` imported from ``nets.yolo``)."""
        symbol = self.resolve(ctx, expr)
        if symbol is None or symbol.name is None or "." in symbol.name:
            return None
        other = self.context(symbol.path)
        if other is None:
            return None
        found = [s for s in other.tree.body if isinstance(s, ast.ClassDef) and s.name == symbol.name]
        return (other, found[0]) if len(found) == 1 else None

    def module_class(self, ctx: Context, expr: ast.AST) -> tuple[Context, ast.ClassDef] | None:
        """The ``nn.Module`` subclass of another file of the run that ``expr`` names (``from models import
        Net``), with that file's context."""
        found = self.class_of(ctx, expr)
        return found if found is not None and found[1].name in found[0].module_classes else None

    def known_module_class(self, symbol: Symbol) -> bool:
        """Whether ``symbol`` is the one top-level class of its file by that name, and one the file itself
        knows to subclass ``nn.Module`` (its ``module_classes``): answered from what the program keeps of the
        file, without parsing it again."""
        info = self._info(symbol.path) if symbol.name is not None else None
        return info is not None and info.classes.get(symbol.name, 0) == 1 and symbol.name in info.module_classes  # type: ignore[arg-type]

    def gather(self, name: str, extract: Callable[[Context], list[_T]], needles: tuple[str, ...] = ()) -> list[_T]:
        """Every item ``extract(ctx)`` finds in the files of the run whose text holds each of ``needles`` (a
        cheap filter: only those files are parsed), computed once per run and ``name``. The items must hold no
        ``ast`` node (a file's context may be dropped and parsed again): strings, numbers, ``Related`` places."""
        found = self._gathered.get(name)
        if found is None:
            found = self._gathered[name] = []
            for path in self.paths:
                if needles:
                    text = self._read(path)
                    if text is None or not all(needle in text for needle in needles):
                        continue
                ctx = self.context(path)
                if ctx is not None:
                    found.extend(extract(ctx))
        return found  # type: ignore[return-value]

    def remember(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, computed once per run and ``key`` (a question a rule asks of many files about the same
        other file). The answer must hold no ``ast`` node, as for ``gather``."""
        if key in self._remembered:
            return self._remembered[key]  # type: ignore[return-value]
        found = self._remembered[key] = compute()
        return found

    def _read(self, path: str) -> str | None:
        kept = self._contexts.get(path)
        if kept is not None:
            return kept.source
        if self._reader is None or path in self._unreadable:
            return None
        text = self._source(path)
        return None if text is None else text.text

    def _source(self, path: str) -> SourceText | None:
        """What the reader gives for ``path``, kept for the run: a notebook's (its code cells joined, which costs
        more than reading a file, small beside its JSON) always, other texts while they fit in a budget of their
        own (each file's text is read by every question that sweeps the run: imports, needles, parses)."""
        text = self._texts.get(path)
        if text is None and self._reader is not None:
            text = self._reader(path)
            if text is not None and text.notebook is not None:
                self._texts[path] = text
            elif text is not None and len(text.text) <= self._text_room:
                self._texts[path] = text
                self._text_room -= len(text.text)
        return text

    def callers(self, ctx: Context, fn: ast.AST) -> list[tuple[Context, ast.Call]]:
        """The calls of ``fn`` (a module-level function or class of ``ctx``'s file: its constructions) from the
        other files of the run, each with its file's context (at most 64). Only the files whose import
        statements name the function or its module are parsed for it (``_import_index``)."""
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or ctx.scope(fn) is not ctx.tree:
            return []
        if not self._importers_indexed(ctx, fn.name):
            sealed = self._sealed_folder(ctx.path)
            for path in self.importers(ctx, (fn.name,)):
                if path not in self._call_indexed:
                    self._call_indexed.add(path)
                    self._turns += 1
                    if sealed is not None and not self._absolute[path].startswith(sealed):
                        self._pending[path] = self._turns  # it cannot import this file: parsed when needed
                    else:
                        self._index_calls(path, self._turns)
            self._module_importers_indexed.add(ctx.path)
        self._index_pending(ctx.path)
        sites = sorted(self._callers.get((ctx.path, fn.name), []))
        out = []
        for _, _, path, line, column, end in sites[:_MAX_SITES]:
            other = self.context(path)
            if other is None:
                continue
            for call in other.nodes(ast.Call):  # `Runner(net).fit()` starts where `Runner(net)` does: its end tells
                if (call.lineno == line and call.col_offset == column  # type: ignore[attr-defined]
                        and (call.end_lineno, call.end_col_offset) == end):  # type: ignore[attr-defined]
                    out.append((other, call))
                    break
        return out  # type: ignore[return-value]

    def _importers_indexed(self, ctx: Context, name: str) -> bool:
        """Whether the calls of every file that may import ``name`` from ``ctx``'s file are indexed already:
        then ``callers`` need not list (and sort) the files of the run that import the module again, once per
        function of it (every file of a package imports the package)."""
        if ctx.path not in self._module_importers_indexed or self._imported is None:
            return False
        indexed = self._call_indexed
        return all(path in indexed or path == ctx.path for path in self._imported.get(name, ()))

    def importers(self, ctx: Context, names: Sequence[str] = (), needle: str = "") -> list[str]:
        """The other files of the run whose import statements name ``ctx``'s module (or a package or folder
        above it) or one of ``names``: the files that may use its functions (with ``needle``: only those whose
        text holds it). Read from their text, nothing parsed."""
        absolute = self._absolute.get(ctx.path)
        if absolute is None or absolute not in self._files or len(self.paths) < 2:
            return []
        index = self._import_index()
        words = {*names, *_module_words(absolute, self._top)}
        found = sorted(set().union(*(index.get(w, ()) for w in words)) - {ctx.path})
        return [p for p in found if self._holds(p, needle)] if needle else found

    def _holds(self, path: str, needle: str) -> bool:
        """Whether the text of ``path`` holds ``needle``, read once per run and needle."""
        key = (path, needle)
        if key not in self._holding:
            self._holding[key] = needle in (self._read(path) or "")
        return self._holding[key]

    def _import_index(self) -> dict[str, set[str]]:
        """name -> the files of the run whose import statements mention it (modules, names, aliases), from
        their text: one read of each file, nothing parsed."""
        if self._imported is None:
            self._imported = {}
            for path in self.paths:
                text = self._read(path)
                if text is None or "import" not in text:
                    continue
                for statement in _IMPORT.finditer(text):
                    for word in _WORD.findall(statement.group()):
                        self._imported.setdefault(word, set()).add(path)
        return self._imported

    def member_kinds(self, ctx: Context, name: str) -> frozenset[str]:
        """What the ``nn.Module`` classes of ``ctx``'s project (its sealed folder, else the whole run) define as
        ``name``: ``"submodule"``, ``"forward"`` (a method that runs one with autograd on), ``"no_grad"`` (a method
        that turns it off), ``"trains"`` or ``"other"``; empty when no module class of the project defines it. A
        call ``model.name(x)`` whose receiver's class is unknown is a forward when every definition is one (a
        submodule or a forward method)."""
        return self._member_facts(ctx, name, "kinds", lambda c: c.member_kinds_here(name))

    def kept_arguments(self, ctx: Context, name: str) -> frozenset[str]:
        """What the methods called ``name`` of the classes of ``ctx``'s project keep of their arguments (see
        ``Context.kept_arguments_here``): a call ``obj.name(loss)`` of an object of unknown class adds ``loss``
        to state that outlives it when every definition keeps that argument."""
        return self._member_facts(ctx, name, "kept", lambda c: c.kept_arguments_here(name))

    def _member_facts(self, ctx: Context, name: str, fact: str,
                      here: Callable[[Context], frozenset[str]]) -> frozenset[str]:
        """One fact about the members called ``name`` of ``ctx``'s project (its sealed folder, else the whole
        run), joined over the files whose text defines one; computed once per project, fact and name."""
        sealed = self._sealed_folder(ctx.path)
        key = (sealed, fact, name)
        found = self._member_kinds.get(key)
        if found is not None:
            return found
        self._member_kinds[key] = frozenset()  # asked again while answering: no answer yet
        facts: set[str] = set(here(ctx))
        for path in sorted(self._member_index().get(name, ())):
            if path == ctx.path or (sealed is not None and not (self._absolute.get(path) or "").startswith(sealed)):
                continue
            other = self.context(path)
            if other is not None:
                facts |= here(other)
        found = self._member_kinds[key] = frozenset(facts)
        return found

    def _member_index(self) -> dict[str, set[str]]:
        """name -> the files of the run whose text defines a method or sets a ``self`` attribute of that name:
        one read of each file, nothing parsed."""
        if self._members is None:
            self._members = {}
            for path in self.paths:
                text = self._read(path)
                if text is None or "class" not in text:
                    continue
                for match in _MEMBER.finditer(text):
                    self._members.setdefault(match.group(1) or match.group(2), set()).add(path)
        return self._members

    def same_project(self, a: str, b: str) -> bool:
        """Whether two files of the run belong to one project (the same sealed folder, see below)."""
        return self._sealed_folder(a) == self._sealed_folder(b)

    def _sealed_folder(self, path: str) -> str | None:
        """The innermost folder above ``path`` whose name is no Python identifier (``owner+repo``, ``my-app``),
        with a trailing separator; None when there is none. No import can name such a folder, so no file outside
        it can reach a function inside it: a run over many repositories need not parse them all to find the
        callers of one (their words collide: every repository has its ``utils`` and ``models``)."""
        found = self._sealed.get(path, ...)
        if found is ...:
            found = None
            folder = os.path.dirname(self._absolute.get(path) or _absolute(path))
            while True:
                name = os.path.basename(folder)
                if not name:
                    break
                if not name.isidentifier():
                    found = folder.rstrip(os.sep) + os.sep
                    break
                parent = os.path.dirname(folder)
                if parent == folder:
                    break
                folder = parent
            self._sealed[path] = found
        return found  # type: ignore[return-value]

    def _index_pending(self, path: str) -> None:
        """Index the calls of the files whose turn came before but that may import ``path`` (all of them when its
        folders are all named like modules); their calls keep their turn's place (see ``_callers``)."""
        if not self._pending:
            return
        sealed = self._sealed_folder(path)
        due = [p for p in self._pending if sealed is None or self._absolute[p].startswith(sealed)]
        for pending in due:
            self._index_calls(pending, self._pending.pop(pending))

    def _index_while_kept(self, path: str) -> None:
        """Index a pending file's calls when its own check holds it parsed anyway (not a notebook: its check may
        parse it without a broken cell, a text the program itself never parses)."""
        if path in self._pending and not path.endswith(".ipynb"):
            self._index_calls(path, self._pending.pop(path))

    def _index_calls(self, path: str, turn: int) -> None:
        """Record the calls of ``path`` that reach a module-level function of another file of the run, in the
        place of its ``turn``."""
        ctx = self.context(path)
        info = self._info(path)
        if ctx is None or info is None or not (info.imports or info.stars):
            return
        roots = {name for name in info.imports if self._may_be_local(path, name)}
        # `from utils import *` of a file of the run: any name the file does not import may come from it
        starred = any(self._module_may_be_local(path, bases, module) for bases, module in info.stars)
        if not roots and not starred:
            return
        for order, call in enumerate(ctx.nodes(ast.Call)):
            func = call.func  # type: ignore[attr-defined]
            root = func
            while isinstance(root, ast.Attribute):
                root = root.value
            if not isinstance(root, ast.Name) or not (
                    root.id in roots or (starred and root.id not in info.imports and root.id not in _BUILTINS)):
                continue
            symbol = self.resolve(ctx, func)
            if symbol is not None and symbol.name is not None and "." not in symbol.name:
                info_there = self._info(symbol.path)
                if info_there is not None and (symbol.name in info_there.functions
                                               or symbol.name in info_there.classes):
                    site = (turn, order, path, call.lineno, call.col_offset,  # type: ignore[attr-defined]
                            (call.end_lineno, call.end_col_offset))  # type: ignore[attr-defined]
                    self._callers.setdefault((symbol.path, symbol.name), []).append(site)

    def _may_be_local(self, path: str, name: str) -> bool:
        """Whether an imported name could come from a file of the run (its module's first part is one)."""
        bases, target = self._infos[path].imports[name]
        return self._module_may_be_local(path, bases, target)

    def _module_may_be_local(self, path: str, bases: tuple[str, ...], target: str) -> bool:
        """Whether the module ``target`` imported by ``path`` could be a file of the run."""
        first = target.split(".")[0]
        for base in bases or self._search_bases(path):
            stem = os.path.join(base, first)
            if stem + ".py" in self._files or stem in self._folders:
                return True
        return False

    # -------------------------------------------------------------------------------------------------- values
    def constant(self, ctx: Context, expr: ast.AST) -> object:
        """The value of a literal, of a name bound once to one, or of a module-level constant of another file
        of the run that the name is imported from (``from config import CKPT``, ``cfg.CKPT``); ``...`` when
        unknown."""
        value = ctx.constant(expr)
        if value is not ... or not isinstance(expr, (ast.Name, ast.Attribute)):
            return value
        symbol = self.resolve(ctx, expr)
        if symbol is None or symbol.name is None or "." in symbol.name:
            if symbol is None and isinstance(expr, ast.Name):
                return self._imported_constant(ctx, expr)
            return ...
        info = self._info(symbol.path)
        return info.constants.get(symbol.name, ...) if info is not None else ...

    def _imported_constant(self, ctx: Context, expr: ast.Name) -> object:
        """``from config import CKPT``: the constant ``CKPT`` of ``config.py`` (not a function or class)."""
        info = self._info(ctx.path) if ctx.path in self._absolute else None
        imported = info.imports.get(expr.id) if info is not None else None
        if imported is None or _shadowed(ctx, expr, expr.id):
            return ...
        bases, target = imported
        module, _, name = target.rpartition(".")
        if not module:
            return ...
        found = self._module_file(module.split("."), bases or self._search_bases(ctx.path))
        there = self._info(found) if found is not None else None
        return there.constants.get(name, ...) if there is not None else ...


def _module_words(absolute: str, top: str) -> set[str]:
    """The names an import of a file may use: ``utils/engine.py`` -> ``{"utils", "engine"}`` (its folders
    within the run, its stem; a package's ``__init__.py`` by its folder)."""
    rest = absolute[len(top):] if top and absolute.startswith(top) else os.path.basename(absolute)
    parts = [p for p in re.split(r"[\\/]", rest) if p]
    if parts:
        parts[-1] = parts[-1].rsplit(".", 1)[0]
    return {p for p in parts if p != "__init__"}


def _release(ctx: Context) -> None:
    """Break the cycles between a dropped context and its analyses (``Functions(ctx)`` keeps ``ctx``), so that
    reference counting frees it; a rule still holding it gets fresh analyses if it asks again."""
    ctx._analyses.clear()


def _absolute(path: str) -> str:
    try:
        return os.path.abspath(path)
    except (OSError, ValueError):
        return path


def _shadowed(ctx: Context, expr: ast.AST, root: str) -> bool:
    """Whether ``root`` at ``expr`` is bound by the file itself (a variable, parameter, function or class of
    the same name) rather than only imported."""
    return bool(ctx.lookup(root, expr))
