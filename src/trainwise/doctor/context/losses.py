"""Whether a loss value is a mean over the samples of a batch or a sum over them (TW106).

Gradient accumulation over k micro-batches is right without rescaling when each micro-batch loss is a *sum* over
its samples (k sums make the full batch's sum), and k times too large when it is a *mean*. ``losses(ctx)`` answers
which one a value is, following it into the functions that compute it, in the file or in another file of the run:

- ``Losses.reduction(expr, at, scope)``: ``MEAN`` for ``F.cross_entropy(...)``, an ``nn.*Loss()`` object's call,
  ``x.mean()``, a Hugging Face ``model(...).loss``, and sums and constant multiples of these (``lbox * 0.05 +
  lcls``, terms added up over a model's heads); ``SUM`` for ``reduction="sum"`` losses and ``x.sum()``;
  ``None`` when unsure (divided by anything but a constant, a parameter, an unknown function, a loop that may go
  over the batch's samples);
- ``Losses.call(call, index)``: what a call returns (its ``index``-th element for a tuple): a loss function of the
  file or of another file of the run (every ``return`` agrees), or a loss object (an ``nn.*Loss`` or an instance
  of a class of the run, whose ``forward`` is followed).

A constant factor equal to ``1/k`` (or a division by ``k``) is the accumulation's own rescaling: with ``k`` given,
such a value is ``None``.
"""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context import (
    Context,
    dotted,
    is_const,
    is_param,
    keyword,
    last_name,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.functions import functions

MEAN = "mean"
SUM = "sum"
_ZERO = "zero"  # ``0``, ``torch.zeros(1)``: where an accumulation starts; agrees with either
_DEPTH = 10
_ZERO_OF = frozenset({"tensor", "as_tensor", "float", "int"})  # torch.tensor(0.0): a zero when given one
# Loop names that say a loop goes over the batch's samples (a sum over them), not over a model's heads.
_PER_SAMPLE_WORDS = frozenset({
    "image", "images", "img", "imgs", "im", "ims", "instance", "instances", "target", "targets", "label", "labels",
    "gt", "gts", "anno", "annos", "annotation", "annotations", "box", "boxes", "sample", "samples", "example",
    "examples", "batch", "batches", "bs", "seq", "seqs", "sequence", "sequences", "sentence", "sentences", "token",
    "tokens", "word", "words", "item", "items", "data", "datum", "record", "records", "person", "query", "queries",
})
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


class Losses:
    """Reductions of loss values in one file (see the module docstring); ``losses(ctx)`` makes it once."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._returns: dict[tuple[int, int | None, float | None], str | None] = {}

    # ------------------------------------------------------------------------------------------------- API
    def call(self, call: ast.Call, index: int | None = None, k: float | None = None, depth: int = 0) -> str | None:
        """What ``call`` returns (the ``index``-th element of a returned tuple): ``MEAN``, ``SUM`` or None."""
        if depth > _DEPTH:
            return None
        if index is None:
            direct = self._library_loss(call)
            if direct is not ...:
                return direct
        objects = self._loss_objects(call.func, call)
        if objects is not None:
            return _agree(self._object_returns(obj, index, k, depth) for obj in objects) if objects else None
        called = self._functions(call)
        return _agree(returns(other, fn, index, k) for other, fn in called) if called else None

    def returned(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, index: int | None = None,
                 k: float | None = None) -> str | None:
        """What every ``return`` of ``fn`` gives (its ``index``-th element); a generator or a bare ``return``
        gives nothing known. A ``return 0`` (no targets in the batch) agrees with any reduction."""
        key = (id(fn), index, k)
        if key in self._returns:
            return self._returns[key]
        self._returns[key] = None  # a recursion ends as unknown
        found: list[str | None] = []
        body = list(walk_own(fn.body))
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in body):
            return None
        for node in body:
            if not isinstance(node, ast.Return):
                continue
            value = node.value
            if value is not None and index is not None:
                if not isinstance(value, ast.Tuple) or index >= len(value.elts) or any(
                        isinstance(e, ast.Starred) for e in value.elts):
                    found.append(None)
                    break
                value = value.elts[index]
            found.append(self.reduction(value, node, fn, k) if value is not None else None)
        result = _agree(found) if found else None
        self._returns[key] = result if result != _ZERO else None
        return self._returns[key]

    def reduction(self, expr: ast.AST, at: ast.AST, scope: ast.AST, k: float | None = None,
                  depth: int = 0) -> str | None:
        """``MEAN``, ``SUM`` or None for a value computed in ``scope`` (a function) and read at ``at``."""
        if depth > _DEPTH:
            return None
        if _zero(expr):
            return _ZERO
        if isinstance(expr, ast.Name):
            return self._name(expr, at, scope, k, depth)
        if isinstance(expr, ast.BinOp):
            if isinstance(expr.op, (ast.Add, ast.Sub)):  # a constant offset (1 - cos.mean()) moves no gradient
                return _agree(_ZERO if self._number(side) is not None else self.reduction(side, at, scope, k, depth + 1)
                              for side in (expr.left, expr.right))
            if isinstance(expr.op, ast.Mult):
                for factor, other in ((expr.left, expr.right), (expr.right, expr.left)):
                    number = self._number(factor)
                    if number is not None:
                        return None if _undoes(number, k) else self.reduction(other, at, scope, k, depth + 1)
                return None
            if isinstance(expr.op, ast.Div):
                number = self._number(expr.right)
                if number is None or (k is not None and number == k):
                    return None
                return self.reduction(expr.left, at, scope, k, depth + 1)
            return None
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
            return self.reduction(expr.operand, at, scope, k, depth + 1)
        if isinstance(expr, ast.Call):
            return self.call(expr, None, k, depth + 1)
        if is_output_loss(expr):
            return MEAN if self.model_output(expr.value, at) else None  # type: ignore[attr-defined]
        return None

    # ---------------------------------------------------------------------------------------------- names
    def _name(self, name: ast.Name, at: ast.AST, scope: ast.AST, k: float | None, depth: int) -> str | None:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_param(scope, name.id):
            return None
        if any(method_call(n, "div_", "mul_") and _same_name(n.func.value, name)  # type: ignore[attr-defined]
               for n in ast.walk(scope)):
            return None  # loss.div_(n): rescaled in place
        accumulated = self._accumulated(name, at, scope, k, depth)
        if accumulated is not ...:
            return accumulated
        found = self.ctx.reaching(name, at)
        if len(found) != 1:
            return None
        b = found[0]
        if b.kind != "assign" or b.value is None or not self.ctx.is_inside(b.stmt, scope):
            return None
        if not b.unpacked:
            return self.reduction(b.value, b.stmt, scope, k, depth + 1)
        if b.index is None:
            return None
        if isinstance(b.value, ast.Tuple) and b.index < len(b.value.elts):
            return self.reduction(b.value.elts[b.index], b.stmt, scope, k, depth + 1)
        if isinstance(b.value, ast.Call):
            return self.call(b.value, b.index, k, depth + 1)
        return None

    def _accumulated(self, name: ast.Name, at: ast.AST, scope: ast.AST, k: float | None,
                     depth: int) -> str | object | None:
        """A name that adds terms up: started (``0``, ``torch.zeros(1)``, a first term), then ``+=`` terms,
        ``*=`` constant weights; the kind all its terms agree on. ``...`` when the name is not one."""
        bindings = [b for b in self.ctx.lookup(name.id, at)
                    if b.kind != "del" and self.ctx.is_inside(b.stmt, scope) and position(b.stmt) < position(at)]
        if not any(b.kind == "augassign" for b in bindings):
            return ...
        kinds: list[str | None] = []
        for b in bindings:
            stmt = b.stmt
            if b.kind == "augassign" and isinstance(stmt, ast.AugAssign):
                if isinstance(stmt.op, (ast.Mult, ast.Div)):
                    number = self._number(stmt.value)
                    if number is None or _undoes(number if isinstance(stmt.op, ast.Mult) else 1 / number, k):
                        return None
                    continue
                if not isinstance(stmt.op, (ast.Add, ast.Sub)):
                    return None
                if not self._loops_over_parts(stmt, at, scope):
                    return None
                kinds.append(self.reduction(stmt.value, stmt, scope, k, depth + 1))
            elif b.kind == "assign" and b.value is not None:
                value = b.value
                if b.unpacked:
                    if not (isinstance(value, ast.Tuple) and b.index is not None and b.index < len(value.elts)):
                        return None
                    value = value.elts[b.index]
                if _zero(value):
                    continue
                if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and (
                        _same_name(value.left, name) or _same_name(value.right, name)):
                    if not self._loops_over_parts(stmt, at, scope):
                        return None
                    term = value.right if _same_name(value.left, name) else value.left
                    kinds.append(self.reduction(term, stmt, scope, k, depth + 1))
                    continue
                kinds.append(self.reduction(value, stmt, scope, k, depth + 1))
            else:
                return None
        return _agree(kinds) if kinds else None

    def _loops_over_parts(self, stmt: ast.AST, at: ast.AST, scope: ast.AST) -> bool:
        """Whether every loop around ``stmt`` (in ``scope``, and not around ``at`` too) goes over a model's
        parts, so that the terms added up in it are the heads', not the samples': ``for i, p in
        enumerate(predictions)``, ``for name, term in terms.items()``, ``range(3)``, a literal tuple. A loop
        over ``range(n)`` (``n`` may be the batch size), ``zip(...)`` (outputs paired with their targets), a
        ``while``, or one whose names speak of images, targets or samples does not count."""
        for parent in self.ctx.ancestors(stmt):
            if parent is scope:
                return True
            if not isinstance(parent, (ast.For, ast.AsyncFor, ast.While)) or self.ctx.is_inside(at, parent):
                continue
            if not self._over_parts(parent):
                return False
        return True

    def _over_parts(self, loop: ast.AST) -> bool:
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or self.ctx.iterates_over_data(loop):
            return False
        words = {w.lower() for part in (loop.iter, loop.target) for n in ast.walk(part) if isinstance(n, ast.Name)
                 for w in _WORD.findall(n.id)}
        if words & _PER_SAMPLE_WORDS:
            return False
        source = loop.iter
        if isinstance(source, ast.Call) and last_name(source.func) == "enumerate" and source.args:
            source = source.args[0]
        if isinstance(source, (ast.Tuple, ast.List)):
            return True
        if isinstance(source, ast.Call):
            if isinstance(source.func, ast.Name) and source.func.id == "range":
                return all(isinstance(self.ctx.constant(a), int) for a in source.args)
            return method_call(source, "items", "values", "keys") and not source.args and dotted(
                source.func.value) is not None  # type: ignore[attr-defined]
        return dotted(source) is not None

    # ---------------------------------------------------------------------------------------------- calls
    def _library_loss(self, call: ast.Call) -> str | object | None:
        """``F.cross_entropy(...)``, ``nn.MSELoss()(...)``, ``x.mean()``, ``torch.sum(x)``: the reduction;
        ``...`` when the call is none of these."""
        func = call.func
        if method_call(call, "mean", "sum") and not call.args and not call.keywords:
            reduced = func.value  # type: ignore[attr-defined]
            return None if self._divided(reduced) else MEAN if func.attr == "mean" else SUM  # type: ignore[attr-defined]
        q = self.ctx.qualname(func) or ""
        if q in ("torch.mean", "torch.sum") and len(call.args) == 1 and not call.keywords:
            return None if self._divided(call.args[0]) else MEAN if q == "torch.mean" else SUM
        if q.startswith("torch.nn.functional.") and self.ctx.is_loss_call(call):
            return _reduction_of(call)
        if isinstance(func, ast.Call):
            inner = self.ctx.qualname(func.func) or ""
            if inner.startswith("torch.nn.") and inner.endswith("Loss"):
                return _reduction_of(func)
        return ...

    def _loss_objects(self, func: ast.AST, at: ast.AST) -> list[ast.Call] | None:
        """The constructor calls a called object was built by (``criterion = nn.MSELoss()``, ``self.loss =
        YoloLoss(...)``), or None when ``func`` is a function, a parameter, or built another way."""
        if not isinstance(func, (ast.Name, ast.Attribute)) or dotted(func) is None:
            return None
        bindings = [b for b in self.ctx.bindings_of(func, at) if b.kind != "del"]
        if not bindings or any(b.kind in ("def", "import") for b in bindings):
            return None
        if isinstance(func, ast.Attribute) and dotted(func.value) != "self":
            return None
        built = []
        for b in bindings:
            if b.kind != "assign" or b.unpacked or not isinstance(b.value, ast.Call):
                return []
            built.append(b.value)
        return built

    def _object_returns(self, built: ast.Call, index: int | None, k: float | None, depth: int) -> str | None:
        """What calling an object built by ``built`` returns: an ``nn.*Loss`` by its ``reduction``, an instance
        of a class of the file or of another file of the run by its ``forward`` (or ``__call__``)."""
        q = self.ctx.qualname(built.func) or ""
        if q.startswith("torch.nn.") and q.endswith("Loss"):
            return _reduction_of(built) if index is None else None
        found = self._class(built.func)
        if found is None:
            return None
        other, cls = found
        methods = {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        method = methods.get("forward") or methods.get("__call__")
        return returns(other, method, index, k) if method is not None else None

    def _class(self, func: ast.AST) -> tuple[Context, ast.ClassDef] | None:
        if isinstance(func, ast.Name) and self.ctx.qualname(func) is None:
            classes = [c for c in self.ctx.nodes(ast.ClassDef) if c.name == func.id]  # type: ignore[attr-defined]
            return (self.ctx, classes[0]) if len(classes) == 1 else None  # type: ignore[return-value]
        program = self.ctx.program
        return program.class_of(self.ctx, func) if program is not None else None

    def _functions(self, call: ast.Call) -> list[tuple[Context, ast.FunctionDef | ast.AsyncFunctionDef]]:
        """The functions a call calls: same-file functions by name (not for a library's name), else the
        function of another file of the run it imports."""
        found: list[tuple[Context, ast.FunctionDef | ast.AsyncFunctionDef]] = []
        if self.ctx.qualname(call.func) is None:
            found = [(self.ctx, fn) for fn in functions(self.ctx).targets(call)]
        if not found and self.ctx.program is not None:
            other = self.ctx.program.callee(self.ctx, call)
            if other is not None:
                found.append(other)
        return found

    # ---------------------------------------------------------------------------------------------- values
    def _divided(self, expr: ast.AST, at: ast.AST | None = None, depth: int = 0) -> bool:
        """Whether an expression divides by anything but a number (``(losses / k).mean()``), itself or through
        the names it reads (``scaled = losses / k``): it may be rescaled already."""
        for node in ast.walk(expr):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)) and self._number(
                    node.right) is None:
                return True
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and depth < 4:
                here = at if at is not None else node
                if any(b.kind == "augassign" and isinstance(b.stmt, ast.AugAssign) and isinstance(
                        b.stmt.op, (ast.Div, ast.FloorDiv)) and position(b.stmt) < position(here)
                       for b in self.ctx.lookup(node.id, here)):
                    return True  # x /= k
                for b in self.ctx.reaching(node, here):
                    if b.kind == "assign" and b.value is not None and self._divided(b.value, b.stmt, depth + 1):
                        return True
        return False

    def _number(self, expr: ast.AST) -> float | None:
        value = self.ctx.constant(expr)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)

    def model_output(self, expr: ast.AST, at: ast.AST) -> bool:
        """``model(...)``, or a name bound once to it: a Hugging Face output whose ``.loss`` is a mean."""
        if isinstance(expr, ast.Call):
            return self.ctx.is_model_call(expr)
        if isinstance(expr, ast.Name):
            found = self.ctx.reaching(expr, at)
            return (len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked
                    and isinstance(found[0].value, ast.Call) and self.ctx.is_model_call(found[0].value))
        return False


def is_output_loss(expr: ast.AST) -> bool:
    """``outputs.loss`` or ``outputs["loss"]``: the loss a model returns (a Hugging Face output, a dict)."""
    return (isinstance(expr, ast.Attribute) and expr.attr == "loss") or (
        isinstance(expr, ast.Subscript) and is_const(expr.slice, "loss"))


def losses(ctx: Context) -> Losses:
    """The (cached) loss reductions of one file."""
    return ctx.analysis(Losses)


def returns(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, index: int | None = None,
            k: float | None = None) -> str | None:
    """What every ``return`` of ``fn`` (of the file ``ctx``) gives: ``MEAN``, ``SUM`` or None."""
    return losses(ctx).returned(fn, index, k)


def _agree(kinds) -> str | None:  # type: ignore[no-untyped-def]
    """The one kind every value has (``_ZERO`` agrees with any), else None."""
    found: set[str] = set()
    for kind in kinds:
        if kind is None:
            return None
        if kind != _ZERO:
            found.add(kind)
    if len(found) > 1:
        return None
    return found.pop() if found else _ZERO


def _reduction_of(call: ast.Call) -> str | None:
    """The ``reduction=`` of a loss call or constructor: ``MEAN`` by default; None for ``**kwargs`` and the
    old ``size_average``/``reduce`` flags."""
    if any(kw.arg is None or kw.arg in ("size_average", "reduce") for kw in call.keywords):
        return None
    kw = keyword(call, "reduction")
    if kw is None:
        return MEAN
    if isinstance(kw.value, ast.Constant):
        return {"mean": MEAN, "sum": SUM}.get(kw.value.value)  # type: ignore[arg-type]
    return None


def _undoes(factor: float, k: float | None) -> bool:
    """A constant factor of ``1/k``: the accumulation's own rescaling."""
    return k is not None and abs(factor * k - 1.0) < 1e-9


def _zero(expr: ast.AST) -> bool:
    """``0``, ``0.0``, ``torch.zeros(1)``, ``torch.tensor(0.0, device=d)``, ``x.new_zeros(1)``."""
    if isinstance(expr, ast.Constant):
        return type(expr.value) in (int, float) and expr.value == 0
    if isinstance(expr, ast.Call):
        name = last_name(expr.func)
        if name in ("zeros", "zeros_like", "new_zeros"):
            return True
        return name in _ZERO_OF and len(expr.args) == 1 and _zero(expr.args[0])
    return False


def _same_name(expr: ast.AST, name: ast.Name) -> bool:
    return isinstance(expr, ast.Name) and expr.id == name.id
