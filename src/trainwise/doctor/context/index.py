"""The file's index, built in one pass: parents, nodes by type, scopes, bindings, import aliases, and
questions about names and structure (where a node sits, what a name is bound to, its constant value)."""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, TypeVar

from trainwise.doctor.context.syntax import (
    Binding,
    bound_value,
    dotted,
    position,
)
from trainwise.doctor.text import split_lines

if TYPE_CHECKING:
    from trainwise.doctor.context import Context
    from trainwise.doctor.program import Program

_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

_LOOPS = (ast.For, ast.AsyncFor, ast.While)

# Names a fragment (a notebook cell, a snippet) may use without importing them.
_IMPLICIT_MODULES = {"torch": "torch"}

_LINE_ENDS = re.compile(r"(\r\n|\r|\n)")  # how ast.get_source_segment splits a file into lines

_SCOPE_TYPES = frozenset(_SCOPES)

_BINDING_TYPES = frozenset(
    {
        ast.Assign,
        ast.AnnAssign,
        ast.AugAssign,
        ast.For,
        ast.AsyncFor,
        ast.comprehension,
        ast.With,
        ast.AsyncWith,
        ast.NamedExpr,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.Lambda,
        ast.Import,
        ast.ImportFrom,
    }
)

# Fields that never hold nodes worth visiting: operators and load/store contexts are shared singletons.
_SKIP_FIELDS = frozenset({"ctx", "op", "ops", "type_ignores"})

_CHILD_FIELDS: dict[type, tuple[str, ...]] = {ast.Name: (), ast.Constant: ()}

def _own_children(scope: ast.AST) -> set[int]:
    """ids of the direct children of a scope node that run inside the scope."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {id(c) for c in scope.body} | {id(scope.args)}
    if isinstance(scope, ast.Lambda):
        return {id(scope.body), id(scope.args)}
    if isinstance(scope, ast.ClassDef):
        return {id(c) for c in scope.body}
    return {id(c) for c in ast.iter_child_nodes(scope)}

def _in_own_scope(scope: ast.AST, child: ast.AST) -> bool:
    """Whether ``child`` (a direct child of the scope node) runs inside that scope rather than around it.
    Decided from the few children that run around it (decorators, bases, annotations), never by a search of
    the body, which made every question about a node of a long function cost that function's length."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if child is scope.args:
            return True
        return not (child is scope.returns or _among(child, scope.decorator_list)
                    or _among(child, getattr(scope, "type_params", ())))
    if isinstance(scope, ast.Lambda):
        return child is scope.body or child is scope.args
    if isinstance(scope, ast.ClassDef):
        return not (_among(child, scope.decorator_list) or _among(child, scope.bases)
                    or _among(child, scope.keywords) or _among(child, getattr(scope, "type_params", ())))
    return True


def _among(node: ast.AST, nodes: list[ast.AST] | tuple[()]) -> bool:
    return any(node is item for item in nodes)


def _in_loop_body(loop: ast.For | ast.AsyncFor | ast.While, child: ast.AST) -> bool:
    """Whether ``child`` (a direct child of the loop) is a statement of its body: not its target, iterable or
    test, nor a statement of its ``else`` (which follows the body in the source), without searching the body."""
    if not isinstance(child, ast.stmt):
        return False
    orelse = loop.orelse
    return not orelse or position(child) < position(orelse[0])


_T = TypeVar("_T")


