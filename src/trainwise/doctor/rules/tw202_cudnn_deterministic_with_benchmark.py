"""TW202 cudnn-deterministic-with-benchmark: the two cuDNN switches contradict each other."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainwise.doctor.context import Context, is_param, position, walk_own
from trainwise.doctor.context.functions import (
    callees,
    conditions_hold,
    functions,
    started_functions,
    value_at_call,
)
from trainwise.doctor.rule import Related, Rule

_CUDNN = frozenset({"torch.backends.cudnn"})
_SWITCHES = ("deterministic", "benchmark")
_DEPTH = 3  # helpers followed from a call: seed_everything() -> set_deterministic() -> ...
_NEGATED: dict[type[ast.cmpop], type[ast.cmpop]] = {ast.IsNot: ast.Is, ast.NotEq: ast.Eq, ast.NotIn: ast.In}


@dataclass(frozen=True)
class _Set:
    """One switch set in a scope: by an assignment there (``node``), or by a call there (``node``) to a helper
    that sets it (``origin``: the helper's file and assignment; ``helper``: its name), or by a call that starts
    the helper in new processes (``started``)."""

    switch: str
    is_true: bool
    node: ast.AST
    origin: tuple[Context, ast.AST] | None = None
    helper: str = ""
    started: str = ""  # set in new processes the call starts: "spawn" (mp.spawn) or "process" (Process(target=))
    tests: frozenset[tuple[str, bool]] = frozenset()  # the tests on module names it runs under in called functions


class CudnnDeterministicWithBenchmark(Rule):
    """`cudnn.deterministic = True` together with `cudnn.benchmark = True`.

    ## What it does
    Finds code that sets both `torch.backends.cudnn.deterministic = True` and
    `torch.backends.cudnn.benchmark = True` in the same function or module, outside mutually exclusive
    branches. A call of a function that sets a switch counts as setting it where it is called, in the order
    the run executes them: the function may be in the same file or in another file of the run
    (`seed_everything()` imported from `utils.py`, which sets `deterministic = True`, then
    `cudnn.benchmark = True` in `train.py`; `main()` asks for determinism, then calls `main_worker()`, which
    sets `benchmark = True`), and the finding names both places. A helper's switch under `if flag:` counts
    where the call passes a true constant for `flag` (or leaves a true default).

    A function started in new processes after the parent set `deterministic = True`
    (`torch.multiprocessing.spawn(main_worker, ...)`, `Process(target=run)`) that sets `benchmark = True`
    undoes it too: a forked process gets both switches, and a spawned one does not even inherit
    `deterministic`. The finding is on the `benchmark = True` (or whichever switch runs later) where it is in
    the checked file, else on the call that reaches it.

    ## Why is this bad?
    The two switches pull in opposite directions. `benchmark = True` times several convolution algorithms
    on the first batches and keeps the fastest, which can differ from run to run; `deterministic = True`
    asks for reproducible algorithms. Together, the run is neither reliably reproducible nor as fast as it
    could be, while the code claims determinism. Choose one: for reproducibility, `benchmark = False`
    (and `torch.use_deterministic_algorithms(True)`); for speed, drop `deterministic`.

    The rule stays silent when only one of them is set, when they are set in the two branches of the
    same `if` or under opposite tests (`if seed is not None:` ... `if seed is None:`), when a later assignment
    (or helper) sets the switch back, when a helper's switch depends on a value the call does not fix
    (`if args.deterministic:`, a flag passed as a variable), when the parent sets `benchmark` and the started
    processes `deterministic` (a spawned process does not inherit `benchmark`), and when the processes are
    started before the parent asks for determinism.

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
                self._sets.append((self.ctx.scope(node), found))

    def visit_Call(self, node: ast.Call) -> None:
        """``mp.spawn(main_worker, ...)``, ``Process(target=run)``: the switches the started function sets (in
        the new processes), where its arguments do not decide them."""
        if not self._names_cudnn() or (not node.args and not node.keywords):
            return
        started = started_functions(self.ctx, node)
        if started is None or len(started[1]) != 1 or isinstance(started[1][0].function, ast.Lambda):
            return
        how, (target,) = started
        for found in self._run_by(target.ctx, target.function, None, None, 1):  # type: ignore[arg-type]
            self._sets.append((self.ctx.scope(node), replace(found, node=node, helper=target.function.name,  # type: ignore[union-attr]
                                                             started=how)))

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
        return self._run_by(callee, fn, ctx, call, depth)

    def _run_by(self, callee: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Context | None,
                call: ast.Call | None, depth: int) -> list[_Set]:
        """The switches running ``fn`` sets, last value of each switch first set (at ``call`` in ``ctx``; when
        ``fn`` is started in new processes, both None: its arguments are unknown, so only the switches no
        argument decides count, each at its own assignment)."""
        if "cudnn" not in callee.source:
            return []  # a file that never names cudnn sets no switch (nor do the same-file helpers it calls)
        summary = functions(callee)
        sets: list[tuple[tuple[int, int], _Set]] = []
        for switch in summary.cudnn_switches(fn):
            if ctx is None or call is None:
                if switch.conditions or switch.param:
                    continue
                value = switch.value
            elif conditions_hold(callee, fn, switch.conditions, ctx, call):
                value = value_at_call(callee, fn, switch.param, ctx, call) if switch.param else switch.value
            else:
                continue
            sets.append((position(switch.node), _Set(switch.name, value is True, call or switch.node,
                                                     (callee, switch.node), fn.name,
                                                     tests=self._module_tests(callee, fn, switch.node))))
        cached = self._inner.get(id(fn))
        if cached is None or cached[0] is not fn:
            cached = self._inner[id(fn)] = (fn, _statement_calls(fn))
        for inner in cached[1]:
            conditions = summary.flag_conditions(inner, fn)
            if conditions is None or (conditions if ctx is None or call is None
                                      else not conditions_hold(callee, fn, conditions, ctx, call)):
                continue
            tests = self._module_tests(callee, fn, inner)
            sets.extend((position(inner), replace(s, tests=s.tests | tests))
                        for s in self._through(callee, inner, depth + 1))
        last: dict[str, _Set] = {}
        for _, found in sorted(sets, key=lambda s: s[0]):
            last[found.switch] = found  # the helper's own order: `deterministic = True; ... = False` ends False
        return [replace(s, node=call or s.node, helper=fn.name) for s in last.values()]

    def finish(self) -> None:
        """Report the later of each contradicting pair, once per scope (and once per place)."""
        scopes: dict[ast.AST, list[_Set]] = {}
        for scope, found in self._sets:
            scopes.setdefault(scope, []).append(found)
        reported: set[tuple[int, int]] = set()
        for sets in scopes.values():
            sets.sort(key=lambda s: position(s.node))
            here = [s for s in sets if not s.started]  # what runs in this process
            det = [s for s in here if s.switch == "deterministic" and s.is_true]
            bench = [s for s in here if s.switch == "benchmark" and s.is_true]
            started = [s for s in sets if s.started and s.switch == "benchmark" and s.is_true]
            pairs = [(d, b) for d in det for b in bench] + [(d, b) for d in det for b in started]
            for d, b in pairs:
                if self._contradict(here, d, b):
                    later, earlier = (d, b) if position(d.node) > position(b.node) else (b, d)
                    self._report(later, earlier, reported)
                    break

    def _contradict(self, here: list[_Set], d: _Set, b: _Set) -> bool:
        """Whether ``deterministic = True`` (``d``) and ``benchmark = True`` (``b``) hold together: both run on one
        path and neither is set back later; for a benchmark set in processes started after ``d``, it holds there
        (a process ``mp.spawn`` starts does not even inherit ``deterministic``)."""
        if d.node is b.node or self._exclusive(d, b) or self._undone(here, d):
            return False
        if b.started:
            return position(d.node) < position(b.node)
        return not self._undone(here, b)

    def _report(self, later: _Set, earlier: _Set, reported: set[tuple[int, int]]) -> None:
        """The finding goes on the later switch: its own assignment when it is in this file (in a function this
        scope calls), else the call in this scope that reaches it in another file."""
        advice = "set benchmark = False for reproducibility, or drop deterministic for speed"
        place = later.node
        if later.origin is not None and later.origin[0].path == self.ctx.path:
            place = later.origin[1]
        key = position(place)
        if key in reported:
            return
        reported.add(key)
        if later.origin is None and earlier.origin is None:
            self.report(place, f"cudnn.{later.switch} = True and cudnn.{earlier.switch} = True (line "
                               f"{earlier.node.lineno}) contradict each other; {advice}")  # type: ignore[attr-defined]
            return
        program = self.ctx.program
        related: list[Related] = []
        parts = []
        for found in (later, earlier):
            text, where = self._describe(found, later=found is later, placed=found is later and place is not found.node)
            parts.append(text)
            if where is not None and program is not None:
                related.append(program.place(where[0], where[1], f"cudnn.{found.switch} = True, set by "
                                                                 f"`{found.helper}()`"))
        if later.started:
            inherit = ("a process mp.spawn starts does not even inherit deterministic" if later.started == "spawn"
                       else "a forked process keeps deterministic and adds benchmark, a spawned one drops it")
            self.report(place, f"{parts[0]} undoes {parts[1]}: {inherit}; set deterministic = True and benchmark "
                               f"= False in `{later.helper}()`, or drop deterministic", related=tuple(related))
            return
        self.report(place, f"{parts[0]} and {parts[1]} contradict each other; {advice}", related=tuple(related))

    def _describe(self, found: _Set, later: bool, placed: bool) -> tuple[str, tuple[Context, ast.AST] | None]:
        """How the message names a switch, and the place a related note names (None: the finding's line or a
        line of this scope); ``later``: the switch the finding is on; ``placed``: on its own assignment, in a
        function this scope calls."""
        line = found.node.lineno  # type: ignore[attr-defined]
        if found.origin is None:
            return f"cudnn.{found.switch} = True" + ("" if later else f" (line {line})"), None
        ctx, node = found.origin
        run = (f"in the processes started on line {line}" if found.started == "process" else
               f"in the processes mp.spawn starts on line {line}" if found.started else f"called on line {line}")
        if placed:
            return f"cudnn.{found.switch} = True in `{found.helper}()` ({run})", None
        if ctx.path == self.ctx.path:
            return f"cudnn.{found.switch} = True in `{found.helper}()` (line {node.lineno}, {run})", (ctx, node)  # type: ignore[attr-defined]
        program = self.ctx.program
        where = program.where(ctx, node) if program is not None else f"line {node.lineno}"  # type: ignore[attr-defined]
        return f"`{found.helper}()` setting cudnn.{found.switch} = True ({where}, {run})", (ctx, node)

    def _tests(self, node: ast.AST) -> set[tuple[str, bool]]:
        """The ``if`` tests of its own function (or module) that ``node`` runs under, and whether each holds."""
        return _if_tests(self.ctx, node, lambda test: True)

    def _module_tests(self, callee: Context, fn: ast.AST, node: ast.AST) -> frozenset[tuple[str, bool]]:
        """The tests ``node`` runs under in ``fn`` that read only names of this file's module (``if SEED is
        None:``), which mean the same in the caller's scope; none for a function of another file."""
        if callee.path != self.ctx.path:
            return frozenset()
        return frozenset(_if_tests(callee, node, lambda test: all(
            not callee.bindings.get((fn, n.id)) and not is_param(fn, n.id)
            for n in ast.walk(test) if isinstance(n, ast.Name))))

    def _undone(self, sets: list[_Set], found: _Set) -> bool:
        """Whether a later assignment (or helper call) in the same scope sets the same switch to something else."""
        return any(s.switch == found.switch and not s.is_true and position(s.node) > position(found.node)
                   and not self._exclusive(s, found) for s in sets)

    def _exclusive(self, first: _Set, second: _Set) -> bool:
        """Whether two switches sit in different branches of the same ``if`` (or ``try``/``match``), or under
        two ``if``s of opposite tests (``if seed is not None:`` ... ``if seed is None:``, here or on a module name
        in the function a call reaches)."""
        a, b = first.node, second.node
        if (self._tests(a) | first.tests) & {(test, not holds) for test, holds in self._tests(b) | second.tests}:
            return True
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


def _if_tests(ctx: Context, node: ast.AST, keep: Callable[[ast.expr], bool]) -> set[tuple[str, bool]]:
    """The ``if`` tests (those ``keep`` accepts) of its own function or module that ``node`` runs under, each
    with whether it holds there."""
    found = set()
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            break
        if isinstance(ancestor, ast.If) and child is not ancestor.test and keep(ancestor.test):
            found.add(_normalized(ancestor.test, any(child is s for s in ancestor.body)))
        child = ancestor
    return found


def _normalized(test: ast.expr, holds: bool) -> tuple[str, bool]:
    """A test and whether it holds, negations taken out: ``x is not None`` true is ``x is None`` false."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, holds = test.operand, not holds
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _NEGATED:
        positive = _NEGATED[type(test.ops[0])]()
        test, holds = ast.Compare(test.left, [positive], test.comparators), not holds
    return ast.dump(test), holds


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
