"""TW105 missing-zero-grad: a training loop that calls ``backward()`` and ``step()`` but never zeroes gradients."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, method_call, walk_own
from trainwise.doctor.rule import Rule

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class MissingZeroGrad(Rule):
    """A training loop with `backward()` and `optimizer.step()` but no `zero_grad()` anywhere in it.

    ## What it does
    Finds a loop whose body calls `loss.backward()` and `optimizer.step()` (or `scaler.step(optimizer)`)
    while nothing in the loop, nor in a function of the same file that the loop calls, zeroes the
    gradients: no `optimizer.zero_grad()`, no `model.zero_grad()`, no `p.grad = None`.

    ## Why is this bad?
    `backward()` *adds* to `.grad`. Without zeroing, each step applies the sum of the gradients of every
    batch seen so far: the effective learning rate grows with every step, and training diverges or
    oscillates without any error.

    The rule stays silent when the gradients are zeroed anywhere in the loop (every step, or every k steps
    for gradient accumulation, with or without `set_to_none`), on the model instead of the optimizer, in a
    closure passed to `step()`, or in a helper function of the same file that the loop calls.

    ## Example
    ```python
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    There is no automatic fix: zeroing belongs before the backward pass, or after the step when gradients
    are accumulated over several batches, and only the author knows which.
    """

    code = "TW105"
    name = "missing-zero-grad"
    message = "the loop calls backward() and step() but never zeroes the gradients: they add up across steps"

    def visit_For(self, node: ast.For) -> None:
        """A ``for`` loop."""
        self._check(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        """An ``async for`` loop."""
        self._check(node)

    def visit_While(self, node: ast.While) -> None:
        """A ``while`` loop."""
        self._check(node)

    def _check(self, loop: ast.For | ast.AsyncFor | ast.While) -> None:
        if "step" not in self.ctx.method_receivers:
            return
        calls = _own_calls(loop)
        if not any(self._is_backward(c) for c in calls):
            return
        step = next((c for c in calls if self._optimizer_step(c) is not None), None)
        if step is None:
            return
        # the innermost loop holding both decides: an inner loop reports for itself
        for inner in _own_loops(loop):
            inner_calls = _own_calls(inner)
            if any(self._is_backward(c) for c in inner_calls) and step in inner_calls:
                return
        if self.ctx.reaches_call(loop, _zeroes):
            return
        if _assigns_grad(loop) or any(_assigns_grad(fn) for fn in self.ctx.helpers_called(loop)):
            return
        optimizer = self._optimizer_step(step)
        if self._built_in(optimizer, step, loop):
            return  # a fresh optimizer every iteration: a numerical check, not a training loop
        self.report(
            step,
            f"`{optimizer}` steps after backward() in this loop, but no zero_grad() clears the gradients: "
            f"each step applies the sum of all earlier batches' gradients; call `{optimizer}.zero_grad()` "
            f"before the backward pass",
        )

    def _built_in(self, optimizer: str | None, step: ast.Call, loop: ast.AST) -> bool:
        receiver = step.func.value if not step.args else step.args[0]  # type: ignore[attr-defined]
        return any(self.ctx.is_inside(b.stmt, loop) for b in self.ctx.bindings_of(receiver, step))

    def _is_backward(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Attribute):
            return func.attr in ("backward", "manual_backward")
        return self.ctx.qualname(func) == "torch.autograd.backward"

    def _optimizer_step(self, call: ast.Call) -> str | None:
        """The optimizer a ``opt.step()`` / ``scaler.step(opt)`` call steps, else None."""
        if not method_call(call, "step"):
            return None
        receiver = call.func.value  # type: ignore[attr-defined]
        name = dotted(receiver)
        if name is None or "sched" in name.lower():
            return None
        if not call.args and not call.keywords:
            return name if self.ctx.is_optimizer(receiver) else None
        if call.args and not self.ctx.is_optimizer(receiver) and "scaler" in name.lower():
            target = dotted(call.args[0])
            return target if target is not None and self.ctx.is_optimizer(call.args[0]) else None
        return None  # step(closure): the closure does the work


def _zeroes(call: ast.Call) -> bool:
    """``x.zero_grad(...)``, ``p.grad.zero_()``, ``p.grad.detach_()``, ``torch.nn.utils...zero_grad``."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return isinstance(func, ast.Name) and "zero_grad" in func.id
    if "zero_grad" in func.attr:
        return True
    if func.attr in ("zero_", "detach_", "fill_"):
        text = dotted(func.value) or ""
        return "grad" in text.split(".")
    return False


def _assigns_grad(container: ast.AST) -> bool:
    """``p.grad = None`` (or any assignment to a ``.grad`` attribute)."""
    for node in ast.walk(container):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr == "grad":
                    return True
    return False


def _own_calls(loop: ast.AST) -> list[ast.Call]:
    """Calls inside a loop, nested function and class definitions excluded."""
    return [n for n in walk_own(ast.iter_child_nodes(loop)) if isinstance(n, ast.Call)]


def _own_loops(loop: ast.AST) -> list[ast.AST]:
    return [n for n in walk_own(ast.iter_child_nodes(loop)) if isinstance(n, _LOOPS)]
