"""TW202 cudnn-deterministic-with-benchmark: the two cuDNN switches contradict each other."""

from __future__ import annotations

import ast

from trainwise.doctor.context import position
from trainwise.doctor.rule import Rule

_CUDNN = frozenset({"torch.backends.cudnn"})
_SWITCHES = ("deterministic", "benchmark")


class CudnnDeterministicWithBenchmark(Rule):
    """`cudnn.deterministic = True` together with `cudnn.benchmark = True`.

    ## What it does
    Finds code that sets both `torch.backends.cudnn.deterministic = True` and
    `torch.backends.cudnn.benchmark = True` in the same function or module, outside mutually exclusive
    branches.

    ## Why is this bad?
    The two switches pull in opposite directions. `benchmark = True` times several convolution algorithms
    on the first batches and keeps the fastest, which can differ from run to run; `deterministic = True`
    asks for reproducible algorithms. Together, the run is neither reliably reproducible nor as fast as it
    could be, while the code claims determinism. Choose one: for reproducibility, `benchmark = False`
    (and `torch.use_deterministic_algorithms(True)`); for speed, drop `deterministic`.

    The rule stays silent when only one of them is set, and when they are set in the two branches of the
    same `if`.

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
        self._sets: list[tuple[ast.AST, str, bool, ast.AST]] = []  # scope, switch, value is True, node

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
                    self._sets.append((self.ctx.scope(node), t.attr, is_true, node))

    def finish(self) -> None:
        """Report the later of each contradicting pair, once per scope."""
        scopes: dict[ast.AST, list[tuple[str, bool, ast.AST]]] = {}
        for scope, switch, is_true, node in self._sets:
            scopes.setdefault(scope, []).append((switch, is_true, node))
        for sets in scopes.values():
            sets.sort(key=lambda s: position(s[2]))
            det = [s for s in sets if s[0] == "deterministic" and s[1]]
            bench = [s for s in sets if s[0] == "benchmark" and s[1]]
            done = False
            for _, _, d in det:
                for _, _, b in bench:
                    if done or self._exclusive(d, b) or self._undone(sets, d) or self._undone(sets, b):
                        continue
                    later, earlier = (d, b) if position(d) > position(b) else (b, d)
                    other = "benchmark" if later is d else "deterministic"
                    self.report(
                        later,
                        f"cudnn.deterministic = True and cudnn.benchmark = True (line {earlier.lineno}) contradict "
                        f"each other; set benchmark = False for reproducibility, or drop deterministic for speed"
                        if other == "benchmark"
                        else f"cudnn.benchmark = True and cudnn.deterministic = True (line {earlier.lineno}) "
                        f"contradict each other; set benchmark = False for reproducibility, or drop deterministic "
                        f"for speed",
                    )
                    done = True

    def _undone(self, sets: list[tuple[str, bool, ast.AST]], node: ast.AST) -> bool:
        """Whether a later assignment in the same scope sets the same switch to something else."""
        switch = next(s for s, _, n in sets if n is node)
        return any(s == switch and not t and position(n) > position(node) and not self._exclusive(n, node)
                   for s, t, n in sets)

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


def _branch(ctx: object, node: ast.AST, stmt: ast.AST) -> str:
    for field in ("body", "orelse", "handlers", "finalbody", "test"):
        value = getattr(stmt, field, None)
        values = value if isinstance(value, list) else [value]
        if any(v is not None and ctx.is_inside(node, v) for v in values):  # type: ignore[attr-defined]
            return field
    return ""
