"""What a number counts: batches, samples or tokens, through simple assignments, aliases and counters.

A training script counts things in a few ways: ``n_batches = len(val_dl)``, ``total += 1`` once per batch of a
loader, ``total += labels.size(0)``, ``for i, batch in enumerate(loader)`` then ``i + 1``, ``ntokens +=
mask.sum()``. ``counting(ctx).kind(expr, at)`` says which of ``"batches"``, ``"samples"`` and ``"tokens"`` an
expression counts; ``batches(expr, at)`` says how it counts batches (of which loader, through which variable);
``count(expr, at)`` says the same of a count off by a constant (``len(loader) + 1``, a counter started at 1, the
``enumerate`` index read after its loop: one batch short); ``summed_over(expr, at)`` says which loop over a loader
a total adds one term to each time round.

Like the rest of the doctor it leans towards "unknown" when unsure: a counter incremented under an ``if``, in
a nested loop, or bound once to something else counts nothing known.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from trainwise.doctor.context import Context, LoaderInfo, dotted, is_const, last_name, method_call

BATCHES = "batches"
SAMPLES = "samples"
TOKENS = "tokens"

_DEPTH = 4  # aliases followed: n = steps = len(loader)
# Calls around a loader in a ``for`` header: ``enumerate(tqdm(loader))``, ``zip(loader, ...)``.
_LOOP_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "progress_bar", "track", "zip", "progressbar"})
_CASTS = frozenset({"float", "int"})
_CAST_METHODS = frozenset({"item", "float", "double", "long", "int"})
_CEIL = frozenset({"ceil"})  # math.ceil, np.ceil, numpy.ceil


@dataclass(frozen=True)
class BatchCount:
    """How an expression counts batches.

    ``how`` is ``"len"`` (``len(loader)``, written where it is used), ``"alias"`` (a variable or attribute
    holding ``len(loader)``), ``"counter"`` (a variable incremented by one once per batch of ``loop``),
    ``"index"`` (``i + 1`` for ``i`` the index of ``enumerate(loader)``) or ``"computed"`` (``len(data) //
    batch_size``, ``math.ceil(len(data) / batch_size)``). ``loader`` is the loader's expression when known.
    ``offset`` is what the expression adds to the number of batches: 1 for ``len(loader) + 1`` or a counter
    started at 1, -1 for the index of ``enumerate(loader)`` (it ends one short).
    """

    how: str
    loader: ast.AST | None
    info: LoaderInfo | None
    name: str | None = None  # the variable that holds the count, for "alias", "counter" and "index"
    loop: ast.AST | None = None  # the loop over the loader, for "counter" and "index"
    offset: int = 0


class Counting:
    """Answers "what does this count?" for one file; one instance per ``Context`` (see ``counting``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._memo: dict[tuple[int, int], BatchCount | None] = {}

    # ------------------------------------------------------------------------------------------------- API
    def kind(self, expr: ast.AST, at: ast.AST | None = None) -> str | None:
        """``"batches"``, ``"samples"`` or ``"tokens"``: what ``expr`` counts, else None."""
        at = expr if at is None else at
        if self.batches(expr, at) is not None:
            return BATCHES
        return self._kind(expr, at, 0)

    def batches(self, expr: ast.AST, at: ast.AST | None = None) -> BatchCount | None:
        """How ``expr`` counts the batches of a loader (whose batches hold more than one sample), else None."""
        found = self.count(expr, at)
        return found if found is not None and found.offset == 0 else None

    def count(self, expr: ast.AST, at: ast.AST | None = None) -> BatchCount | None:
        """Like ``batches``, also for a count off by a constant number of batches (its ``offset``)."""
        at = expr if at is None else at
        key = (id(expr), id(at))
        if key not in self._memo:
            self._memo[key] = None  # a cycle (n = n + 1 read through itself) ends as "unknown"
            self._memo[key] = self._batches(expr, at, 0)
        return self._memo[key]

    @staticmethod
    def same_loader(a: ast.AST | None, b: ast.AST) -> bool:
        """The same loader expression, or the same dotted name."""
        return a is not None and (a is b or (dotted(a) is not None and dotted(a) == dotted(b)))

    def different_loaders(self, a: ast.AST, b: ast.AST) -> bool:
        """Two loaders known apart: different names, each a parameter or built by a call, neither another name
        for the other (``loader = val_loader``)."""
        names = (dotted(a), dotted(b))
        if None in names or names[0] == names[1]:
            return False
        return all(binding.kind == "param" or (binding.kind == "assign" and isinstance(binding.value, ast.Call))
                   for expr in (a, b) for binding in self.ctx.bindings_of(expr))

    def counters_of(self, loop: ast.AST, at: ast.AST) -> list[str]:
        """The names, read at ``at``, that count the batches of ``loop`` exactly (``n_val += 1`` once a batch)."""
        found = []
        for stmt in getattr(loop, "body", []):
            if isinstance(stmt, ast.AugAssign) and dotted(stmt.target) is not None and is_const(stmt.value, 1):
                count = self.batches(stmt.target, at)
                if count is not None and count.loop is loop:
                    found.append(dotted(stmt.target))
        return found  # type: ignore[return-value]

    def summed_over(self, expr: ast.AST, at: ast.AST) -> ast.For | ast.AsyncFor | None:
        """The loop over a loader that a total (``val_loss``, ``self.dice``) adds exactly one term to each time
        round: every binding of it is a zero or a ``+=`` run once per iteration of that loop (not under an
        ``if``, in a loop without ``continue`` or ``break``); else None."""
        if not isinstance(expr, (ast.Name, ast.Attribute)) or dotted(expr) is None:
            return None
        bindings = [b for b in self.ctx.bindings_of(expr, at) if b.kind != "del"]
        loops = []
        for b in bindings:
            if is_zero_binding(b):
                continue
            if not _adds_to(b, dotted(expr)):
                return None
            loop = self.ctx.enclosing_loop(b.stmt)
            if loop is None or not self._once_per_iteration(b.stmt, loop):
                return None
            loops.append(loop)
        if not loops or any(loop is not loops[0] for loop in loops) or _leaves_early(loops[0]):
            return None
        found = self.loop_loader(loops[0])
        return loops[0] if found is not None else None  # type: ignore[return-value]

    def loop_loader(self, loop: ast.AST) -> tuple[ast.AST, LoaderInfo] | None:
        """The loader a ``for`` loop iterates over, through ``enumerate``/``tqdm``/``zip`` (first argument)."""
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            return None
        source = _unwrap(loop.iter)
        if source is None:
            return None
        info = self.ctx.loader(source)
        if info is None:
            return None
        return source, info

    # ------------------------------------------------------------------------------------------- batches
    def _batches(self, expr: ast.AST, at: ast.AST, depth: int) -> BatchCount | None:
        if depth > _DEPTH:
            return None
        expr = _strip_casts(expr)
        if isinstance(expr, ast.Call):
            return self._batches_call(expr, at, depth)
        if isinstance(expr, ast.BinOp):
            return self._batches_binop(expr, at, depth)
        if isinstance(expr, (ast.Name, ast.Attribute)) and dotted(expr) is not None:
            return self._batches_variable(expr, at, depth)
        return None

    def _batches_call(self, call: ast.Call, at: ast.AST, depth: int) -> BatchCount | None:
        func = call.func
        if call.keywords:
            return None
        if isinstance(func, ast.Name) and func.id == "len" and len(call.args) == 1:
            info = self.ctx.loader(call.args[0])
            if info is None or info.one_sample_per_batch:
                return None
            return BatchCount("len", call.args[0], info)
        if isinstance(func, ast.Name) and func.id == "max" and len(call.args) == 2:  # max(len(loader), 1)
            for one, other in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
                if is_const(one, 1):
                    found = self._batches(other, at, depth + 1)
                    if found is not None and found.how == "len":
                        return BatchCount("alias", found.loader, found.info)
            return None
        if last_name(func) in _CEIL and len(call.args) == 1:  # math.ceil(len(data) / batch_size)
            arg = call.args[0]
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Div) and self._data_over_batch_size(arg):
                return BatchCount("computed", None, None)
        return None

    def _batches_binop(self, expr: ast.BinOp, at: ast.AST, depth: int) -> BatchCount | None:
        if isinstance(expr.op, ast.FloorDiv) and self._data_over_batch_size(expr):
            return BatchCount("computed", None, None)  # len(data) // batch_size, (len(data) + bs - 1) // bs
        if isinstance(expr.op, (ast.Add, ast.Sub)):  # i + 1, len(loader) + 1, steps - 1
            pairs = [(expr.left, expr.right)] + ([(expr.right, expr.left)] if isinstance(expr.op, ast.Add) else [])
            for count, constant in pairs:
                value = constant.value if isinstance(constant, ast.Constant) else None
                if type(value) is not int:
                    continue
                found = self._batches(count, at, depth + 1)
                if found is not None:
                    step = value if isinstance(expr.op, ast.Add) else -value
                    return replace(found, offset=found.offset + step)
        return None

    def _batches_variable(self, expr: ast.AST, at: ast.AST, depth: int) -> BatchCount | None:
        name = dotted(expr)
        bindings = [b for b in self.ctx.bindings_of(expr, at) if b.kind != "del"]
        if not bindings:
            return None
        if isinstance(expr, ast.Name) and len(bindings) == 1 and bindings[0].kind == "for":
            found = self._enumerate_index(expr, at)
            if found is not None:  # enumerate(loader, start=1): i counts the batches; from 0, one short
                return BatchCount("index", found[0], found[1], name=name, loop=found[3], offset=found[2] - 1)
            return None
        # An alias: every binding is a count of batches (n_batches = len(val_dl); steps = n_batches).
        if all(b.kind in ("assign", "walrus") and not b.unpacked and b.value is not None for b in bindings):
            counts = [self._batches(b.value, b.stmt, depth + 1) for b in bindings]  # type: ignore[arg-type]
            if counts and all(c is not None for c in counts):
                first = counts[0]
                loader = first.loader if all(_same(c.loader, first.loader) for c in counts) else None  # type: ignore[union-attr]
                return BatchCount("alias", loader, first.info if loader is not None else None, name=name)  # type: ignore[union-attr]
        return self._counter(expr, bindings)

    def _counter(self, expr: ast.AST, bindings: list) -> BatchCount | None:
        """A variable set to a whole number (every time the same: its offset) and incremented by one once per
        batch of one loop over a loader."""
        name = dotted(expr)
        loops = []
        starts = set()
        for b in bindings:
            start = _start(b)
            if start is not None:
                starts.add(start)
                continue
            if not self._plus_one(b, name):
                return None
            loop = self.ctx.enclosing_loop(b.stmt)
            if loop is None or not self._once_per_iteration(b.stmt, loop):
                return None
            loops.append(loop)
        if not loops or any(loop is not loops[0] for loop in loops) or len(starts) > 1:
            return None
        found = self.loop_loader(loops[0])
        if found is None or found[1].one_sample_per_batch:
            return None
        offset = starts.pop() if starts else 0
        if offset and _leaves_early(loops[0]):
            return None  # a loop that skips a batch (if i == 0: continue) may count from 1 on purpose
        return BatchCount("counter", found[0], found[1], name=name, loop=loops[0], offset=offset)

    def _plus_one(self, b, name: str | None) -> bool:
        stmt = b.stmt
        if b.kind == "augassign" and isinstance(stmt, ast.AugAssign):
            return isinstance(stmt.op, ast.Add) and is_const(stmt.value, 1)
        if b.kind == "assign" and not b.unpacked and isinstance(b.value, ast.BinOp) and isinstance(b.value.op, ast.Add):
            value = b.value
            return (dotted(value.left) == name and is_const(value.right, 1)) or (
                dotted(value.right) == name and is_const(value.left, 1)
            )
        return False

    def _once_per_iteration(self, stmt: ast.AST, loop: ast.AST) -> bool:
        """Whether ``stmt`` runs once each time round ``loop``: only ``with`` and ``try`` bodies between them."""
        child = stmt
        for parent in self.ctx.ancestors(stmt):
            if parent is loop:
                return any(child is s for s in loop.body)  # type: ignore[attr-defined]
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                pass
            elif isinstance(parent, ast.Try) or type(parent).__name__ == "TryStar":
                if not any(child is s for s in (*parent.body, *parent.orelse, *parent.finalbody)):  # type: ignore[attr-defined]
                    return False
            else:
                return False
            child = parent
        return False

    def _enumerate_index(self, name: ast.Name, at: ast.AST) -> tuple[ast.AST, LoaderInfo, int, ast.AST] | None:
        """For ``i`` bound only by ``for i, batch in enumerate(loader[, start])``: (loader, info, start, loop)."""
        bindings = self.ctx.lookup(name.id, at)
        if len(bindings) != 1:
            return None
        b = bindings[0]
        loop = b.stmt
        if b.kind != "for" or not b.unpacked or b.index != 0 or not isinstance(loop, (ast.For, ast.AsyncFor)):
            return None
        call = loop.iter
        for _ in range(3):  # tqdm(enumerate(loader)) -> enumerate(loader)
            if isinstance(call, ast.Call) and last_name(call.func) != "enumerate" and call.args and (
                last_name(call.func) in _LOOP_WRAPPERS
            ):
                call = call.args[0]
        if not isinstance(call, ast.Call) or last_name(call.func) != "enumerate" or not call.args:
            return None
        start_node = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "start"), ast.Constant(0)
        )
        if not isinstance(start_node, ast.Constant) or type(start_node.value) is not int:
            return None
        source = _unwrap(call.args[0])
        info = self.ctx.loader(source) if source is not None else None
        if info is None or info.one_sample_per_batch or source is None:
            return None
        return source, info, start_node.value, loop

    def _data_over_batch_size(self, expr: ast.BinOp) -> bool:
        """``len(data) / batch_size`` or ``(len(data) + batch_size - 1) // batch_size`` (data not a loader)."""
        if not self._is_batch_size(expr.right):
            return False
        left = expr.left
        if isinstance(left, ast.BinOp) and isinstance(left.op, (ast.Add, ast.Sub)):
            left = left.left
        return self._len_of_data(left)

    def _len_of_data(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "len":
            return len(expr.args) == 1 and self.ctx.loader(expr.args[0]) is None
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute):  # X.shape[0]
            return expr.value.attr == "shape" and is_const(expr.slice, 0)
        return False

    @staticmethod
    def _is_batch_size(expr: ast.AST) -> bool:
        name = last_name(expr)
        if name is None:
            return False
        return name in ("bs", "bsz") or name.lower().endswith("batch_size")

    # --------------------------------------------------------------------------------- samples and tokens
    def _kind(self, expr: ast.AST, at: ast.AST, depth: int) -> str | None:
        if depth > _DEPTH:
            return None
        expr = _strip_casts(expr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "len" and expr.args:
            arg = expr.args[0]
            if isinstance(arg, ast.Attribute) and arg.attr == "dataset" and self.ctx.loader(arg.value) is not None:
                return SAMPLES  # len(loader.dataset)
        if isinstance(expr, (ast.Name, ast.Attribute)) and dotted(expr) is not None:
            bindings = [b for b in self.ctx.bindings_of(expr, at) if b.kind != "del"]
            kinds = set()
            for b in bindings:
                if is_zero_binding(b):
                    continue
                if b.unpacked or b.value is None or b.kind not in ("assign", "augassign", "walrus"):
                    return None
                if b.kind == "augassign":
                    if not isinstance(b.stmt.op, ast.Add):  # type: ignore[attr-defined]
                        return None
                    kinds.add(self.increment_kind(b.value))
                else:
                    kinds.add(self._kind(b.value, b.stmt, depth + 1))
            return kinds.pop() if len(kinds) == 1 else None
        return None

    def increment_kind(self, value: ast.AST) -> str | None:
        """What one increment adds: ``labels.size(0)``/``len(x)``/``x.shape[0]``/``batch_size`` add samples,
        ``mask.sum()``/``(labels != pad).sum()``/``x.numel()`` add tokens; else None."""
        value = _strip_casts(value)
        if isinstance(value, ast.Call):
            if method_call(value, "size") and len(value.args) == 1 and is_const(value.args[0], 0):
                return SAMPLES
            if isinstance(value.func, ast.Name) and value.func.id == "len" and len(value.args) == 1:
                return SAMPLES if self.ctx.loader(value.args[0]) is None else None
            if method_call(value, "numel") and not value.args:
                return TOKENS
            if method_call(value, "sum") and not value.args and not value.keywords:
                receiver = value.func.value  # type: ignore[attr-defined]
                if isinstance(receiver, ast.Compare) and all(isinstance(op, ast.NotEq) for op in receiver.ops):
                    return TOKENS  # (labels != -100).sum()
                if "mask" in (last_name(receiver) or "").lower():
                    return TOKENS  # attention_mask.sum()
            return None
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute):
            return SAMPLES if value.value.attr == "shape" and is_const(value.slice, 0) else None
        if self._is_batch_size(value):
            return SAMPLES
        return None


