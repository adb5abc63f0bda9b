"""Which file a checkpoint path names, as a pattern, followed into the functions and constructors that build it.

A training script rarely writes ``torch.save(sd, "best.pth")``: the path is joined from a folder given on the
command line (``os.path.join(args.out, "best.pth")``), formatted in a helper (``self.dir / "{}_{}.{}".format(
self.stem, step, self.ext)`` of a checkpoint writer built with ``CheckpointWriter(out, "ckpt", "pth")``), and read
back by a glob (``sorted(folder.glob(f"{stem}_*.{ext}"))[-1]``). ``path_pattern`` turns such an expression into a
glob-like pattern, ``*`` standing for every part it cannot know (``*/ckpt_*.pth``), reading parameters at the call
that runs the function (a ``Frame``) and ``self.attr`` at the constructor call that built the instance;
``same_file`` says whether a saved and a loaded pattern name the same file; ``frames_of`` gives the functions a call
runs (a function or method of the file, a function of another file of the run, a method of an instance built from
a class of the run).
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass
from fnmatch import fnmatchcase

from trainwise.doctor.context import Context, argument, dotted, is_param, last_name, method_call
from trainwise.doctor.context.functions import constant_of, functions

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEPTH = 12
_JOINS = frozenset({"os.path.join", "posixpath.join", "ntpath.join"})
_PATHS = frozenset({"Path", "PurePath", "PosixPath", "WindowsPath"})
_SAME_PATH = frozenset({"str", "fspath", "abspath", "realpath", "normpath", "expanduser"})  # f(path) -> path
_SAME_PATH_METHODS = frozenset({"resolve", "absolute", "expanduser", "as_posix"})  # path.m() -> path
_LISTINGS = frozenset({"list", "sorted", "reversed", "tuple"})  # list(folder.glob(p)): the same files
_GLOBS = frozenset({"glob.glob", "glob.iglob"})
_PERCENT = re.compile(r"%(?:%|[-#0 +]*\d*(?:\.\d+)?[sdifgxXeEr])")


@dataclass(frozen=True)
class Frame:
    """A function read for one call of it: ``fn`` (of the file ``ctx``) run by ``call`` (in ``caller``), whose own
    frame is ``outer`` when that call sits in a function read the same way. ``method``: the call is bound to an
    instance (its first parameter is not passed); ``built``: the constructor call (in ``caller``) that made the
    instance, so that ``self.attr`` set in ``__init__`` can be read there."""

    ctx: Context
    fn: ast.FunctionDef | ast.AsyncFunctionDef
    caller: Context
    call: ast.Call
    method: bool = False
    built: ast.Call | None = None
    outer: Frame | None = None


def frames_of(ctx: Context, call: ast.Call, outer: Frame | None = None) -> list[Frame]:
    """The functions ``call`` runs: a method of an instance built from a class of the file or of the run
    (``writer.save(...)`` with ``writer = CheckpointWriter(...)``), a function or method of the file by name, or a
    function of another file of the run it imports."""
    func = call.func
    receiver = dotted(func.value) if isinstance(func, ast.Attribute) else None
    if isinstance(func, ast.Attribute) and receiver not in (None, "self"):
        built = _constructor(ctx, func.value, call)
        if built is not None:
            there, cls, construction = built
            methods = [s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name == func.attr]
            return [Frame(there, methods[0], ctx, call, True, construction, outer)] if len(methods) == 1 else []
    found: list[Frame] = []
    if ctx.qualname(func) is None and (receiver is None or receiver == "self"):
        own_class = ctx.enclosing_class(call)
        for fn in functions(ctx).targets(call):
            if receiver == "self" and ctx.enclosing_class(fn) is not own_class:
                continue  # self.save(...) runs the method of its own class, not a same-named one elsewhere
            found.append(Frame(ctx, fn, ctx, call, receiver == "self", None, outer))
    if not found and ctx.program is not None:
        other = ctx.program.callee(ctx, call)
        if other is not None:
            found.append(Frame(other[0], other[1], ctx, call, False, None, outer))
    return found


def _constructor(ctx: Context, receiver: ast.AST, at: ast.AST) -> tuple[Context, ast.ClassDef, ast.Call] | None:
    """The class of the file or of the run an instance was built from, with the constructor call: every value
    the name is given is that one call, or ``None`` (``writer = Writer(...) if out else None``)."""
    bindings = [b for b in ctx.bindings_of(receiver, at) if b.kind != "del"]
    calls = []
    for b in bindings:
        if b.kind != "assign" or b.unpacked:
            return None
        values = [b.value.body, b.value.orelse] if isinstance(b.value, ast.IfExp) else [b.value]
        for value in values:
            if isinstance(value, ast.Constant) and value.value is None:
                continue
            if not isinstance(value, ast.Call):
                return None
            calls.append(value)
    if len(calls) != 1:
        return None
    construction = calls[0]
    if isinstance(construction.func, ast.Name) and ctx.qualname(construction.func) is None:
        classes = [c for c in ctx.nodes(ast.ClassDef) if c.name == construction.func.id]  # type: ignore[attr-defined]
        return (ctx, classes[0], construction) if len(classes) == 1 else None  # type: ignore[return-value]
    program = ctx.program
    found = program.class_of(ctx, construction.func) if program is not None else None
    return (found[0], found[1], construction) if found is not None else None


# ------------------------------------------------------------------------------------------------------ patterns
def path_pattern(ctx: Context, expr: ast.AST, at: ast.AST, frame: Frame | None = None) -> str:
    """The file ``expr`` (read at ``at``, inside ``frame``'s function when given) names, as a glob-like pattern
    with ``*`` for what cannot be known: ``os.path.join(args.out, "best.pth")`` -> ``*/best.pth``."""
    text = _pattern(ctx, expr, at, frame, 0)
    text = re.sub(r"\*+", "*", text.replace("\\", "/"))
    text = re.sub(r"/+", "/", text)
    return text[2:] if text.startswith("./") else text


def same_file(saved: str, loaded: str) -> bool:
    """Whether two path patterns name the same file: equal constant paths, or, when a part is unknown, the
    same file name with a telling stem of its own (``*/ckpt_*.pth`` and ``runs/ckpt_*.pth``; not ``*.pth``), in
    folders that may be the same (``*`` and ``runs``, not ``runs/*`` and ``pretrained``)."""
    if "*" not in saved and "*" not in loaded:
        return saved == loaded
    saved_dir, _, saved_name = saved.rpartition("/")
    loaded_dir, _, loaded_name = loaded.rpartition("/")
    if saved_name != loaded_name:
        return False
    stem = saved_name.rsplit(".", 1)[0] if "." in saved_name else saved_name
    if len(re.sub(r"[^0-9A-Za-z]", "", stem.replace("*", ""))) < 3:
        return False
    return not saved_dir or not loaded_dir or fnmatchcase(saved_dir, loaded_dir) or fnmatchcase(loaded_dir, saved_dir)


def _pattern(ctx: Context, expr: ast.AST | None, at: ast.AST, frame: Frame | None, depth: int) -> str:
    if expr is None or depth > _DEPTH:
        return "*"
    value = constant_of(ctx, expr)
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    deeper = depth + 1
    if isinstance(expr, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                       else _pattern(ctx, getattr(v, "value", None), at, frame, deeper) for v in expr.values)
    if isinstance(expr, ast.BinOp):
        left = _pattern(ctx, expr.left, at, frame, deeper)
        if isinstance(expr.op, ast.Add):
            return left + _pattern(ctx, expr.right, at, frame, deeper)
        if isinstance(expr.op, ast.Div):
            return left + "/" + _pattern(ctx, expr.right, at, frame, deeper)
        if isinstance(expr.op, ast.Mod) and isinstance(constant_of(ctx, expr.left), str):
            items = expr.right.elts if isinstance(expr.right, ast.Tuple) else [expr.right]
            return _percent(left, [_pattern(ctx, e, at, frame, deeper) for e in items])
        return "*"
    if isinstance(expr, ast.Call):
        return _call_pattern(ctx, expr, at, frame, deeper)
    if isinstance(expr, ast.Subscript):
        listing = _listing(ctx, expr.value, at, frame, deeper)
        return listing if listing is not None else "*"
    if isinstance(expr, ast.Name):
        return _name_pattern(ctx, expr, at, frame, deeper)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        return _self_pattern(ctx, expr, frame, deeper)
    return "*"


def _call_pattern(ctx: Context, call: ast.Call, at: ast.AST, frame: Frame | None, depth: int) -> str:
    func = call.func
    q = ctx.qualname(func) or ""
    name = last_name(func)
    args = [a for a in call.args if not isinstance(a, ast.Starred)]
    if q in _JOINS or method_call(call, "joinpath") or (name in _PATHS and args and not call.keywords):
        parts = ([func.value] if method_call(call, "joinpath") else []) + args  # type: ignore[attr-defined]
        return "/".join(_pattern(ctx, p, at, frame, depth) for p in parts)
    if method_call(call, "format") and isinstance(constant_of(ctx, func.value), str):  # type: ignore[attr-defined]
        return _format(ctx, constant_of(ctx, func.value), call, at, frame, depth)  # type: ignore[arg-type, attr-defined]
    if name in _SAME_PATH and len(args) == 1 and not call.keywords:
        return _pattern(ctx, args[0], at, frame, depth)
    if method_call(call, *_SAME_PATH_METHODS) and not call.args:
        return _pattern(ctx, func.value, at, frame, depth)  # type: ignore[attr-defined]
    if name in ("max", "min") and isinstance(func, ast.Name) and len(args) == 1:  # max(glob(...), key=os.path.getmtime)
        listing = _listing(ctx, args[0], at, frame, depth)
        return listing if listing is not None else "*"
    return "*"


def _format(ctx: Context, template: str, call: ast.Call, at: ast.AST, frame: Frame | None, depth: int) -> str:
    """``"{}_{}.{}".format(a, b, c)`` with each field replaced by its argument's pattern."""
    out = []
    position = 0
    try:
        for literal, field, _, _ in string.Formatter().parse(template):
            out.append(literal)
            if field is None:
                continue
            root = re.split(r"[.\[]", field, maxsplit=1)[0]
            if root == "":
                value = call.args[position] if position < len(call.args) else None
                position += 1
            elif root.isdigit():
                value = call.args[int(root)] if int(root) < len(call.args) else None
            else:
                value = next((k.value for k in call.keywords if k.arg == root), None)
            out.append(_pattern(ctx, value, at, frame, depth) if root == field else "*")
    except (ValueError, IndexError):
        return "*"
    return "".join(out)


def _percent(template: str, values: list[str]) -> str:
    """``"%s_%03d.pth" % (a, b)`` with each conversion replaced by its value's pattern."""
    filled = iter(values)
    return _PERCENT.sub(lambda m: "%" if m.group() == "%%" else next(filled, "*"), template)


def _name_pattern(ctx: Context, name: ast.Name, at: ast.AST, frame: Frame | None, depth: int) -> str:
    """A parameter is read at the call (its default when the call does not pass it); a local name through its
    one assignment."""
    if frame is not None and frame.ctx is ctx and is_param(frame.fn, name.id) and ctx.scope(at) is frame.fn:
        passed = argument(frame.fn, name.id, frame.call, method=frame.method)
        if passed is not None:
            return _pattern(frame.caller, passed, frame.call, frame.outer, depth)
        default = argument(frame.fn, name.id, frame.call, method=frame.method, default=True)
        return _pattern(ctx, default, frame.fn, None, depth) if default is not None else "*"
    found = ctx.reaching(name, at)
    if len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked and found[0].value is not None:
        return _pattern(ctx, found[0].value, found[0].stmt, frame, depth)
    return "*"


def _self_pattern(ctx: Context, attribute: ast.Attribute, frame: Frame | None, depth: int) -> str:
    """``self.stem`` in a method: its one assignment in the class; set in ``__init__`` from a parameter, it is
    read at the constructor call that built the instance."""
    if frame is None or not frame.method:
        return "*"
    cls = ctx.enclosing_class(frame.fn)
    bindings = [b for b in ctx.attr_bindings.get(f"self.{attribute.attr}", [])
                if cls is not None and ctx.enclosing_class(b.stmt) is cls]
    if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].unpacked or bindings[0].value is None:
        return "*"
    binding = bindings[0]
    method = ctx.scope(binding.stmt)
    if method is frame.fn:
        return _pattern(ctx, binding.value, binding.stmt, frame, depth)
    if isinstance(method, _FUNCTIONS) and method.name == "__init__" and frame.built is not None:
        init = Frame(ctx, method, frame.caller, frame.built, True, None, frame.outer)
        return _pattern(ctx, binding.value, binding.stmt, init, depth)
    return _pattern(ctx, binding.value, binding.stmt, None, depth)


def _listing(ctx: Context, expr: ast.AST, at: ast.AST, frame: Frame | None, depth: int) -> str | None:
    """The pattern of the files a listing holds: ``glob.glob(p)``, ``folder.glob(p)``, ``sorted(...)`` or
    ``list(...)`` of one, or a name bound to one (``paths[-1]`` is one of them); None for anything else."""
    if depth > _DEPTH:
        return None
    if isinstance(expr, ast.Name):
        found = ctx.reaching(expr, at)
        if len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked and found[0].value is not None:
            return _listing(ctx, found[0].value, found[0].stmt, frame, depth + 1)
        return None
    if not isinstance(expr, ast.Call) or not expr.args:
        return None
    func = expr.func
    if ctx.qualname(func) in _GLOBS:
        return _pattern(ctx, expr.args[0], at, frame, depth + 1)
    if method_call(expr, "glob", "rglob") and len(expr.args) == 1:
        folder = _pattern(ctx, func.value, at, frame, depth + 1)  # type: ignore[attr-defined]
        inner = "/*/" if func.attr == "rglob" else "/"  # type: ignore[attr-defined]
        return folder + inner + _pattern(ctx, expr.args[0], at, frame, depth + 1)
    if isinstance(func, ast.Name) and func.id in _LISTINGS:
        return _listing(ctx, expr.args[0], at, frame, depth + 1)
    return None
