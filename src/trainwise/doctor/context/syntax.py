"""Syntax helpers every part of the analysis and the rules share: dotted names, bindings, scopes, loops."""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Optional

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

# Definitions whose bodies run at another time than the code around them.
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

_MODEL_NAME = re.compile(
    r"(?:\w*_)?(?:model|net|network|encoder|decoder|backbone|classifier|generator|discriminator|teacher|student)"
    r"(?:_\w*)?",
    re.IGNORECASE,
)

_MODEL_CAMEL = re.compile(r"(?:model|net)[A-Z0-9]\w*|\w*(?:Net|Model)\d*")

@dataclass(frozen=True)
class Binding:
    """One place a name (or a dotted attribute such as ``self.model``) gets a value.

    ``value`` is the assigned expression (``None`` for parameters, loop targets without a known source, and
    imports); ``iter`` is what a ``for`` loop iterates over; ``unpacked`` is true for tuple targets.
    """

    target: ast.AST
    stmt: ast.AST
    kind: str  # "assign", "augassign", "for", "with", "param", "import", "walrus", "del"
    value: Optional[ast.expr] = None  # noqa: UP045 - dataclass annotations stay evaluable on 3.10
    iter: Optional[ast.expr] = None  # noqa: UP045
    unpacked: bool = False
    index: Optional[int] = None  # noqa: UP045 - position in an unpacked tuple target, when known

@dataclass(frozen=True)
class LoaderInfo:
    """What is known of a DataLoader: the call that built it (if seen) and whether each batch is one sample."""

    call: ast.Call | None
    one_sample_per_batch: bool
    custom_sampling: bool  # sampler/batch_sampler/drop_last: len(loader.dataset) may not be the sample count

def bound_value(binding: Binding) -> ast.expr | None:
    """The expression an assignment gives its target: the value, or the matching element of a tuple assigned
    to a tuple (``self.net, self.data = net, data``); None for another unpacking or no value."""
    value = binding.value
    if not binding.unpacked:
        return value
    if binding.index is None or not isinstance(value, (ast.Tuple, ast.List)):
        return None
    if any(isinstance(e, ast.Starred) for e in value.elts) or binding.index >= len(value.elts):
        return None
    targets = binding.stmt.targets if isinstance(binding.stmt, ast.Assign) else []
    if not any(isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(value.elts)
               and any(e is binding.target for e in t.elts) for t in targets):
        return None
    return value.elts[binding.index]


