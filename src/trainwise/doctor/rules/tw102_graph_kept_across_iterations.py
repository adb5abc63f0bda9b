"""TW102 graph-kept-across-iterations: ``total += loss`` or ``losses.append(loss)`` keeps every step's graph."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted
from trainwise.doctor.rule import Rule


class GraphKeptAcrossIterations(Rule):
    """A tensor that carries an autograd graph is added to a running total or a list that outlives the step.

    ## What it does
    Finds a loss, or an output of a model call, that is added to a running total (`total += loss`,
    `total = total + loss`) or appended to a list (`losses.append(loss)`) defined outside the loop, while
    autograd is on.

    ## Why is this bad?
    A tensor computed with autograd on holds its whole computation graph, activations included. A running
    total of such tensors is itself part of one growing graph: no step's graph can be freed, memory grows
    every step until the run dies out of memory, and each step gets slower. What the total needs is the
    number: `loss.item()` (or `loss.detach()` to keep a tensor on the device and avoid a host sync).

    The rule stays silent when the accumulation runs under `torch.no_grad()` or `torch.inference_mode()`
    (or in a function decorated with them), when the total is itself differentiated (`total.backward()`)
    or returned as a loss, and on values that are not tensors with a graph (`loss.item()`, `len(batch)`).

    ## Example
    ```python
    import torch.nn.functional as F

    running_loss = 0.0
    for inputs, targets in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        running_loss += loss
    ```

    ## Use instead
    ```python
    import torch.nn.functional as F

    running_loss = 0.0
    for inputs, targets in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
    ```

    ## Fix safety
    There is no automatic fix: whether `.item()` (a number, one host sync per step) or `.detach()` (a
    tensor on the device) is right depends on what the total is used for.
    """

    code = "TW102"
    name = "graph-kept-across-iterations"
    message = "a tensor with an autograd graph is accumulated across iterations; use .item() or .detach()"

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        """``total += loss`` and ``outputs += [model(x)]``."""
        if not isinstance(node.op, (ast.Add, ast.Sub)):
            return
        value = node.value
        if isinstance(value, (ast.List, ast.Tuple)):
            for element in value.elts:
                if self._check(node, node.target, element, "added to the list"):
                    return
            return
        self._check(node, node.target, value, "added to the running total")

    def visit_Assign(self, node: ast.Assign) -> None:
        """``total = total + loss``."""
        if len(node.targets) != 1 or not isinstance(node.value, ast.BinOp) or not isinstance(node.value.op, ast.Add):
            return
        key = dotted(node.targets[0])
        if key is None:
            return
        if dotted(node.value.left) == key:
            self._check(node, node.targets[0], node.value.right, "added to the running total")
        elif dotted(node.value.right) == key:
            self._check(node, node.targets[0], node.value.left, "added to the running total")

    def visit_Call(self, node: ast.Call) -> None:
        """``losses.append(loss)``."""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and len(node.args) == 1 and not node.keywords:
            self._check(node, func.value, node.args[0], "appended to a list")

    def _check(self, node: ast.AST, target: ast.AST, value: ast.AST, verb: str) -> bool:
        ctx = self.ctx
        container = target.value if isinstance(target, ast.Subscript) else target
        key = dotted(container)
        if key is None:
            return False
        loop = ctx.enclosing_loop(node)
        if loop is None and not key.startswith("self."):
            return False
        if ctx.grad_disabled(node) or not ctx.carries_graph(value, node):
            return False
        if loop is not None and self._reset_in(container, loop, node):
            return False
        root = key.split(".")[0]
        scope = ctx.scope(node)
        if key in ctx.differentiated(scope) or (root != "self" and root in ctx.differentiated(scope)):
            return False
        if key.startswith("self.") and any(
            key in ctx.differentiated(fn) for fn in (*ctx.nodes(ast.FunctionDef), *ctx.nodes(ast.AsyncFunctionDef))
        ):
            return False
        value_text = " ".join(ctx.segment(value).split())[:40] or "the value"
        self.report(
            node,
            f"`{value_text}` carries an autograd graph and is {verb} `{key}`, which outlives the iteration: "
            f"every step's graph stays in memory; use `{value_text}.item()` (or `.detach()`)"
            if isinstance(value, ast.Name)
            else f"`{value_text}` carries an autograd graph and is {verb} `{key}`, which outlives the "
            f"iteration: every step's graph stays in memory; use .item() (or .detach())",
        )
        return True

    def _reset_in(self, container: ast.AST, loop: ast.AST, node: ast.AST) -> bool:
        """Whether the total or list is re-created inside the loop (then it lives one iteration only)."""
        for b in self.ctx.bindings_of(container, node):
            inside = b.stmt is not node and self.ctx.is_inside(b.stmt, loop)
            if inside and b.kind in ("assign", "for", "with", "walrus"):
                return True
        return False
