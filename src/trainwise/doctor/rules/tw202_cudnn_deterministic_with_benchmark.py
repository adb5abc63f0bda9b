"""TW202 cudnn-deterministic-with-benchmark: the two cuDNN switches contradict each other."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from trainwise.doctor.context import Context, position, walk_own
from trainwise.doctor.context.functions import callees, conditions_hold, functions, value_at_call
from trainwise.doctor.rule import Related, Rule

_CUDNN = frozenset({"torch.backends.cudnn"})
_SWITCHES = ("deterministic", "benchmark")
_DEPTH = 3  # helpers followed from a call: seed_everything() -> set_deterministic() -> ...


@dataclass(frozen=True)
class _Set:
    """One switch set in a scope: by an assignment there (``node``), or by a call there (``node``) to a helper
    that sets it (``origin``: the helper's file and assignment; ``helper``: its name)."""

    switch: str
    is_true: bool
    node: ast.AST
    origin: tuple[Context, ast.AST] | None = None
    helper: str = ""


class CudnnDeterministicWithBenchmark(Rule):
    """`cudnn.deterministic = True` together with `cudnn.benchmark = True`.

    ## What it does
    Finds code that sets both `torch.backends.cudnn.deterministic = True` and
    `torch.backends.cudnn.benchmark = True` in the same function or module, outside mutually exclusive
    branches. A call of a helper that sets a switch counts as setting it where it is called: the helper may
    be in the same file or in another file of the run (`seed_everything()` imported from `utils.py`, which
    sets `deterministic = True`, then `cudnn.benchmark = True` in `train.py`), and the finding names both
    places. A helper's switch under `if flag:` counts where the call passes a true constant for `flag` (or
    leaves a true default).

    ## Why is this bad?
    The two switches pull in opposite directions. `benchmark = True` times several convolution algorithms
    on the first batches and keeps the fastest, which can differ from run to run; `deterministic = True`
    asks for reproducible algorithms. Together, the run is neither reliably reproducible nor as fast as it
    could be, while the code claims determinism. Choose one: for reproducibility, `benchmark = False`
    (and `torch.use_deterministic_algorithms(True)`); for speed, drop `deterministic`.

    The rule stays silent when only one of them is set, when they are set in the two branches of the
    same `if`, when a later assignment (or helper) sets the switch back, and when a helper's switch depends
    on a value the call does not fix (`if args.deterministic:`, a flag passed as a variable).

    ## Example
    ```python
    import torch

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = True
    ```

    ## Use instead
    ```python
    import torch

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    ```

    ## Fix safety
    There is no automatic fix: which of the two the author wanted is a choice between speed and
    reproducibility.
    """

    code = "TW202"
    name = "cudnn-deterministic-with-benchmark"
    message = "cudnn.deterministic = True and cudnn.benchmark = True contradict each other"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._sets: list[tuple[ast.AST, _Set]] = []  # (scope, what is set there)
        self._inner: dict[int, tuple[ast.AST, list[ast.Call]]] = {}  # id(fn) -> (fn, its statement calls)
        self._cudnn: bool | None = None  # whether the file names cudnn at all

    def visit_Assign(self, node: ast.Assign) -> None:
        """``cudnn.deterministic = ...`` / ``cudnn.benchmark = ...`` (also in a tuple assignment)."""
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts))
            else:
                pairs = [(target, node.value)]
            for t, value in pairs:
                if isinstance(t, ast.Attribute) and t.attr in _SWITCHES and self.ctx.qualname(t.value) in _CUDNN:
                    is_true = isinstance(value, ast.Constant) and value.value is True
                    self._sets.append((self.ctx.scope(node), _Set(t.attr, is_true, node)))

    def visit_Expr(self, node: ast.Expr) -> None:
        """``seed_everything(42)`` as a statement: the switches the helper sets (and its own helpers). Only in a
        file that names cudnn itself: a contradiction needs one of its switches set here, or two helpers."""
        if isinstance(node.value, ast.Call) and self._names_cudnn():
            for found in self._through(self.ctx, node.value, 0):
                self._sets.append((self.ctx.scope(node), _Set(found.switch, found.is_true, node.value, found.origin,
                                                              found.helper)))

    def _names_cudnn(self) -> bool:
        if self._cudnn is None:
            self._cudnn = "cudnn" in self.ctx.source
        return self._cudnn

    def _through(self, ctx: Context, call: ast.Call, depth: int) -> list[_Set]:
        """The switches a call sets through the function it calls, last value of each switch first set."""
        targets = callees(ctx, call)
        if len(targets) != 1 or depth >= _DEPTH:
            return []
        callee, fn = targets[0]
        if "cudnn" not in callee.source:
            return []  # a file that never names cudnn sets no switch (nor do the same-file helpers it calls)
        summary = functions(callee)
        sets: list[tuple[tuple[int, int], _Set]] = []
        for switch in summary.cudnn_switches(fn):
            if not conditions_hold(callee, fn, switch.conditions, ctx, call):
                continue
            value = value_at_call(callee, fn, switch.param, ctx, call) if switch.param else switch.value
            sets.append((position(switch.node), _Set(switch.name, value is True, call, (callee, switch.node),
                                                     fn.name)))
        cached = self._inner.get(id(fn))
        if cached is None or cached[0] is not fn:
            cached = self._inner[id(fn)] = (fn, _statement_calls(fn))
        for inner in cached[1]:
            conditions = summary.flag_conditions(inner, fn)
            if conditions is not None and conditions_hold(callee, fn, conditions, ctx, call):
                sets.extend((position(inner), s) for s in self._through(callee, inner, depth + 1))
        last: dict[str, _Set] = {}
        for _, found in sorted(sets, key=lambda s: s[0]):
            last[found.switch] = found  # the helper's own order: `deterministic = True; ... = False` ends False
        return [_Set(s.switch, s.is_true, call, s.origin, fn.name) for s in last.values()]

    def finish(self) -> None:
        """Report the later of each contradicting pair, once per scope."""
        scopes: dict[ast.AST, list[_Set]] = {}
        for scope, found in self._sets:
            scopes.setdefault(scope, []).append(found)
        for sets in scopes.values():
            sets.sort(key=lambda s: position(s.node))
            det = [s for s in sets if s.switch == "deterministic" and s.is_true]
            bench = [s for s in sets if s.switch == "benchmark" and s.is_true]
            done = False
            for d in det:
                for b in bench:
                    if done or d.node is b.node or self._exclusive(d.node, b.node) or self._undone(sets, d) or (
                            self._undone(sets, b)):
                        continue
                    later, earlier = (d, b) if position(d.node) > position(b.node) else (b, d)
                    self._report(later, earlier)
                    done = True

    def _report(self, later: _Set, earlier: _Set) -> None:
        advice = "set benchmark = False for reproducibility, or drop deterministic for speed"
        if later.origin is None and earlier.origin is None:
            self.report(later.node, f"cudnn.{later.switch} = True and cudnn.{earlier.switch} = True (line "
                                    f"{earlier.node.lineno}) contradict each other; {advice}")  # type: ignore[attr-defined]
            return
        related: list[Related] = []
        parts = []
        for found, first in ((later, True), (earlier, False)):
            if found.origin is None:
                parts.append(f"cudnn.{found.switch} = True" + ("" if first else f" (line {found.node.lineno})"))  # type: ignore[attr-defined]
                continue
            ctx, node = found.origin
            program = self.ctx.program
            where = program.where(ctx, node) if program is not None and ctx is not self.ctx else (
                f"line {node.lineno}")  # type: ignore[attr-defined]
            called = "" if first else f", called on line {found.node.lineno}"  # type: ignore[attr-defined]
            parts.append(f"`{found.helper}()` setting cudnn.{found.switch} = True ({where}{called})")
            if program is not None:
                related.append(program.place(ctx, node, f"cudnn.{found.switch} = True, set by `{found.helper}()`"))
        self.report(later.node, f"{parts[0]} and {parts[1]} contradict each other; {advice}", related=tuple(related))

    def _undone(self, sets: list[_Set], found: _Set) -> bool:
        """Whether a later assignment (or helper call) in the same scope sets the same switch to something else."""
        return any(s.switch == found.switch and not s.is_true and position(s.node) > position(found.node)
                   and not self._exclusive(s.node, found.node) for s in sets)

    def _exclusive(self, a: ast.AST, b: ast.AST) -> bool:
        """Whether ``a`` and ``b`` sit in different branches of the same ``if`` (or ``try``/``match``)."""
        for ancestor in self.ctx.ancestors(a):
            if not self.ctx.is_inside(b, ancestor):
                continue
            if isinstance(ancestor, ast.If):
                return _branch(self.ctx, a, ancestor) != _branch(self.ctx, b, ancestor)
            if isinstance(ancestor, ast.Match):
                return True
            if isinstance(ancestor, ast.Try):
                return _branch(self.ctx, a, ancestor) != _branch(self.ctx, b, ancestor)
            if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                return False
        return False


def _statement_calls(fn: ast.AST) -> list[ast.Call]:
    """The calls a function makes as statements of its own body (``set_deterministic()``), in order."""
    return [n.value for n in walk_own(getattr(fn, "body", []))
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]


def _branch(ctx: object, node: ast.AST, stmt: ast.AST) -> str:
    for field in ("body", "orelse", "handlers", "finalbody", "test"):
        value = getattr(stmt, field, None)
        values = value if isinstance(value, list) else [value]
        if any(v is not None and ctx.is_inside(node, v) for v in values):  # type: ignore[attr-defined]
            return field
    return ""