def walk_own(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node in and below ``nodes``, nested function, lambda and class definitions excluded."""
    stack = list(nodes)
    pop, push, extend = stack.pop, stack.append, stack.extend
    node_class = ast.AST
    known_fields = _FIELDS
    while stack:
        node = pop()
        if isinstance(node, DEFINITIONS):
            continue
        yield node
        # the children in the order of ast.iter_child_nodes, without its two generators per node
        fields = known_fields.get(type(node))
        for field in fields if fields is not None else child_fields(type(node)):
            value = getattr(node, field, None)
            if isinstance(value, node_class):
                push(value)
            elif type(value) is list:
                extend([item for item in value if isinstance(item, node_class)])


_FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(node_type: type) -> tuple[str, ...]:
    """The names of a node type's fields in ``_fields`` order (what ``ast.iter_child_nodes`` looks at), looked
    up once per type."""
    found = _FIELDS.get(node_type)
    if found is None:
        found = _FIELDS[node_type] = tuple(getattr(node_type, "_fields", ()))
    return found


def iter_children(node: ast.AST) -> list[ast.AST]:
    """``list(ast.iter_child_nodes(node))``, the same nodes in the same order, made faster."""
    out: list[ast.AST] = []
    node_class = ast.AST
    for field in child_fields(type(node)):
        value = getattr(node, field, None)
        if isinstance(value, node_class):
            out.append(value)
        elif type(value) is list:
            out.extend([item for item in value if isinstance(item, node_class)])
    return out


def walk_calls(container: ast.AST) -> list[ast.Call]:
    """Every call in and below ``container``, in the order of ``ast.walk`` (breadth first), found faster."""
    found = []
    queue = collections.deque([container])
    pop, push, extend = queue.popleft, queue.append, queue.extend
    node_class, call_class = ast.AST, ast.Call
    while queue:
        node = pop()
        if isinstance(node, call_class):
            found.append(node)
        for field in child_fields(type(node)):
            value = getattr(node, field, None)
            if isinstance(value, node_class):
                push(value)
            elif type(value) is list:
                extend([item for item in value if isinstance(item, node_class)])
    return found

def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if type(node) is ast.Name:
        return node.id  # the most common case, asked millions of times
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))

def last_name(node: ast.AST) -> str | None:
    """The last component of a name or attribute (``nn.Linear`` -> ``Linear``), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None

def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    """The keyword argument ``name=`` of a call, if given explicitly."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None

def has_star_kwargs(call: ast.Call) -> bool:
    """Whether the call passes ``**kwargs`` (which may hold any keyword)."""
    return any(kw.arg is None for kw in call.keywords)

def is_const(node: ast.AST | None, value: object) -> bool:
    """Whether ``node`` is the literal ``value`` (compared by type and value, so ``1`` is not ``True``)."""
    return isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value

def method_call(node: ast.AST, *names: str) -> bool:
    """Whether ``node`` is a call ``<something>.<name>(...)`` for one of ``names``."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names

def position(node: ast.AST) -> tuple[int, int]:
    """(line, column) of a node, for ordering; (0, 0) for nodes without a position."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))

_LOADER_NAME = re.compile(r"\w*loaders?\w*|(?:\w+_)?dls?(?:_\w+)?", re.IGNORECASE)

_NO_GRAPH_METHODS = frozenset({"item", "tolist", "detach", "argmax", "argmin", "numpy"})

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)

def names_in(node: ast.AST, *, returned: bool = False, cut: Callable[[ast.Call], bool] | None = None) -> set[str]:
    """Dotted names in an expression. For a returned value, only those whose graph can reach the caller:
    not inside comprehensions or lambdas, nor under ``.item()``/``.argmax()``/``.detach()``. ``cut``: calls whose
    arguments are left out as well (a call whose result carries no graph)."""
    found = set()
    stack = [node]
    while stack:
        sub = stack.pop()
        if returned and sub is not node and isinstance(sub, _COMPREHENSIONS):
            continue
        if cut is not None and isinstance(sub, ast.Call) and cut(sub):
            continue
        if returned and isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and (
            sub.func.attr in _NO_GRAPH_METHODS
        ):
            stack.extend(sub.args)
            continue
        if isinstance(sub, (ast.Name, ast.Attribute)):
            key = dotted(sub)
            if key is not None:
                found.add(key)
        stack.extend(ast.iter_child_nodes(sub))
    return found


def is_param(fn: ast.AST, name: str) -> bool:
    """Whether ``name`` is a parameter of the function ``fn`` (positional or keyword; not ``*args``)."""
    args = getattr(fn, "args", None)
    if not isinstance(args, ast.arguments):
        return False
    return any(a.arg == name for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def argument(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, name: str, call: ast.Call, *,
             method: bool = False, default: bool = False) -> ast.expr | None:
    """The expression ``call`` passes for the parameter ``name`` of ``fn`` (``method``: a call bound to an
    instance, whose first parameter is not passed); with ``default``, the parameter's default value when the
    call does not pass it. None when unknown (``*args``/``**kwargs`` in the way, no such parameter)."""
    kw = keyword(call, name)
    if kw is not None:
        return kw.value
    args = fn.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    if name in positional:
        index = positional.index(name) - (1 if method else 0)
        if index < 0 or any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
            return None
        if index < len(call.args):
            return call.args[index]
        if not default or has_star_kwargs(call):
            return None
        first_default = len(positional) - len(args.defaults)
        at = positional.index(name)
        return args.defaults[at - first_default] if at >= first_default else None
    for arg, value in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == name and default and not has_star_kwargs(call):
            return value
    return None


def is_bound_method(fn: ast.AST, parent: ast.AST | None) -> bool:
    """A function defined in a class body (``parent``) and bound to its instance: not a static method."""
    if not isinstance(parent, ast.ClassDef):
        return False
    return not any(last_name(d) == "staticmethod" for d in getattr(fn, "decorator_list", ()))


def init_of(cls: ast.ClassDef) -> ast.FunctionDef | None:
    """The ``__init__`` defined in a class's own body, if any."""
    return next((fn for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name == "__init__"), None)
