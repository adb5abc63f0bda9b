"""TW106 accumulated-loss-not-scaled: gradient accumulation whose loss is not divided by the number of steps."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, is_const, keyword, last_name, method_call, walk_own
from trainwise.doctor.rule import Rule


class AccumulatedLossNotScaled(Rule):
    """Gradient accumulation (`step()` every k batches) whose loss is not divided by k before `backward()`.

    ## What it does
    Finds a loop that calls `optimizer.step()` only under `if (i + 1) % k == 0` and calls `backward()` on
    every batch, when the loss given to `backward()` is the plain output of a known mean-reduced loss
    (`criterion(...)` built from an `nn.*Loss` class, `F.cross_entropy(...)`, a Hugging Face `outputs.loss`),
    not divided by k, by a token count, or otherwise rescaled.

    ## Why is this bad?
    `backward()` adds to the gradients, so k micro-batches give the *sum* of k mean gradients: k times the
    gradient of one batch of k times the size. The effective learning rate is k times too large, gradient
    clipping thresholds mean something else, and changing k changes the training. Divide each micro-batch
    loss by k (or, when micro-batches hold different numbers of samples or tokens, sum the losses and divide
    by the window's total count) so that the accumulated gradient equals the full-batch gradient.

    The rule stays silent when the loss is divided or multiplied anywhere in the loop (`loss / k`,
    `loss /= k`, `loss * scale`, division by a token count), when the loss comes from a function of the
    file or an unknown one (which may scale it inside), when the reduction is not the mean, and when the
    gradients are rescaled by hand before the step.

    ## Example
    ```python
    import torch.nn as nn

    criterion = nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    import torch.nn as nn

    criterion = nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accumulation_steps
        loss.backward()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```
    (`trainwise.GradientAccumulator` also handles a short last window and token-weighted losses.)

    ## Fix safety
    There is no automatic fix: the right divisor is k for equal micro-batches, but a sample or token count
    when they differ, and the last window may be shorter.
    """

    code = "TW106"
    name = "accumulated-loss-not-scaled"
    message = "gradients are accumulated over k steps but the loss is not divided by k"

    def visit_If(self, node: ast.If) -> None:
        """``if (i + 1) % k == 0: optimizer.step()``."""
        k = _modulo_divisor(node.test)
        if k is None or is_const(k, 1) or self.ctx.constant(k) == 1:
            return
        if not any(self._is_step(c) for c in _own_calls(node.body)):
            return
        loop = self.ctx.enclosing_loop(node)
        if loop is None:
            return
        if _rescales_grads(loop):
            return
        k_text = self.ctx.segment(k) or "k"
        for call in _own_calls([loop]):
            if not method_call(call, "backward") or self.ctx.is_inside(call, node) or call.args:
                continue
            target = call.func.value  # type: ignore[attr-defined]
            if method_call(target, "scale") and len(target.args) == 1:  # type: ignore[attr-defined]
                target = target.args[0]  # type: ignore[attr-defined]
            if self._plain_loss(target, call, loop, 0):
                self.report(
                    call,
                    f"gradients are accumulated over `{k_text}` steps, but `{self.ctx.segment(target)}` is not "
                    f"divided by `{k_text}`: the step applies {k_text} times the mean gradient; divide the loss "
                    f"by `{k_text}` (or by the window's sample or token count)",
                )

    def _is_step(self, call: ast.Call) -> bool:
        if not method_call(call, "step"):
            return False
        receiver = call.func.value  # type: ignore[attr-defined]
        name = dotted(receiver) or ""
        if "sched" in name.lower():
            return False
        if not call.args:
            return self.ctx.is_optimizer(receiver)
        return "scaler" in name.lower() and self.ctx.is_optimizer(call.args[0])

    def _plain_loss(self, expr: ast.AST, at: ast.AST, loop: ast.AST, depth: int) -> bool:
        """A mean-reduced loss value, not rescaled anywhere in the loop."""
        if depth > 4:
            return False
        if isinstance(expr, ast.Name):
            if _rescaled_in(expr.id, loop):
                return False
            reaching = self.ctx.reaching(expr, at)
            if len(reaching) != 1:
                return False
            b = reaching[0]
            if b.kind != "assign" or b.unpacked or b.value is None or not self.ctx.is_inside(b.stmt, loop):
                return False
            return self._plain_loss(b.value, b.stmt, loop, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self._plain_loss(expr.left, at, loop, depth + 1)
            return left and self._plain_loss(expr.right, at, loop, depth + 1)
        if isinstance(expr, ast.Attribute) and expr.attr == "loss":
            value = expr.value
            if isinstance(value, ast.Call):
                return self.ctx.is_model_call(value)
            if isinstance(value, ast.Name):
                reaching = self.ctx.reaching(value, at)
                return (len(reaching) == 1 and reaching[0].kind == "assign" and not reaching[0].unpacked
                        and isinstance(reaching[0].value, ast.Call) and self.ctx.is_model_call(reaching[0].value))
            return False
        if isinstance(expr, ast.Call):
            return self._mean_loss_call(expr)
        return False

    def _mean_loss_call(self, call: ast.Call) -> bool:
        if not self.ctx.is_loss_call(call) or not _mean_reduction(call):
            return False
        func = call.func
        if isinstance(func, ast.Call):
            return _mean_reduction(func)
        q = self.ctx.qualname(func) or ""
        if q.startswith("torch.nn.functional."):
            return True
        bindings = self.ctx.bindings_of(func, call)
        for b in bindings:
            if b.kind == "param":
                continue
            if b.kind == "assign" and isinstance(b.value, ast.Call) and not b.unpacked:
                inner = self.ctx.qualname(b.value.func) or ""
                if inner.startswith("torch.nn.") and inner.endswith("Loss") and _mean_reduction(b.value):
                    continue
            return False  # a function of the file, a lambda, a custom class: it may scale inside
        return True


def _modulo_divisor(test: ast.AST) -> ast.AST | None:
    """``k`` in ``(i + 1) % k == 0`` (also inside ``and``/``or``, and ``not i % k``)."""
    if isinstance(test, ast.BoolOp):
        for value in test.values:
            found = _modulo_divisor(value)
            if found is not None:
                return found
        return None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        operand = test.operand
        if isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.Mod):
            return operand.right
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        for side, other in ((left, right), (right, left)):
            if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mod) and is_const(other, 0):
                return side.right
    return None


def _mean_reduction(call: ast.Call) -> bool:
    if any(kw.arg is None for kw in call.keywords):
        return False
    kw = keyword(call, "reduction")
    return kw is None or is_const(kw.value, "mean")


def _rescaled_in(name: str, loop: ast.AST) -> bool:
    """``loss /= k``, ``loss = loss / k``, ``loss.div_(k)``, ``loss *= w`` anywhere in the loop."""
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Div, ast.Mult, ast.FloorDiv)):
                    return True
                if method_call(sub, "div", "mul", "div_", "mul_", "true_divide"):
                    return True
        if method_call(node, "div_", "mul_") and last_name(node.func.value) == name:  # type: ignore[attr-defined]
            return True
    return False


def _rescales_grads(loop: ast.AST) -> bool:
    """Gradients divided by hand before the step: ``p.grad /= k``, ``p.grad.div_(k)``."""
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and "grad" in (dotted(node.target) or "").split("."):
            return True
        if method_call(node, "div_", "mul_") and "grad" in (dotted(node.func.value) or "").split("."):  # type: ignore[attr-defined]
            return True
    return False


def _own_calls(statements: list[ast.AST]) -> list[ast.Call]:
    return [n for n in walk_own(statements) if isinstance(n, ast.Call)]