def counting(ctx: Context) -> Counting:
    """The ``Counting`` of a file's context, made once and shared by the rules that ask."""
    return ctx.analysis(Counting)


def _unwrap(expr: ast.AST) -> ast.AST | None:
    """``enumerate(tqdm(loader, ...))`` -> ``loader``; None for another call."""
    for _ in range(4):
        if isinstance(expr, ast.Call):
            if last_name(expr.func) in _LOOP_WRAPPERS and expr.args:
                expr = expr.args[0]
                continue
            return None
        break
    return expr


def _strip_casts(expr: ast.AST) -> ast.AST:
    """``float(n)``, ``int(n)``, ``n.item()`` -> ``n``."""
    for _ in range(6):
        if isinstance(expr, ast.Call) and not expr.keywords:
            func = expr.func
            if isinstance(func, ast.Name) and func.id in _CASTS and len(expr.args) == 1:
                expr = expr.args[0]
                continue
            if isinstance(func, ast.Attribute) and func.attr in _CAST_METHODS and not expr.args:
                expr = func.value
                continue
        break
    return expr


def _is_zero(expr: ast.AST | None) -> bool:
    if isinstance(expr, ast.Constant) and type(expr.value) in (int, float):
        return expr.value == 0
    if isinstance(expr, ast.Call) and len(expr.args) == 1:  # torch.tensor(0, device=device), float(0)
        return _is_zero(expr.args[0]) and last_name(expr.func) in ("tensor", "float", "int")
    return False


