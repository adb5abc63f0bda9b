"""The file's index, built in one pass: parents, nodes by type, scopes, bindings, import aliases, and
questions about names and structure (where a node sits, what a name is bound to, its constant value)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

from trainwise.doctor.context.syntax import (
    Binding,
    _inside,
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
    """Whether ``child`` (a direct child of the scope node) runs inside that scope rather than around it."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return child in scope.body or child is scope.args
    if isinstance(scope, ast.Lambda):
        return child is scope.body or child is scope.args
    if isinstance(scope, ast.ClassDef):
        return child in scope.body
    return True


_T = TypeVar("_T")


class FileIndex:
    """The file's index, built in one pass: parents, nodes by type, scopes, bindings, import aliases, and"""

    def __init__(self, tree: ast.Module, source: str, path: str = "<string>") -> None:
        self.tree = tree
        self.source = source
        self.path = path
        self.lines = split_lines(source)  # not str.splitlines: U+2028 in a string does not end a line
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
        if isinstance(func, ast.Attribute):
            receiver = dotted(func.value)
            if receiver is not None:
                self.method_receivers.setdefault(func.attr, set()).add(receiver)
        name = dotted(func)
        if name is not None:
            self.called.add(name)

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
        for parent in self.ancestors(node):
            if isinstance(parent, _SCOPES) and _in_own_scope(parent, child):
                return parent
            child = parent
        return self.tree

    def enclosing_loop(self, node: ast.AST) -> ast.For | ast.AsyncFor | ast.While | None:
        """The innermost ``for``/``while`` loop whose body holds ``node``, within the same function."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, _SCOPES):
                return None
            if isinstance(parent, _LOOPS) and _inside(child, parent.body):
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
        found = [b for b in self.bindings_of(node, at) if b.kind != "del"]
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
        values: dict[str, ast.AST] = {}
        for b in self.lookup(name.id, at):
            if b.kind != "assign" or b.unpacked or b.value is None:
                return None
            value = self.strip_moves(b.value)
            if not (isinstance(value, ast.Name) and value.id == name.id):
                values.setdefault(ast.dump(value), value)
        return next(iter(values.values())) if len(values) == 1 else None

    def self_value(self, cls: ast.ClassDef, attr: str) -> ast.AST | None:
        """The one value ``self.<attr>`` is built from in the methods of ``cls``."""
        values = []
        for b in self.attr_bindings.get(f"self.{attr}", []):
            if self.enclosing_class(b.stmt) is not cls:
                continue
            if b.kind != "assign" or b.unpacked or b.value is None:
                return None
            value = self.strip_moves(b.value)
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
                  and self.qualname(value.func) == "torch.compile"):
                value = value.args[0]
            else:
                return value


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
