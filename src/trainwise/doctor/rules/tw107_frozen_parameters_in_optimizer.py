"""TW107 frozen-parameters-in-optimizer: parameters frozen, then the whole ``model.parameters()`` optimised."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, is_const, keyword, method_call, position
from trainwise.doctor.rule import FixAvailability, Rule

_PARAM_ITERS = ("parameters", "named_parameters")


class FrozenParametersInOptimizer(Rule):
    """Parameters frozen with `requires_grad = False` while the optimizer gets all of `model.parameters()`.

    ## What it does
    Finds an optimizer built over `model.parameters()` after part of `model` (or all of it) was frozen with
    `p.requires_grad = False` or `requires_grad_(False)` in the same function (or in `__init__`, for an
    optimizer built in another method of the class).

    ## Why is this bad?
    The optimizer then holds parameters that are not meant to change. They are skipped only while their
    `.grad` is `None`: gradients left from before the freeze (or zeroed with `set_to_none=False`) let
    momentum and weight decay keep moving the "frozen" weights; optimizer state, parameter groups and
    checkpoints carry them for nothing; and the code no longer says what is trained. Hand the optimizer the
    trainable parameters only.

    The rule stays silent when the optimizer is built over a different module than the frozen one (a frozen
    perceptual-loss network next to a trained generator), over an already filtered list, and when the frozen
    parameters are unfrozen later (gradual unfreezing keeps them in the optimizer on purpose).

    `trainwise lab frozen-norm` measures it: frozen BatchNorm: requires_grad_(False) vs freeze().

    ## Example
    ```python
    import torch
    import torchvision

    model = torchvision.models.resnet18(weights="DEFAULT")
    for p in model.parameters():
        p.requires_grad = False
    model.fc = torch.nn.Linear(512, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ```

    ## Use instead
    ```python
    import torch
    import torchvision

    model = torchvision.models.resnet18(weights="DEFAULT")
    for p in model.parameters():
        p.requires_grad = False
    model.fc = torch.nn.Linear(512, 10)
    optimizer = torch.optim.SGD((p for p in model.parameters() if p.requires_grad), lr=0.01, momentum=0.9)
    ```

    ## Fix safety
    The fix replaces `model.parameters()` in the optimizer call by
    `(p for p in model.parameters() if p.requires_grad)`. It is unsafe: an optimizer state saved from the
    old code no longer loads (its parameter groups are larger), and code elsewhere that unfreezes the
    parameters later would now train them without an optimizer.
    """

    code = "TW107"
    name = "frozen-parameters-in-optimizer"
    message = "frozen parameters are handed to the optimizer with model.parameters(); filter by requires_grad"
    fix_availability = FixAvailability.ALWAYS
    fix_safe = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._freezes: list[tuple[str, ast.AST, bool]] = []  # (module, statement, frozen?)
        self._optimizers: list[tuple[ast.Call, ast.Call, str]] = []  # (optimizer call, parameters() call, module)

    def visit_Assign(self, node: ast.Assign) -> None:
        """``p.requires_grad = False``."""
        if not isinstance(node.value, ast.Constant) or not isinstance(node.value.value, bool):
            return
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                module = self._owner(target.value, node)
                if module is not None:
                    self._freezes.append((module, node, not node.value.value))

    def visit_Call(self, node: ast.Call) -> None:
        """``x.requires_grad_(False)`` and optimizer constructors."""
        if method_call(node, "requires_grad_"):
            flag = node.args[0] if node.args else getattr(keyword(node, "requires_grad"), "value", None)
            if flag is None or isinstance(flag, ast.Constant):
                module = self._owner(node.func.value, node)  # type: ignore[attr-defined]
                if module is not None:
                    self._freezes.append((module, node, is_const(flag, False)))
            return
        q = self.ctx.qualname(node.func) or ""
        if not q.startswith("torch.optim.") or ".lr_scheduler" in q or ".swa_utils" in q:
            return
        params = node.args[0] if node.args else getattr(keyword(node, "params"), "value", None)
        if method_call(params, "parameters") and not params.args and not params.keywords:  # type: ignore[union-attr]
            module = dotted(params.func.value)  # type: ignore[union-attr]
            if module is not None:
                self._optimizers.append((node, params, module))  # type: ignore[arg-type]

    def _owner(self, expr: ast.AST, at: ast.AST) -> str | None:
        """The module whose parameters ``expr`` is: a loop variable over ``m.parameters()``, ``m.fc.weight``,
        or a module itself (for ``requires_grad_``)."""
        if isinstance(expr, ast.Name):
            loops = [b for b in self.ctx.bindings_of(expr, at) if b.kind == "for" and self.ctx.is_inside(at, b.stmt)]
            loops.sort(key=lambda b: position(b.stmt))
            for b in loops[-1:] or self.ctx.reaching(expr, at):
                if b.kind == "for" and b.iter is not None:
                    it = b.iter
                    if method_call(it, *_PARAM_ITERS):
                        if it.func.attr == "named_parameters" and b.index != 1:  # type: ignore[attr-defined]
                            return None
                        return dotted(it.func.value)  # type: ignore[attr-defined]
            if self.ctx.is_module(expr):
                return expr.id
            return None
        name = dotted(expr)
        if name is None:
            return None
        if name.endswith((".weight", ".bias")):
            return name.rsplit(".", 1)[0]
        return name if self.ctx.is_module(expr) else None

    def finish(self) -> None:
        """Match each optimizer over ``m.parameters()`` with a freeze of ``m`` or a part of it before it."""
        for call, params, module in self._optimizers:
            frozen = [(m, s) for m, s, f in self._freezes if f and _part_of(m, module) and self._before(s, call)]
            if not frozen or self._unfrozen(frozen, call, module):
                continue
            what = frozen[0][0]
            fix = self.make_fix(params, _filter_transform, "pass only parameters that require grad")
            self.report(
                params,
                f"`{what}` is frozen (requires_grad=False), but the optimizer gets all of `{module}.parameters()`; "
                f"pass `(p for p in {module}.parameters() if p.requires_grad)`",
                fix=fix,
            )

    def _before(self, freeze: ast.AST, call: ast.Call) -> bool:
        fs, cs = self.ctx.scope(freeze), self.ctx.scope(call)
        if fs is cs:
            return position(freeze) < position(call)
        cls = self.ctx.enclosing_class(freeze)
        return (isinstance(fs, ast.FunctionDef) and fs.name == "__init__" and cls is not None
                and cls is self.ctx.enclosing_class(call))

    def _unfrozen(self, frozen: list[tuple[str, ast.AST]], call: ast.Call, module: str) -> bool:
        root = module.split(".", 1)[0]
        for m, stmt, f in self._freezes:
            if f or m.split(".", 1)[0] != root:
                continue
            if self.ctx.scope(stmt) is not self.ctx.scope(call) or position(stmt) > position(call):
                return True  # unfrozen later, by design
            if any(_part_of(fm, m) and position(stmt) > position(fs) for fm, fs in frozen):
                return True  # the frozen part is unfrozen again before the optimizer is built
        return False


def _part_of(part: str, whole: str) -> bool:
    return part == whole or part.startswith(whole + ".")


def _filter_transform(node: object, cst: object) -> object:
    p = cst.Name("p")  # type: ignore[attr-defined]
    return cst.GeneratorExp(  # type: ignore[attr-defined]
        elt=p,
        for_in=cst.CompFor(  # type: ignore[attr-defined]
            target=cst.Name("p"),  # type: ignore[attr-defined]
            iter=node,
            ifs=[cst.CompIf(test=cst.Attribute(value=cst.Name("p"), attr=cst.Name("requires_grad")))],  # type: ignore[attr-defined]
        ),
    )