def _start(b) -> int | None:
    """The whole number a counter is set to (``n = 1``, ``loss, n = 0.0, 0``), else None."""
    if b.kind != "assign" or b.value is None:
        return None
    value = b.value
    if b.unpacked:
        if not isinstance(value, (ast.Tuple, ast.List)) or b.index is None or b.index >= len(value.elts):
            return None
        value = value.elts[b.index]
    if isinstance(value, ast.Constant) and type(value.value) in (int, float) and value.value == int(value.value):
        return int(value.value)
    return 0 if is_zero_binding(b) else None


def _adds_to(b, name: str | None) -> bool:
    """``total += term`` or ``total = total + term``."""
    stmt = b.stmt
    if b.kind == "augassign" and isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.op, ast.Add)
    if b.kind == "assign" and not b.unpacked and isinstance(b.value, ast.BinOp) and isinstance(b.value.op, ast.Add):
        return name is not None and name in (dotted(b.value.left), dotted(b.value.right))
    return False


def _leaves_early(loop: ast.AST) -> bool:
    """A ``continue`` or ``break`` of the loop itself (not of a loop nested in it)."""
    stack = list(loop.body)  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Continue, ast.Break)):
            return True
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                             ast.ClassDef)):
            stack.extend(getattr(node, "orelse", []))
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def is_zero_binding(b) -> bool:
    """``n = 0``, ``n = 0.0``, ``correct, n = 0, 0``."""
    if b.kind != "assign" or b.value is None:
        return False
    if not b.unpacked:
        return _is_zero(b.value)
    value = b.value
    if isinstance(value, (ast.Tuple, ast.List)) and b.index is not None and b.index < len(value.elts):
        return _is_zero(value.elts[b.index])
    return False


def _same(a: ast.AST | None, b: ast.AST | None) -> bool:
    if a is None or b is None:
        return a is b
    return a is b or (dotted(a) is not None and dotted(a) == dotted(b))