class FileIndex:
    """The file's index, built in one pass: parents, nodes by type, scopes, bindings, import aliases, and"""

    def __init__(self, tree: ast.Module, source: str, path: str = "<string>") -> None:
        self.tree = tree
        self.source = source
        self.path = path
        self._lines: list[str] | None = None  # split when first asked (a finding's column): most files have none
        self.parents: dict[ast.AST, ast.AST] = {}
        self.by_type: dict[type, list[ast.AST]] = {}
        self.aliases: dict[str, str] = {}  # local name -> qualified name, from every import in the file
        self.bindings: dict[tuple[ast.AST, str], list[Binding]] = {}  # (scope, name) -> bindings
        self.attr_bindings: dict[str, list[Binding]] = {}  # "self.model" -> bindings, file-wide
        self.method_receivers: dict[str, set[str]] = {}  # method name -> dotted receivers it is called on
        self.called: set[str] = set()  # dotted names called like functions: model(x)
        self.module_classes: set[str] = set()  # classes of this file that subclass nn.Module
        self.program: Program | None = None  # the files of the run, for questions across files (program.py)
        self._cache: dict[tuple[str, int], object] = {}
        self._qualnames: dict[ast.AST, str | None] = {}  # rules ask it of the same call many times
        self._analyses: dict[type, object] = {}
        self._source_lines: list[str] | None = None
        self._backward_names: dict[int, set[str]] | None = None
        self._binding_orders: dict[int, _OrderedBindings] = {}  # id(bindings list) -> its source order
        self._deep_scopes: dict[ast.AST, ast.AST] = {}  # scope() of nodes nested very deep
        self._values: dict[int, tuple[list[Binding], ast.AST | None]] = {}  # id(bindings list) -> value_of
        self._per_bindings: dict[tuple[Hashable, int], tuple[list[Binding], object]] = {}  # memo_bindings
        self._modules_in_progress: set[int] = set()  # Roles.is_module: the nodes being answered now
        self._module_cycles = 0  # how often is_module met a node it was still answering
        self._index()

    def _index(self) -> None:
        """One iterative walk (no recursion, so any nesting depth is fine): parents, nodes by type, scopes,
        bindings, imports and method calls."""
        parents = self.parents
        by_type = self.by_type
        fields_of = _CHILD_FIELDS
        node_class = ast.AST
        stack: list[tuple[ast.AST, ast.AST]] = [(self.tree, self.tree)]
        pop, push = stack.pop, stack.append
        classes: list[ast.ClassDef] = []
        while stack:
            node, scope = pop()
            tp = type(node)
            bucket = by_type.get(tp)
            if bucket is None:
                by_type[tp] = [node]
            else:
                bucket.append(node)
            if tp is ast.Call:
                self._index_call(node)  # type: ignore[arg-type]
            elif tp in _BINDING_TYPES:
                self._index_binding(node, scope)
            elif tp is ast.ClassDef:
                classes.append(node)  # type: ignore[arg-type]
                self.bindings.setdefault((scope, node.name), []).append(Binding(node, node, "def"))  # type: ignore[attr-defined]
            fields = fields_of.get(tp)
            if fields is None:
                fields = fields_of[tp] = tuple(f for f in tp._fields if f not in _SKIP_FIELDS)
            if tp in _SCOPE_TYPES:
                # Decorators, defaults and annotations belong to the enclosing scope, the body to the new one.
                own = _own_children(node)
                for field in fields:
                    value = getattr(node, field, None)
                    for item in value if type(value) is list else (value,):
                        if isinstance(item, node_class):
                            parents[item] = node
                            push((item, node if id(item) in own else scope))
                continue
            for field in fields:
                value = getattr(node, field, None)
                if type(value) is list:
                    for item in value:
                        if isinstance(item, node_class):
                            parents[item] = node
                            push((item, scope))
                elif isinstance(value, node_class):
                    parents[value] = node
                    push((value, scope))
        self._find_module_classes(classes)

    def _index_call(self, node: ast.Call) -> None:
        func = node.func
        name = dotted(func)
        if name is None:
            return
        self.called.add(name)
        if type(func) is ast.Attribute:  # `a.b.f`: the receiver `a.b` is the name less its last part
            self.method_receivers.setdefault(func.attr, set()).add(name[: len(name) - len(func.attr) - 1])

    def _add(self, scope: ast.AST, target: ast.AST, binding: Binding) -> None:
        if isinstance(target, ast.Name):
            self.bindings.setdefault((scope, target.id), []).append(binding)
        elif isinstance(target, ast.Attribute):
            key = dotted(target)
            if key is not None:
                self.attr_bindings.setdefault(key, []).append(binding)
        elif isinstance(target, ast.Starred):
            self._add(scope, target.value, binding)

    def _add_targets(self, scope: ast.AST, target: ast.AST, stmt: ast.AST, kind: str, **values: object) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for i, element in enumerate(target.elts):
                if isinstance(element, (ast.Tuple, ast.List)):
                    self._add_targets(scope, element, stmt, kind, **{**values, "unpacked": True, "nested": True})
                else:
                    index = None if values.get("nested") else i
                    extra = {k: v for k, v in values.items() if k not in ("unpacked", "nested")}
                    self._add(scope, element, Binding(element, stmt, kind, unpacked=True, index=index, **extra))  # type: ignore[arg-type]
        else:
            self._add(scope, target, Binding(target, stmt, kind, **values))  # type: ignore[arg-type]

    def _index_binding(self, node: ast.AST, scope: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._add_targets(scope, target, node, "assign", value=node.value)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self._add_targets(scope, node.target, node, "assign", value=node.value)
        elif isinstance(node, ast.AugAssign):
            self._add_targets(scope, node.target, node, "augassign", value=node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            self._add_targets(scope, node.target, node, "for", iter=node.iter)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self._add_targets(scope, item.optional_vars, node, "with", value=item.context_expr)
        elif isinstance(node, ast.NamedExpr):
            self._add_targets(scope, node.target, node, "walrus", value=node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None:
                    self.bindings.setdefault((node, arg.arg), []).append(Binding(arg, node, "param"))
            if not isinstance(node, ast.Lambda):
                self.bindings.setdefault((scope, node.name), []).append(Binding(node, node, "def"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name != "*":
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _find_module_classes(self, classes: list[ast.ClassDef]) -> None:
        known = {"torch.nn.Module", "torch.nn.modules.module.Module", "lightning.LightningModule",
                 "pytorch_lightning.LightningModule", "lightning.pytorch.LightningModule"}
        changed = True
        while changed:  # a class deriving from a module class of this file is a module too
            changed = False
            for cls in classes:
                if cls.name in self.module_classes:
                    continue
                for base in cls.bases:
                    q = self.qualname(base)
                    if q in known or (isinstance(base, ast.Name) and base.id in self.module_classes) or (
                        q is not None and q.startswith("torch.nn.") and q.rsplit(".", 1)[1][:1].isupper()
                    ) or _transformers_model(q):
                        self.module_classes.add(cls.name)
                        changed = True
                        break

    @property
    def lines(self) -> list[str]:
        """The file's lines (not ``str.splitlines``: U+2028 in a string does not end a line)."""
        if self._lines is None:
            self._lines = split_lines(self.source)
        return self._lines

    def analysis(self, kind: type[_T]) -> _T:
        """The file's ``kind(self)`` (a deeper analysis some rules share, such as what a name counts), made on
        first use and kept with the context."""
        found = self._analyses.get(kind)
        if found is None:
            found = self._analyses[kind] = kind(self)
        return found  # type: ignore[return-value]

    def nodes(self, node_type: type) -> list[ast.AST]:
        """Every node of exactly this type, in source order of discovery (pre-order)."""
        return self.by_type.get(node_type, [])

    def parent(self, node: ast.AST) -> ast.AST | None:
        """The node directly containing ``node`` (None for the module)."""
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """The parents of ``node``, innermost first."""
        parent = self.parents.get(node)
        while parent is not None:
            yield parent
            parent = self.parents.get(parent)

    def scope(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module whose body holds ``node``."""
        child = node
        known = self._deep_scopes  # empty but in files nested very deep
        for steps, parent in enumerate(self.ancestors(node), start=1):
            if known and child in known:
                return known[child]
            if isinstance(parent, _SCOPES) and _in_own_scope(parent, child):
                return parent
            child = parent
            if steps == _DEEP:
                return self._deep_scope(node)
        return self.tree

    def _deep_scope(self, node: ast.AST) -> ast.AST:
        """``scope`` of a node nested very deep (a chain of a thousand calls): the answer is kept for every node
        on the way up, which all share it, so that asking it of each node of the chain stays linear."""
        known = self._deep_scopes
        path = []
        child = node
        found = self.tree
        for parent in self.ancestors(node):
            if child in known:
                found = known[child]
                break
            path.append(child)
            if isinstance(parent, _SCOPES) and _in_own_scope(parent, child):
                found = parent
                break
            child = parent
        for passed in path:
            known[passed] = found
        return found

    def enclosing_loop(self, node: ast.AST) -> ast.For | ast.AsyncFor | ast.While | None:
        """The innermost ``for``/``while`` loop whose body holds ``node``, within the same function."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, _SCOPES):
                return None
            if isinstance(parent, _LOOPS) and _in_loop_body(parent, child):
                return parent
            child = parent
        return None

    def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None:
        """The innermost class whose body (or a method of it) holds ``node``."""
        for parent in self.ancestors(node):
            if isinstance(parent, ast.ClassDef):
                return parent
        return None

    def is_inside(self, node: ast.AST, container: ast.AST) -> bool:
        """Whether ``container`` is ``node`` or one of its ancestors."""
        return node is container or any(parent is container for parent in self.ancestors(node))

    def segment(self, node: ast.AST) -> str:
        """The source text of a node (empty if unknown): ``ast.get_source_segment``, without splitting the
        whole file again on every call (a file with thousands of findings took minutes)."""
        try:
            first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
            start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return ""
        if last is None or end is None:
            return ""
        if self._source_lines is None:
            self._source_lines = _LINE_ENDS.split(self.source)  # ast's own split: \r\n, \r, \n, kept
            self._source_lines = [a + b for a, b in zip(self._source_lines[::2], [*self._source_lines[1::2], ""])
                                  if a + b]
        lines = self._source_lines
        if not 0 <= first <= last < len(lines):
            return ""
        if first == last:
            return lines[first].encode()[start:end].decode(errors="replace")
        head = lines[first].encode()[start:].decode(errors="replace")
        tail = lines[last].encode()[:end].decode(errors="replace")
        return "".join([head, *lines[first + 1:last], tail])

    def qualname(self, node: ast.AST) -> str | None:
        """The fully qualified name behind a name or attribute, through import aliases (``nn.Linear`` ->
        ``torch.nn.Linear``); None when the root name is not imported (or is rebound locally)."""
        known = self._qualnames
        if node in known:
            return known[node]
        found = None
        name = dotted(node)
        if name is not None:
            first, dot, rest = name.partition(".")
            root = self.aliases.get(first) or _IMPLICIT_MODULES.get(first)
            if root is not None:
                found = root + dot + rest
        known[node] = found
        return found

    def callee(self, call: ast.Call) -> str | None:
        """The qualified name of what a call calls, else its dotted text, else None."""
        return self.qualname(call.func) or dotted(call.func)

    def lookup(self, name: str, at: ast.AST) -> list[Binding]:
        """Bindings of a plain name visible at ``at``: its own scope, else the enclosing functions and module."""
        scope = self.scope(at)
        while True:
            found = self.bindings.get((scope, name))
            if found:
                return found
            if scope is self.tree:
                return []
            parent_scope = self.scope(scope)
            while isinstance(parent_scope, ast.ClassDef):  # class bodies are not visible from methods
                parent_scope = self.scope(parent_scope)
            scope = parent_scope

    def bindings_of(self, node: ast.AST, at: ast.AST | None = None) -> list[Binding]:
        """Bindings of a name (lexically) or a dotted attribute (file-wide) expression."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id, node if at is None else at)
        key = dotted(node)
        if key is None:
            return []
        return self.attr_bindings.get(key, [])

    def reaching(self, node: ast.AST, at: ast.AST | None = None) -> list[Binding]:
        """The bindings that most likely give ``node`` its value at ``at``: the last one before it in the
        source if there is one, else all of them (a loop may bring a later one round)."""
        at = node if at is None else at
        bindings = self.bindings_of(node, at)
        if len(bindings) > _ORDERED_FROM:
            return self._ordered(bindings).reaching(self, at)
        found = [b for b in bindings if b.kind != "del"]
        if not found:
            return []
        before = [b for b in found if position(b.stmt) < position(at) and not self.is_inside(at, b.stmt)]
        if not before:
            # `x = f(x)` style: the statement holding `at` itself does not count as before it.
            return found
        last = max(before, key=lambda b: position(b.stmt))
        if last.kind == "augassign":
            return [b for b in before if b.kind != "augassign"][-1:] or [last]
        return [last]

    def last_bound_before(self, node: ast.AST, at: ast.AST) -> list[Binding]:
        """The binding of ``node`` last before ``at`` in the source, a statement holding ``at`` included (so
        that ``x = x.to(device)`` inside a loop reads the loop's ``x``); all of them when none is before."""
        bindings = self.bindings_of(node, at)
        if len(bindings) > _ORDERED_FROM:
            return self._ordered(bindings).last_before(at)
        found = [b for b in bindings if b.kind != "del"]
        here = position(at)
        before = [b for b in found if position(b.stmt) < here]
        return [max(before, key=lambda b: position(b.stmt))] if before else found

    def memo_bindings(self, question: Hashable, bindings: list[Binding], answer: Callable[[], _T]) -> _T:
        """``answer()``, computed once per list of bindings (one name's, in one scope) and ``question``: for
        an answer that depends on nothing but those bindings (a name read a thousand times asks it once)."""
        if not bindings:
            return answer()
        key = (question, id(bindings))
        known = self._per_bindings.get(key)
        if known is not None and known[0] is bindings:
            return known[1]  # type: ignore[return-value]
        found = answer()
        self._per_bindings[key] = (bindings, found)
        return found

    def _ordered(self, bindings: list[Binding]) -> _OrderedBindings:
        """The source-order index of a long list of bindings (a name bound again by every cell of a notebook),
        made once per list."""
        found = self._binding_orders.get(id(bindings))
        if found is None or found.bindings is not bindings:
            found = self._binding_orders[id(bindings)] = _OrderedBindings(bindings)
        return found

    def restores_mode(self, call: ast.Call) -> bool:
        """Whether a ``.train(...)`` call puts back a mode saved before (``was_training = model.training``, then
        ``model.train(was_training)`` or ``if was_training: model.train()``): it restores, it does not switch."""
        if call.args or call.keywords:
            mode = call.args[0] if call.args else call.keywords[0].value
            return self._saved_mode(mode, call)
        child: ast.AST = call
        for parent in self.ancestors(call):
            if isinstance(parent, _SCOPES):
                return False
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                in_body = child is parent.body or any(child is s for s in _as_list(parent.body))
                return in_body and self._saved_mode(parent.test, call)
            child = parent
        return False

    def _saved_mode(self, expr: ast.AST, at: ast.AST) -> bool:
        """``model.training``, or a name bound to it (``was_training = model.training``)."""
        if isinstance(expr, ast.Attribute):
            return expr.attr == "training"
        if isinstance(expr, ast.Name):
            found = self.reaching(expr, at)
            return bool(found) and all(b.kind == "assign" and isinstance(b.value, ast.Attribute)
                                       and b.value.attr == "training" for b in found)
        return False

    def constant(self, node: ast.AST, depth: int = 0) -> object:
        """The value of a literal, or of a name bound exactly once to a literal; ``...`` when unknown."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and depth < 3:
            found = self.bindings_of(node)
            if len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked and found[0].value is not None:
                return self.constant(found[0].value, depth + 1)
        return ...

    def class_named(self, name: str, at: ast.AST) -> ast.ClassDef | None:
        """The class of the file a plain name at ``at`` refers to (its ``class`` statement), else None."""
        for b in self.lookup(name, at):
            if b.kind == "def" and isinstance(b.stmt, ast.ClassDef):
                return b.stmt
        return None

    def class_of_value(self, name: str, at: ast.AST) -> tuple[Context, ast.ClassDef] | None:
        """The class a plain name holds an instance of at ``at`` (``model = Net(...)``), of this file or, through
        the program, of another file of the run; with that file's context. None when unknown."""
        value = self.value_of(ast.Name(id=name, ctx=ast.Load()), at)
        if not isinstance(value, ast.Call):
            return None
        if isinstance(value.func, ast.Name) and (local := self.class_named(value.func.id, at)) is not None:
            return self, local  # type: ignore[return-value]
        return None if self.program is None else self.program.class_of(self, value.func)  # type: ignore[arg-type]

    def value_of(self, name: ast.Name, at: ast.AST) -> ast.AST | None:
        """The one value a name is built from: ``model = resnet50(...).to(device)``; ``model = model.cuda()``
        and ``model = torch.compile(model)`` rebind it to itself and do not count, and the same construction
        repeated (a notebook cell run again, copied further down) counts once."""
        bindings = self.lookup(name.id, at)
        known = self._values.get(id(bindings))
        if known is not None and known[0] is bindings:
            return known[1]  # the same answer for every read of the name in that scope, computed once
        values: dict[str, ast.AST] = {}
        found = None
        for b in bindings:
            if b.kind != "assign" or b.unpacked or b.value is None:
                break
            value = self.strip_moves(b.value)
            if not (isinstance(value, ast.Name) and value.id == name.id):
                values.setdefault(ast.dump(value), value)
        else:
            found = next(iter(values.values())) if len(values) == 1 else None
        if bindings:
            self._values[id(bindings)] = (bindings, found)
        return found

    def self_value(self, cls: ast.ClassDef, attr: str) -> ast.AST | None:
        """The one value ``self.<attr>`` is built from in the methods of ``cls``."""
        values = []
        for b in self.attr_bindings.get(f"self.{attr}", []):
            if self.enclosing_class(b.stmt) is not cls:
                continue
            given = bound_value(b) if b.kind == "assign" else None
            if given is None:
                return None
            value = self.strip_moves(given)
            if dotted(value) != f"self.{attr}":
                values.append(value)
        return values[0] if len(values) == 1 else None

    def strip_moves(self, value: ast.expr) -> ast.expr:
        """``resnet50(...).to(device)`` -> ``resnet50(...)``, ``torch.compile(model)`` -> ``model``: the module
        itself, without the moves and the compilation that return it."""
        while True:
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                    and value.func.attr in ("to", "cuda", "cpu", "float")):
                value = value.func.value  # type: ignore[attr-defined]
            elif (isinstance(value, ast.Call) and len(value.args) == 1 and not isinstance(value.args[0], ast.Starred)
                  and (self.qualname(value.func) == "torch.compile" or self._unwraps(value.func))):
                value = value.args[0]
            else:
                return value

    def _unwraps(self, func: ast.expr) -> bool:
        """``accelerator.unwrap_model``, or a function of this file that hands back the model it is given, or
        the one inside a ``DataParallel``/DDP wrapper (``return model.module if isinstance(model, DDP) else
        model``): what it returns is that model."""
        if isinstance(func, ast.Attribute):
            return func.attr == "unwrap_model"
        if not isinstance(func, ast.Name):
            return False
        found = self.functions_named(func.id)  # type: ignore[attr-defined]
        return len(found) == 1 and _hands_back_its_argument(found[0])


def _hands_back_its_argument(fn: ast.AST) -> bool:
    """Whether a one-parameter function's every ``return`` gives the parameter or its ``.module`` (also as
    either side of ``a if test else b``), and it has at least one."""
    args = getattr(fn, "args", None)
    if not isinstance(args, ast.arguments) or len(args.posonlyargs) + len(args.args) != 1:
        return False
    name = (args.posonlyargs or args.args)[0].arg

    def model(expr: ast.AST | None) -> bool:
        if isinstance(expr, ast.IfExp):
            return model(expr.body) and model(expr.orelse)
        if isinstance(expr, ast.Attribute) and expr.attr == "module":
            expr = expr.value
        return isinstance(expr, ast.Name) and expr.id == name

    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    return bool(returns) and all(model(r.value) for r in returns)


# Past this many ancestors, ``scope`` remembers its answer for every node on the way (see ``_deep_scope``).
_DEEP = 32

# Past this many bindings of one name, ``reaching`` looks them up in source order instead of scanning them all.
_ORDERED_FROM = 16


class _OrderedBindings:
    """One name's bindings (a list of ``FileIndex``) in source order, for ``reaching`` in logarithmic time: a
    name bound thousands of times (a training loop repeated at module level, a notebook's cells) made every
    read of it scan them all. Gives the same answer as the scan, ties included: among bindings at the same
    position the first in the list wins, and the ``+=`` case takes the last plain binding in list order."""

    def __init__(self, bindings: list[Binding]) -> None:
        self.bindings = bindings
        self.found = [b for b in bindings if b.kind != "del"]
        # (position, list index) of every binding that is not a `del`, in source order
        self.order = sorted(range(len(bindings)), key=lambda i: (position(bindings[i].stmt), i))
        self.order = [i for i in self.order if bindings[i].kind != "del"]
        self.positions = [position(bindings[i].stmt) for i in self.order]
        self.at_statement: dict[int, list[int]] = {}  # id(statement) -> ranks in `order` of its bindings
        for rank, i in enumerate(self.order):
            self.at_statement.setdefault(id(bindings[i].stmt), []).append(rank)
        # plain (not `+=`) bindings' list indices by rank, -1 for `+=`: range maxima by a sparse table
        table = [i if bindings[i].kind != "augassign" else -1 for i in self.order]
        self.sparse = [table]
        width = 1
        while 2 * width <= len(table):
            last = self.sparse[-1]
            self.sparse.append([max(last[k], last[k + width]) for k in range(len(table) - 2 * width + 1)])
            width *= 2

    def _range_max(self, start: int, stop: int) -> int:
        """The largest entry of the sparse table's base over ranks ``start`` to ``stop - 1`` (-1 if empty)."""
        if start >= stop:
            return -1
        level = (stop - start).bit_length() - 1
        row = self.sparse[level]
        return max(row[start], row[stop - (1 << level)])

    def last_before(self, at: ast.AST) -> list[Binding]:
        """``FileIndex.last_bound_before`` for these bindings."""
        if not self.found:
            return []
        limit = bisect.bisect_left(self.positions, position(at))
        if limit == 0:
            return list(self.found)
        first = bisect.bisect_left(self.positions, self.positions[limit - 1])  # the first in list order there
        return [self.bindings[self.order[first]]]

    def reaching(self, index: FileIndex, at: ast.AST) -> list[Binding]:
        """``FileIndex.reaching`` for these bindings."""
        if not self.found:
            return []
        bindings, order = self.bindings, self.order
        limit = bisect.bisect_left(self.positions, position(at))
        # Bindings before `at` whose statement holds `at` do not count (`x = f(x)`): the statement and its
        # ancestors are the only ones that can.
        excluded = sorted(rank for holder in (at, *index.ancestors(at))
                          for rank in self.at_statement.get(id(holder), ()) if rank < limit)
        excluded_set = set(excluded)
        last_rank = -1
        for rank in range(limit - 1, -1, -1):
            if rank not in excluded_set:
                last_rank = rank
                break
        if last_rank < 0:
            return list(self.found)
        # the first in list order among the bindings at the last position before `at`
        top = self.positions[last_rank]
        rank = last_rank
        while rank > 0 and self.positions[rank - 1] == top:
            rank -= 1
            if rank not in excluded_set:
                last_rank = rank
        last = bindings[order[last_rank]]
        if last.kind != "augassign":
            return [last]
        best, start = -1, 0
        for rank in [*excluded, limit]:
            best = max(best, self._range_max(start, rank))
            start = rank + 1
        return [bindings[best]] if best >= 0 else [last]


def _transformers_model(qualname: str | None) -> bool:
    """A Hugging Face PyTorch model class (``transformers.PreTrainedModel``, ``BertModel``,
    ``BertForSequenceClassification``...): an ``nn.Module``; the TensorFlow and Flax ones, the ``Auto*`` factories
    and the ``DataCollatorFor*`` classes are not."""
    if qualname is None or not qualname.startswith("transformers."):
        return False
    name = qualname.rsplit(".", 1)[1]
    if name.startswith(("TF", "Flax", "Auto", "DataCollator")):  # other frameworks, factories, collators
        return False
    return name.endswith("Model") or re.fullmatch(r"[A-Z]\w*For[A-Z]\w*", name) is not None


def _as_list(body: object) -> list[ast.AST]:
    return body if isinstance(body, list) else [body]  # type: ignore[list-item, return-value]
