"""What floating dtype a module or tensor holds: float16, as far as the code shows, or not known (TW109).

float16 comes from a cast (``.half()``, ``.to(torch.float16)``, ``.to(dtype=torch.half)``, ``.type(...)``,
also as a statement, ``net.half()``, before the place asked about), from loading in it
(``from_pretrained(..., torch_dtype=torch.float16)``), from OpenAI CLIP's ``clip.load(name)`` (its weights are
float16 on CUDA, the default device wherever a GPU is there; float32 with ``device="cpu"``), from a function
of the run whose every ``return`` gives a float16 value (a builder ending in ``.half()``), or from copying the
dtype of such a value (``nn.Linear(...).to(clip_model.dtype)``, ``.to(other_tensor)``). A name holds float16
when every assignment that reaches it does and nothing casts it back in its scope; a parameter when every call
of its function (in its file, or another file of the run) passes a float16 value. Anything else is "not known",
never "float32": the question leans towards silence. One ``Dtypes`` per file (``ctx.analysis(Dtypes)``).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainwise.doctor.context.syntax import argument, is_bound_method, is_const, keyword, position, walk_own

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

FP16 = frozenset({"torch.float16", "torch.half", "torch.HalfTensor", "torch.cuda.HalfTensor"})
OUT_OF_FP16 = frozenset({"torch.float32", "torch.float", "torch.float64", "torch.double", "torch.bfloat16",
                         "torch.FloatTensor", "torch.cuda.FloatTensor"})
# OpenAI CLIP's loader (``import clip`` or ``from clip import clip``): a (model, preprocess) pair.
_CLIP_LOAD = frozenset({"clip.load", "clip.clip.load"})
_KEEPS_DTYPE = frozenset({"cuda", "cpu", "eval", "train", "requires_grad_", "detach", "contiguous", "clone", "t"})
_TO_FLOAT = frozenset({"float", "double", "bfloat16"})
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEPTH = 8  # names, calls and parameters followed, at most


class Dtypes:
    """Which values of a file are float16 (see the module docstring); answers cached per parameter."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._params: dict[tuple[int, str], bool] = {}
        self._methods: dict[int, dict[str, list[ast.Call]]] = {}  # scope -> name -> its method calls
        # a file that never names float16 (half, clip) returns none: its builders are not walked
        self.names_float16 = any(word in ctx.source for word in ("half", "float16", "clip"))

    def float16(self, expr: ast.AST, at: ast.AST, depth: int = 0, callers: bool = True) -> bool:
        """Whether ``expr`` (a module, a tensor, or a dtype) holds float16 at ``at``; ``callers``: a parameter
        is followed to the calls of its function (not inside a builder's ``return``: a builder builds)."""
        if depth > _DEPTH:
            return False
        ctx = self.ctx
        if ctx.qualname(expr) in FP16 or is_const(expr, "float16") or is_const(expr, "half"):
            return True
        if isinstance(expr, ast.Attribute) and expr.attr == "dtype":
            return self.float16(expr.value, at, depth + 1, callers)
        if isinstance(expr, ast.Name):
            return self._name(expr, at, depth, callers)
        if isinstance(expr, ast.Subscript) and is_const(expr.slice, 0) and isinstance(expr.value, ast.Call):
            return self._element(expr.value, 0, depth)  # clip.load(name)[0]
        if isinstance(expr, ast.Call):
            return self._call(expr, at, depth, callers)
        return False

    def _call(self, call: ast.Call, at: ast.AST, depth: int, callers: bool) -> bool:
        func = call.func
        if isinstance(func, ast.Attribute):
            if func.attr == "half":
                return not call.args and not call.keywords
            if func.attr in _TO_FLOAT:
                return False
            if func.attr in ("to", "type"):
                given = [*call.args, *(k.value for k in call.keywords if k.arg in ("dtype", "other", None))]
                if any(self.ctx.qualname(a) in OUT_OF_FP16 for a in given):
                    return False
                return any(self.float16(a, at, depth + 1, callers) for a in given) or self.float16(func.value, at,
                                                                                           depth + 1, callers)
            if func.attr in _KEEPS_DTYPE:
                return self.float16(func.value, at, depth + 1, callers)
            if func.attr == "from_pretrained":
                dtype = keyword(call, "torch_dtype") or keyword(call, "dtype")
                return dtype is not None and self.float16(dtype.value, call, depth + 1)
        return self._returned(call, None, depth)

    def _name(self, name: ast.Name, at: ast.AST, depth: int, callers: bool) -> bool:
        """Every binding that reaches ``at`` gives float16 (or a ``name.half()`` statement comes between), and
        nothing in the scope casts the name to another dtype."""
        ctx = self.ctx
        bindings = ctx.reaching(name, at)
        if not bindings or self._cast_back(name.id, at):
            return False
        if self._cast_in_place(name.id, at):
            return True
        for b in bindings:
            if b.kind == "param" and isinstance(b.stmt, _FUNCS):
                if not callers or not self.parameter(b.stmt, name.id, depth + 1):
                    return False
            elif b.kind == "assign" and b.value is not None:
                if b.unpacked:
                    if b.index is None or not isinstance(b.value, ast.Call) or not self._element(b.value, b.index,
                                                                                                   depth + 1):
                        return False
                elif not (isinstance(b.value, ast.Name) and b.value.id == name.id) and not self.float16(
                        b.value, b.stmt, depth + 1, callers):
                    return False
            else:
                return False
        return True

    def _scope_calls(self, name: str, at: ast.AST) -> list[ast.Call]:
        """The method calls on ``name`` (``name.half()``, ``name.float()``) in the scope of ``at``: indexed once
        per scope."""
        scope = self.ctx.scope(at)
        table = self._methods.get(id(scope))
        if table is None:
            body = getattr(scope, "body", [])
            table = self._methods[id(scope)] = {}
            for n in walk_own(body if isinstance(body, list) else [body]):  # a lambda's body is an expression
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
                    table.setdefault(n.func.value.id, []).append(n)
        return table.get(name, [])

    def _cast_back(self, name: str, at: ast.AST) -> bool:
        """``name.float()`` or ``name.to(torch.float32)`` anywhere in the scope of ``at`` (before or after:
        which runs first is not always clear)."""
        for call in self._scope_calls(name, at):
            attr = call.func.attr  # type: ignore[attr-defined]
            if attr in _TO_FLOAT or (attr in ("to", "type") and any(
                    self.ctx.qualname(a) in OUT_OF_FP16 for a in (*call.args, *(k.value for k in call.keywords)))):
                return True
        return False

    def _cast_in_place(self, name: str, at: ast.AST) -> bool:
        """``name.half()`` (or ``name.to(torch.float16)``) as a statement of the scope, before ``at``."""
        for call in self._scope_calls(name, at):
            if position(call) >= position(at) or not isinstance(self.ctx.parent(call), ast.Expr):
                continue
            attr = call.func.attr  # type: ignore[attr-defined]
            if (attr == "half" and not call.args) or (attr in ("to", "type") and any(
                    self.ctx.qualname(a) in FP16 for a in (*call.args, *(k.value for k in call.keywords)))):
                return True
        return False

    def parameter(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, depth: int = 0) -> bool:
        """Whether every call of ``fn`` (by its name in this file, or from another file of the run) passes a
        float16 value for its parameter ``name``; no call known is no."""
        key = (id(fn), name)
        known = self._params.get(key)
        if known is not None:
            return known
        self._params[key] = False  # a cycle (a function passing its parameter to itself) proves nothing
        ctx = self.ctx
        method = is_bound_method(fn, ctx.parent(fn))
        sites: list[tuple[Context, ast.Call]] = [(ctx, c) for c in ctx.calls_of(fn)]
        if ctx.program is not None and not method:
            sites += ctx.program.callers(ctx, fn)
        found = bool(sites)
        for other, site in sites:
            passed = argument(fn, name, site, method=method)
            if passed is None or not other.analysis(Dtypes).float16(passed, site, depth + 1):
                found = False
                break
        self._params[key] = found
        return found

    def _element(self, call: ast.Call, index: int, depth: int) -> bool:
        """The ``index``-th value of what ``call`` returns is float16: CLIP's model (``clip.load``), or the
        element of every tuple a function of the run returns."""
        if self.ctx.qualname(call.func) in _CLIP_LOAD:
            return index == 0 and _clip_on_cuda(call)
        return self._returned(call, index, depth)

    def _returned(self, call: ast.Call, index: int | None, depth: int) -> bool:
        """Every ``return`` of the function ``call`` calls (of this file or another of the run) gives float16
        (its ``index``-th element, when ``index`` is given)."""
        from trainwise.doctor.context.functions import callees  # functions.py imports the context package

        if self.ctx.qualname(call.func) in _CLIP_LOAD:
            return False  # the (model, preprocess) pair itself
        targets = callees(self.ctx, call)
        if len(targets) != 1:
            return False
        other, fn = targets[0]
        if not other.analysis(Dtypes).names_float16:
            return False
        returns = [n for n in walk_own(fn.body) if isinstance(n, ast.Return)]
        if not returns:
            return False
        for ret in returns:
            value = ret.value
            if index is not None:
                if not isinstance(value, ast.Tuple) or index >= len(value.elts):
                    return False
                value = value.elts[index]
            if value is None or not other.analysis(Dtypes).float16(value, ret, depth + 1, callers=False):
                return False
        return True


def _clip_on_cuda(call: ast.Call) -> bool:
    """``clip.load(name)`` with its default device, or a device named ``"cuda..."``: float16 weights there
    (``jit=True`` included). A device of another value, or not a constant, is not known."""
    device = keyword(call, "device")
    value = device.value if device is not None else (call.args[1] if len(call.args) > 1 else None)
    if value is None:
        return True
    return isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.startswith("cuda")


def built_float16(ctx: Context, call: ast.Call) -> bool:
    """Whether ``call`` calls a function of the run whose every ``return`` gives float16 (a builder)."""
    return ctx.analysis(Dtypes)._returned(call, None, 0)


def is_float16(ctx: Context, expr: ast.AST, at: ast.AST) -> bool:
    """Whether ``expr`` holds float16 at ``at`` (see the module docstring)."""
    return ctx.analysis(Dtypes).float16(expr, at)
