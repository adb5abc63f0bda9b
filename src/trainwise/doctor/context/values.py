"""What builds a value: the class (of the run) or the outside call that constructs the object a name holds.

``model = MODELS[name](num_classes=10)`` with ``name = "mobilenet"`` and ``MODELS = {"mobilenet": mobilenet}``
in ``nets/__init__.py``, ``def mobilenet(**kw): net = MobileNet(**kw); return net`` in ``nets/mobilenet.py``:
the object is a ``MobileNet`` of ``nets/mobilenet.py``. ``built_by(ctx, expr, at)`` follows names (every
assignment of the name, which must agree), calls of factory functions of the run (through their ``return``),
classes of the run, and dict registries subscripted with a constant key, in this file or another file of the
run. The answer is a ``Built``: a class of the run with its file's context, or the outside call that builds
the object (``torchvision.models.resnet50(...)``), which the caller may know about. Anything else is None:
the question leans towards "unknown", as every question of the context does.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainwise.doctor.context.syntax import (
    Binding,
    argument,
    bound_value,
    init_of,
    is_bound_method,
    is_param,
    method_call,
)

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

_DEPTH = 6  # names, factories and registries followed, at most
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_MAX_SITES = 32  # constructions of a class followed, at most
# Where a factory was called: the caller's context, the call, the factory's context and function (whose parameters
# hold the call's arguments).
Site = tuple["Context", ast.Call, "Context", "ast.FunctionDef | ast.AsyncFunctionDef"]


@dataclass(frozen=True)
class Built:
    """A class of the run (``node`` is its ``ClassDef``) or an outside call (``node`` is the ``Call``), with
    the context of the file that holds ``node``."""

    ctx: Context
    node: ast.ClassDef | ast.Call

    @property
    def cls(self) -> ast.ClassDef | None:
        return self.node if isinstance(self.node, ast.ClassDef) else None


def built_by(ctx: Context, expr: ast.AST, at: ast.AST, depth: int = 0, site: Site | None = None) -> Built | None:
    """The class or outside call that builds the object ``expr`` holds at ``at`` (see the module docstring);
    ``site``: ``at`` is in a function called there, whose parameters hold what the call passes."""
    if depth > _DEPTH:
        return None
    if isinstance(expr, ast.Name):
        return _from_bindings(ctx, expr, at, depth, site)
    if isinstance(expr, ast.Call):
        value = ctx.strip_moves(expr)
        if value is not expr:
            return built_by(ctx, value, at, depth + 1)
        return _called(ctx, expr.func, expr, at, depth)
    return None


def classes_built(ctx: Context, name: ast.Name, at: ast.AST) -> list[Built] | None:
    """The classes of the run a name may hold at ``at``: one per assignment of it in its scope (``if cfg.a:
    model = A(...) else: model = B(...)`` gives both); None when any assignment builds something else or is
    not a plain assignment (a parameter, an unpacking), or when there is none."""
    found: dict[int, Built] = {}
    bindings = ctx.lookup(name.id, at)
    for binding in bindings:
        if binding.kind != "assign" or binding.unpacked or binding.value is None:
            return None
        value = ctx.strip_moves(binding.value)
        if isinstance(value, ast.Name) and value.id == name.id:
            continue
        built = built_by(ctx, value, binding.stmt, 1)
        if built is None or built.cls is None:
            return None
        found.setdefault(id(built.node), built)
    return list(found.values()) or None


def _from_bindings(ctx: Context, name: ast.Name, at: ast.AST, depth: int, site: Site | None = None) -> Built | None:
    """Every assignment of the name must build the same thing (``if vit: model = R[k](a) else: model = R[k](b)``
    both give the registry's class); a parameter is what the ``site`` passes it (a loader that hands the model
    back: ``def restore(model, path): ...; return model``), else unknown, as a loop variable or an unpacking."""
    found: Built | None = None
    bindings = ctx.lookup(name.id, at)
    if not bindings:
        return _imported(ctx, name, depth)
    for binding in bindings:
        if binding.kind == "param" and site is not None and binding.stmt is site[3]:
            built = _passed(site, name.id, depth)
            if built is None or (found is not None and built.node is not found.node):
                return None
            found = built
            continue
        given = handed_back(ctx, binding)
        if given is None:
            return None
        value = ctx.strip_moves(given)
        if isinstance(value, ast.Name) and value.id == name.id:
            continue  # model = model.cuda(); model, opt = accelerator.prepare(model, opt)
        built = built_by(ctx, value, binding.stmt, depth + 1, site)
        if built is None or (found is not None and (built.node is not found.node)):
            return None
        found = built
    return found


def handed_back(ctx: Context, binding: Binding) -> ast.expr | None:
    """The expression an assignment gives its target (``syntax.bound_value``), or, for ``model, opt =
    accelerator.prepare(model, opt)``, the argument in its place: accelerate hands back what it is given (a
    model wrapped for DDP holds the same modules)."""
    if binding.kind != "assign":
        return None
    value = binding.value
    if (binding.unpacked and binding.index is not None and isinstance(value, ast.Call) and method_call(value, "prepare")
            and not value.keywords and binding.index < len(value.args)
            and not any(isinstance(a, ast.Starred) for a in value.args) and _accelerator(ctx, value.func.value, value)):  # type: ignore[attr-defined]
        return value.args[binding.index]
    return bound_value(binding)


def _accelerator(ctx: Context, expr: ast.expr, at: ast.AST) -> bool:
    """Whether ``expr`` holds an ``accelerate.Accelerator``."""
    value = ctx.value_of(expr, at) if isinstance(expr, ast.Name) else None
    return isinstance(value, ast.Call) and ctx.qualname(value.func) == "accelerate.Accelerator"


def _passed(site: Site, param: str, depth: int) -> Built | None:
    """What builds the argument a call passes for ``param``: for a name, the assignment that reaches the call
    (``model = restore(model, path)`` hands ``restore`` the model assigned before)."""
    ctx, call, callee, fn = site
    arg = argument(fn, param, call, method=is_bound_method(fn, callee.parent(fn)))
    if isinstance(arg, ast.Name):
        reaching = ctx.reaching(arg, call)
        if len(reaching) == 1 and reaching[0].kind == "assign":
            given = bound_value(reaching[0])
            return None if given is None else built_by(ctx, ctx.strip_moves(given), reaching[0].stmt, depth + 1)
    return None if arg is None else built_by(ctx, arg, call, depth + 1)


def _imported(ctx: Context, name: ast.Name, depth: int) -> Built | None:
    """A module-level object of another file of the run (``from nets import model``)."""
    program = ctx.program
    symbol = program.resolve(ctx, name) if program is not None else None
    if program is None or symbol is None or symbol.name is None or "." in symbol.name:
        return None
    other = program.context(symbol.path)
    if other is None:
        return None
    return _from_bindings(other, ast.Name(id=symbol.name, ctx=ast.Load()), other.tree, depth + 1)


def _called(ctx: Context, func: ast.expr, call: ast.Call | None, at: ast.AST, depth: int) -> Built | None:
    """What calling ``func`` builds: a class of the run, a factory function of the run (what it returns), an
    entry of a dict registry, or else the outside call itself."""
    if isinstance(func, ast.Subscript):
        entry = _registry_entry(ctx, func, at, depth)
        return None if entry is None else _called(entry[0], entry[1], None, entry[1], depth + 1)
    if isinstance(func, ast.Name):
        cls = ctx.class_named(func.id, at)
        if cls is not None:
            return Built(ctx, cls)
        local = [fn for fn in ctx.functions_named(func.id) if ctx.scope(fn) is ctx.tree]
        if len(local) == 1:
            return _returned(ctx, local[0], depth, None if call is None else (ctx, call, ctx, local[0]))
    program = ctx.program
    if program is not None and isinstance(func, (ast.Name, ast.Attribute)):
        symbol = program.resolve(ctx, func)
        if symbol is not None and symbol.name is not None:
            found = program.class_of(ctx, func)
            if found is not None:
                return Built(found[0], found[1])
            function = program.function(symbol)
            if function is not None:
                site = None if call is None else (ctx, call, function[0], function[1])
                return _returned(function[0], function[1], depth, site)
            return None  # something of the run this question does not follow
    return Built(ctx, call) if call is not None and ctx.qualname(func) is not None else None


def _returned(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int,
              site: Site | None = None) -> Built | None:
    """What a factory function returns, when every ``return`` of it (not of a nested function) agrees; with the
    ``site`` it was called at, a parameter it returns is the argument passed there."""
    found: Built | None = None
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and ctx.scope(n) is fn]
    if not returns:
        return None
    for ret in returns:
        if ret.value is None:
            return None
        built = built_by(ctx, ret.value, ret, depth + 1, site)
        if built is None or (found is not None and built.node is not found.node):
            return None
        found = built
    return found


def _registry_entry(ctx: Context, subscript: ast.Subscript, at: ast.AST, depth: int) -> tuple[Context, ast.expr] | None:
    """``MODELS[key]`` with a constant key and ``MODELS`` a dict literal of this file or another: the entry's
    value expression, with the context of the file that holds the dict."""
    key = ctx.constant(subscript.slice)
    if not isinstance(key, str) or not isinstance(subscript.value, ast.Name):
        return None
    table = _dict_literal(ctx, subscript.value, at, depth)
    if table is None:
        return None
    owner, literal = table
    for k, v in zip(literal.keys, literal.values):
        if k is not None and owner.constant(k) == key:
            return owner, v
    return None


def _dict_literal(ctx: Context, name: ast.Name, at: ast.AST, depth: int) -> tuple[Context, ast.Dict] | None:
    bindings = ctx.lookup(name.id, at)
    if len(bindings) == 1 and bindings[0].kind == "assign" and isinstance(bindings[0].value, ast.Dict):
        return ctx, bindings[0].value
    program = ctx.program
    if bindings or program is None or depth > _DEPTH:
        return None
    symbol = program.resolve(ctx, name)
    other = program.context(symbol.path) if symbol is not None and symbol.name is not None else None
    if other is None or symbol is None or "." in (symbol.name or "."):
        return None
    return _dict_literal(other, ast.Name(id=symbol.name, ctx=ast.Load()), other.tree, depth + 1)  # type: ignore[arg-type]


def given_to(ctx: Context, cls: ast.ClassDef, attr: str) -> list[tuple[Context, ast.expr, ast.Call]]:
    """``(context, argument, construction)``: what each construction of ``cls``, in its file or another file of
    the run, passes for the ``__init__`` parameter that ``self.<attr>`` holds (``self.model = model``, or
    ``self.net, self.data = net, data``). Empty when ``self.<attr>`` is not such a parameter."""
    init = init_of(cls)
    value = ctx.self_value(cls, attr)
    if init is None or not (isinstance(value, ast.Name) and is_param(init, value.id)):
        return []
    sites = [(ctx, call) for call in ctx.constructions(cls)]
    if ctx.program is not None and ctx.scope(cls) is ctx.tree:
        sites += ctx.program.callers(ctx, cls)
    out = []
    for there, call in sites[:_MAX_SITES]:
        arg = argument(init, value.id, call, method=True)
        if arg is not None:
            out.append((there, arg, call))
    return out


def builders(ctx: Context, path: str, at: ast.AST) -> list[Built]:
    """What builds the object at the root of the dotted ``path`` at ``at``: ``built_by`` of a plain name; for
    ``self.<attr>`` in a class that is given it (a trainer's model), what each construction passes."""
    root, _dot, rest = path.partition(".")
    if root != "self":
        built = built_by(ctx, ast.Name(id=root, ctx=ast.Load()), at)
        return [] if built is None else [built]
    cls = ctx.enclosing_class(at)
    if cls is None or not rest:
        return []
    out = []
    for there, arg, call in given_to(ctx, cls, rest.split(".")[0]):
        built = built_by(there, arg, call)
        if built is not None:
            out.append(built)
    return out
