"""TW106 accumulated-loss-not-scaled: gradient accumulation whose loss is not divided by the number of steps."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from trainwise.doctor.context import dotted, is_const, keyword, last_name, method_call, walk_own
from trainwise.doctor.context.functions import functions
from trainwise.doctor.context.losses import MEAN, is_output_loss, losses
from trainwise.doctor.rule import Rule

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass(frozen=True)
class _Caller:
    """What the parameters of the function holding a backward stand for: ``params`` at ``site``, a call in
    ``window`` (no site: the backward runs in the window itself)."""

    params: dict
    site: ast.Call | None
    window: ast.AST


class AccumulatedLossNotScaled(Rule):
    """Gradient accumulation (`step()` every k batches) whose loss is not divided by k before `backward()`.

    ## What it does
    Finds gradient accumulation, `optimizer.step()` only under `if (i + 1) % k == 0` (`k` may be any
    expression: `self.grad_accum`, `args.gradient_accumulation_steps`, `cfg["subdivisions"]`), with `backward()`
    on every batch, when the loss given to `backward()` is the plain output of a known mean-reduced loss
    (`criterion(...)` built from an `nn.*Loss` class, `F.cross_entropy(...)`, a Hugging Face `outputs.loss`),
    not divided by k, by a token count, or otherwise rescaled.

    The loss may also come from a loss function of another file of the run, or the `forward` of a loss class
    (of the file or another one), that returns a mean over the samples: mean-reduced losses, `x.mean()`, and
    sums and constant multiples of these (`0.05 * box_loss + cls_loss`, terms added up over a model's heads
    in `for i, p in enumerate(predictions)`), also as the first element of a tuple (`loss, parts =
    compute_loss(outputs, targets)`).

    Each batch is the loop around the `if`, or, when there is none, the function holding it (a
    `training_step` method called once a micro-batch that counts `self.global_step`). The backward may run
    in a same-file function called on every batch (`self.backward(loss)`), the step in one the `if` calls
    (`self.optimizer_step()`), and the loss may come from a same-file function or method whose every
    `return` is such a plain loss (`self.compute_loss(batch)`, a `def loss_fn(pred, y)`).

    ## Why is this bad?
    `backward()` adds to the gradients, so k micro-batches give the *sum* of k mean gradients: k times the
    gradient of one batch of k times the size. The effective learning rate is k times too large, gradient
    clipping thresholds mean something else, and changing k changes the training. Divide each micro-batch
    loss by k (or, when micro-batches hold different numbers of samples or tokens, sum the losses and divide
    by the window's total count) so that the accumulated gradient equals the full-batch gradient.

    The rule stays silent when the loss is divided or multiplied anywhere on its way (`loss / k`,
    `loss /= k`, `loss = loss / self.accum` before the backward, `loss * scale`, division by a token
    count), also inside the helper that computes the loss or calls `backward()` (there a constant weight
    counts as rescaling only when it is 1/k); when the loss comes from an unknown function or is not
    mean-reduced: a `reduction="sum"` loss (k micro-batch sums are the full batch's sum, as in a YOLO loss
    summed over every cell), terms added up in a loop that may go over the batch's samples (`range(n)`,
    `zip(predictions, targets)`, a loop over images), a weight given as an argument;
    when the gradients are rescaled by hand before the step; when `accelerator.backward(loss)` does the
    backward (it scales by itself when configured); when a step or a `zero_grad()` outside the `if` runs on
    every batch, in the loop or in a function it calls (nothing is accumulated: the `if` steps something
    else, a weight average); for a backward in a branch of another `if` that steps or zeroes by itself (a
    GAN whose players each update every few batches); and, in a step function without a loop, for backward
    calls inside the function's own loops.

    `trainwise lab accumulation` measures it: gradient accumulation: loss / k vs counted.

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

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._k: float | None = None  # the period, when it is a number: a factor of 1/k is the rescaling

    def visit_If(self, node: ast.If) -> None:
        """``if (i + 1) % k == 0: optimizer.step()``."""
        k = _modulo_divisor(node.test)
        if k is None or is_const(k, 1) or self.ctx.constant(k) == 1:
            return
        value = self.ctx.constant(k)
        self._k = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if not self._steps(node.body):
            return
        window = self._window(node)
        if window is None or self._every_batch(window, node):
            return
        summaries = functions(self.ctx)
        candidates = self._backward_calls(window, node)
        if _rescales_grads(window) or any(_rescales_grads(r.function) for r in summaries.reached(window, 2)):
            return
        k_text = self.ctx.segment(k) or "k"
        reported: set[int] = set()
        for call, container, params, site in candidates:
            if id(call) in reported or self._stepped_apart(site if site is not None else call, window):
                continue
            target = call.func.value  # type: ignore[attr-defined]
            if method_call(target, "scale") and len(target.args) == 1:  # type: ignore[attr-defined]
                target = target.args[0]  # type: ignore[attr-defined]
            if self._plain_loss(target, call, container, 0, _Caller(params, site, window)):
                reported.add(id(call))
                self.report(
                    call,
                    f"gradients are accumulated over `{k_text}` steps, but `{self.ctx.segment(target)}` is not "
                    f"divided by `{k_text}`: the step applies {k_text} times the mean gradient; divide the loss "
                    f"by `{k_text}` (or by the window's sample or token count)",
                )

    def _stepped_apart(self, node: ast.AST, window: ast.AST) -> bool:
        """Whether ``node`` runs in a branch of another ``if`` of the window that steps or zeroes gradients
        itself (a GAN's ``if i % d_every == 0: opt_d.zero_grad(); loss_d.backward(); opt_d.step()``): its
        gradients are not the ones accumulated."""
        child = node
        for parent in self.ctx.ancestors(node):
            if parent is window:
                return False
            if isinstance(parent, ast.If):
                branch = parent.body if any(child is s for s in parent.body) else parent.orelse
                if any(self._is_step(c) or method_call(c, "zero_grad") for c in _own_calls(branch)):
                    return True
            child = parent
        return False

    def _steps(self, statements: list[ast.stmt]) -> bool:
        """An optimizer step in the statements, or in a same-file function they call (``self._step()``)."""
        calls = _own_calls(statements)
        if any(self._is_step(c) for c in calls):
            return True
        summaries = functions(self.ctx)
        return any(self._is_step(c) for stmt in statements for r in summaries.reached(stmt, 2)
                   for c in _own_calls(r.function.body))

    def _window(self, node: ast.If) -> ast.AST | None:
        """What runs once per micro-batch: the loop around the ``if``, or else the function holding it (a
        ``training_step`` method called once a batch, counting steps in ``self.step``)."""
        loop = self.ctx.enclosing_loop(node)
        if loop is not None:
            return loop
        fn = self.ctx.scope(node)
        return fn if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None

    def _every_batch(self, window: ast.AST, node: ast.If) -> bool:
        """A step or a ``zero_grad()`` outside the ``if`` on every batch (in the window, or in a same-file
        function it calls there): no accumulation happens."""
        summaries = functions(self.ctx)
        body = window.body if isinstance(window, (ast.FunctionDef, ast.AsyncFunctionDef)) else [window]
        for call in _own_calls(body):
            if self.ctx.is_inside(call, node) or self._conditional(call, window):
                continue
            if self._is_step(call) or method_call(call, "zero_grad"):
                return True
            for fn in summaries.targets(call):
                if fn is not window and any(
                    (self._is_step(c) or method_call(c, "zero_grad")) and not self._conditional(c, fn)
                    for c in _own_calls(fn.body)
                ):
                    return True
        return False

    def _conditional(self, call: ast.AST, container: ast.AST) -> bool:
        return any(isinstance(a, ast.If) for a in self._ancestors_within(call, container))

    def _ancestors_within(self, node: ast.AST, container: ast.AST) -> list[ast.AST]:
        found = []
        for parent in self.ctx.ancestors(node):
            if parent is container:
                break
            found.append(parent)
        return found

    def _backward_calls(self, window: ast.AST, node: ast.If) -> list[tuple[ast.Call, ast.AST, dict, ast.Call | None]]:
        """``x.backward()`` calls on every micro-batch: in the window outside the ``if`` (for a function
        window, outside its loops), and in same-file functions the window calls there (two levels), each with
        the container it runs in, what the function's parameters stand for, and the call that reaches it."""
        summaries = functions(self.ctx)
        in_function = isinstance(window, (ast.FunctionDef, ast.AsyncFunctionDef))
        own = _own_calls(window.body if in_function else [window])  # type: ignore[attr-defined]
        if in_function:
            own = [c for c in own if not any(isinstance(a, _LOOPS) for a in self._ancestors_within(c, window))]
        own = [c for c in own if not self.ctx.is_inside(c, node)]
        found: list[tuple[ast.Call, ast.AST, dict, ast.Call | None]] = []
        for call in own:
            if _backward(call):
                found.append((call, window, {}, None))
        for site in own:
            for fn in summaries.targets(site):
                if fn is window:
                    continue
                params = summaries.bind(site, fn)
                for call in _own_calls(fn.body):
                    if _backward(call):
                        found.append((call, fn, params, site))
                    for inner in summaries.targets(call):
                        if inner is fn or inner is window:
                            continue
                        inner_params = summaries.bind(call, inner, params)
                        found.extend((c, inner, inner_params, site) for c in _own_calls(inner.body) if _backward(c))
        return found

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

    def _plain_loss(self, expr: ast.AST, at: ast.AST, loop: ast.AST, depth: int,
                    caller: _Caller | None = None) -> bool:
        """A mean-reduced loss value, not rescaled anywhere in ``loop`` (the window, or the same-file function
        the value is computed in); ``caller`` says what that function's parameters stand for."""
        if depth > 6:
            return False
        if isinstance(expr, ast.Name):
            if _rescaled_in(expr.id, loop):
                return False
            reaching = self.ctx.reaching(expr, at)
            if len(reaching) != 1:
                return False
            b = reaching[0]
            if b.kind == "param" and caller is not None and caller.site is not None:
                arg = caller.params.get(expr.id)
                return arg is not None and self._plain_loss(arg, caller.site, caller.window, depth + 1)
            if b.kind != "assign" or b.value is None or not self.ctx.is_inside(b.stmt, loop):
                return False
            if b.unpacked:  # loss, parts = compute_loss(...): the first element of what it returns
                return (b.index is not None and isinstance(b.value, ast.Call)
                        and losses(self.ctx).call(b.value, b.index, self._k) == MEAN)
            return self._plain_loss(b.value, b.stmt, loop, depth + 1, caller)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self._plain_loss(expr.left, at, loop, depth + 1, caller)
            return left and self._plain_loss(expr.right, at, loop, depth + 1, caller)
        if is_output_loss(expr):
            return losses(self.ctx).model_output(expr.value, at)  # type: ignore[attr-defined]
        if isinstance(expr, ast.Call):
            helpers = self._loss_helpers(expr)
            if helpers is not None and all(self._returns_plain_loss(fn, depth) for fn in helpers):
                return True
            if helpers is None and self._mean_loss_call(expr):
                return True
            # a loss function of another file, a loss class's forward, terms added up with constant weights
            return losses(self.ctx).call(expr, None, self._k) == MEAN
        return False

    def _loss_helpers(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """The same-file functions a loss comes from (``self.compute_loss(batch)``, ``loss_fn(out, y)`` for a
        ``def loss_fn``), or None when the call is not one (an ``nn.*Loss`` object, a library function)."""
        func = call.func
        if isinstance(func, ast.Attribute) and self.ctx.bindings_of(func):
            return None  # self.criterion = nn.CrossEntropyLoss(): an object, not a method
        if isinstance(func, ast.Name) and any(b.kind != "def" for b in self.ctx.bindings_of(func, call)):
            return None
        if self.ctx.qualname(func) is not None:
            return None
        # obj.f(...) calls a method, f(...) a plain function: a same-named function of the other kind is
        # not the one called
        method = isinstance(func, ast.Attribute)
        found = [fn for fn in functions(self.ctx).targets(call)
                 if (self.ctx.enclosing_class(fn) is not None) == method]
        return found or None

    def _returns_plain_loss(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int) -> bool:
        """Every ``return`` of a same-file function gives a plain mean loss (and there is one)."""
        returns = [n for n in walk_own(fn.body) if isinstance(n, ast.Return)]
        if not returns or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in walk_own(fn.body)):
            return False
        return all(r.value is not None and self._plain_loss(r.value, r, fn, depth + 1) for r in returns)

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


def _backward(call: ast.Call) -> bool:
    """``x.backward()`` without arguments (``accelerator.backward(loss)`` may scale by itself)."""
    return method_call(call, "backward") and not call.args
