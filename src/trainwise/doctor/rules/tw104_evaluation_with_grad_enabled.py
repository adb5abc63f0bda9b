"""TW104 evaluation-with-grad-enabled: an evaluation loop that runs the model with autograd on."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, is_const, last_name
from trainwise.doctor.rule import Rule

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Context managers that do not change autograd: anything else around the model call may (tw.evaluating(...)).
_TRANSPARENT_WITH = frozenset({"autocast", "open", "device", "tqdm", "profile", "record_function", "Timer", "timer"})
_DIFFERENTIATING = frozenset({"backward", "grad", "enable_grad", "set_grad_enabled", "requires_grad_", "retain_grad",
                              "vjp", "jvp", "jacobian", "hessian", "manual_backward"})


class EvaluationWithGradEnabled(Rule):
    """An evaluation loop that runs the model without `torch.no_grad()` or `torch.inference_mode()`.

    ## What it does
    Finds a model called inside an evaluation loop, a loop over a validation or test loader, or the loop of
    a function named like `evaluate`, `validate` or `test`, when neither the call, the function, nor any
    place that calls the function turns autograd off (`with torch.no_grad()`, `torch.inference_mode()`,
    the decorators, `set_grad_enabled(False)`).

    ## Why is this bad?
    With autograd on, every forward pass records its graph and keeps the activations alive for a backward
    pass that never comes: evaluation uses several times the memory it needs (often the cause of an
    out-of-memory error that appears only at validation), runs slower, and any value accumulated from the
    outputs keeps the graphs of every batch alive.

    The rule stays silent when the outputs are differentiated on purpose (the function calls `backward()`,
    `torch.autograd.grad`, `requires_grad_()` or `enable_grad()`: saliency maps, gradient penalties,
    adversarial examples), when the evaluation runs inside any other context manager or is decorated (which
    may turn autograd off), and when any call of the function in the file is made with autograd off.

    ## Example
    ```python
    import torch

    def evaluate(model, val_loader):
        model.eval()
        correct = 0
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct / len(val_loader.dataset)
    ```

    ## Use instead
    ```python
    import torch

    @torch.inference_mode()
    def evaluate(model, val_loader):
        model.eval()
        correct = 0
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct / len(val_loader.dataset)
    ```

    ## Fix safety
    There is no automatic fix: `inference_mode` tensors cannot later enter autograd, and where the
    evaluation's outputs go is outside the file's view; add the decorator or the `with` block by hand.
    """

    code = "TW104"
    name = "evaluation-with-grad-enabled"
    message = "the evaluation loop runs the model with autograd on: wrap it in torch.no_grad()/inference_mode()"

    def visit_Module(self, node: ast.Module) -> None:
        """Check every evaluation loop of the file."""
        regions = self.ctx.evaluation_regions()
        if not regions or self._file_turns_grad_off():
            return
        for region, calls in regions:
            if self._differentiates(region) or not self._callers_may_enable(region):
                continue
            for call in calls:
                if self.ctx.grad_disabled(call) or self.ctx.under_unknown_with(call, _TRANSPARENT_WITH):
                    continue
                self.report(
                    call,
                    f"`{self.ctx.segment(call.func)}` runs in an evaluation loop with autograd on: every batch records "
                    f"a graph it never uses; wrap the loop in `torch.no_grad()` or `torch.inference_mode()`",
                )
                break

    def _file_turns_grad_off(self) -> bool:
        """``torch.set_grad_enabled(False)`` as a statement, or parameters frozen with ``requires_grad``."""
        for stmt in self.ctx.nodes(ast.Expr):
            call = stmt.value  # type: ignore[attr-defined]
            if isinstance(call, ast.Call) and last_name(call.func) in ("set_grad_enabled", "_set_grad_enabled"):
                return True
            if isinstance(call, ast.Call) and last_name(call.func) == "requires_grad_":
                return True
        for assign in self.ctx.nodes(ast.Assign):
            for target in assign.targets:  # type: ignore[attr-defined]
                if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                    return True
        return False

    def _differentiates(self, region: ast.AST) -> bool:
        owner = region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)
        for node in ast.walk(owner):
            if isinstance(node, ast.Attribute) and node.attr in _DIFFERENTIATING | {"requires_grad"}:
                return True
            if isinstance(node, ast.Name) and node.id in ("grad", "enable_grad", "vjp", "jacrev", "jacfwd"):
                return True
        return False

    def _callers_may_enable(self, region: ast.AST) -> bool:
        """False when the function holding the loop (or one that calls it, two levels up) is decorated or is
        called with autograd off, or inside another context manager."""
        frontier = [region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)]
        for _ in range(3):
            next_frontier = []
            for fn in frontier:
                if not isinstance(fn, _FUNCTIONS):
                    continue
                if any(not _harmless_decorator(d) for d in fn.decorator_list):
                    return False
                for site in self.ctx.call_sites(fn):
                    if self.ctx.grad_disabled(site) or self.ctx.under_unknown_with(site, _TRANSPARENT_WITH):
                        return False
                    next_frontier.append(self.ctx.scope(site))
                outer = self.ctx.scope(fn)
                if isinstance(outer, _FUNCTIONS):
                    next_frontier.append(outer)
            frontier = next_frontier
        return True


def _harmless_decorator(decorator: ast.AST) -> bool:
    name = dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
    if isinstance(decorator, ast.Call) and name.endswith("set_grad_enabled"):
        return bool(decorator.args) and is_const(decorator.args[0], True)
    return name.rsplit(".", 1)[-1] in ("staticmethod", "classmethod", "property", "abstractmethod", "override")
