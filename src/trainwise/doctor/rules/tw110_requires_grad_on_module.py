"""TW110 requires-grad-on-module: ``model.requires_grad = False`` sets a plain attribute and freezes nothing."""

from __future__ import annotations

import ast
from typing import Any

from trainwise.doctor.context import dotted, is_const, method_call, position
from trainwise.doctor.rule import FixAvailability, Rule


class RequiresGradOnModule(Rule):
    """`requires_grad = False` assigned to a module, where it freezes nothing.

    ## What it does
    Finds `<module>.requires_grad = False` where the object is an `nn.Module` (a model, a submodule such
    as `model.backbone`, a layer from `model.modules()`, `model.classifier[3]`), not a tensor or parameter.
    Finds `<module>.requires_grad = True` too when it tries to unfreeze a part of a model whose parameters
    the same code froze before: `model.classifier[3].requires_grad = True` after
    `for p in model.parameters(): p.requires_grad = False` or `model.requires_grad_(False)`.

    ## Why is this bad?
    `requires_grad` is an attribute of tensors. On a module, the assignment just creates a new Python
    attribute that nothing reads: every parameter still requires grad, the "frozen" backbone keeps
    training, and nothing warns. `module.requires_grad_(False)` sets the flag on every parameter. The same
    goes the other way: `= True` on a layer of a frozen model unfreezes nothing, and the layer meant to
    be fine-tuned stays frozen; `module.requires_grad_(True)` unfreezes it.

    The rule stays silent on the attribute of a tensor or a parameter (`p.requires_grad = False` in a
    loop over `model.parameters()`, `model.fc.weight.requires_grad = False`), on `= True` when nothing
    around it was frozen before in the same function or script (parameters require grad already, so it
    changes nothing), when the freeze was conditional (`if` inside the loop over `named_parameters()`, which
    may spare that very layer), and on `= True` on the frozen model itself.

    ## Example
    ```python
    import torchvision

    model = torchvision.models.resnet18(weights="DEFAULT")
    model.requires_grad = False
    ```

    ## Use instead
    ```python
    import torchvision

    model = torchvision.models.resnet18(weights="DEFAULT")
    model.requires_grad_(False)
    ```

    ## Fix safety
    The fix rewrites the statement as `<module>.requires_grad_(False)` (or `(True)`). It is safe in the
    sense that it does what the line says; it does change behaviour, since the parameters then stop (or
    start) training, which was the intent. It is offered when the assignment has a single target.
    """

    code = "TW110"
    name = "requires-grad-on-module"
    message = "`requires_grad = False` on a module freezes nothing; use `.requires_grad_(False)`"
    fix_availability = FixAvailability.SOMETIMES

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._frozen: list[ast.AST] | None = None

    def visit_Assign(self, node: ast.Assign) -> None:
        """``<module>.requires_grad = False``, or ``= True`` on a part of a model frozen before."""
        if is_const(node.value, False):
            flag = False
        elif is_const(node.value, True):
            flag = True
        else:
            return
        for target in node.targets:
            if not (isinstance(target, ast.Attribute) and target.attr == "requires_grad"):
                continue
            if not self.ctx.is_module(target.value):
                continue
            if flag and not self._frozen_before(target.value, node):
                continue  # parameters require grad already: True on the module changes nothing either way
            text = dotted(target.value) or self.ctx.segment(target.value) or "module"
            fix = None
            if len(node.targets) == 1:
                fix = self.make_fix(node, _to_method_call, f"use {text}.requires_grad_({flag})")
            if flag:
                message = (f"`{text}` is a module: `requires_grad = True` on it unfreezes nothing, its parameters "
                           f"stay frozen; use `{text}.requires_grad_(True)` (or loop over its `.parameters()`)")
            else:
                message = (f"`{text}` is a module: `requires_grad = False` on it freezes nothing; "
                           f"use `{text}.requires_grad_(False)`")
            self.report(target, message, fix=fix)

    # ------------------------------------------------------------------------------- = True: unfreezing
    def _frozen_before(self, module: ast.AST, node: ast.Assign) -> bool:
        """Whether a model that strictly contains ``module`` (``model`` for ``model.classifier[3]``) had its
        parameters frozen earlier in the file: ``model.requires_grad_(False)``, or ``p.requires_grad = False``
        (``p.requires_grad_(False)``) in a loop over ``model.parameters()``/``named_parameters()``."""
        owners = set()
        inner = module
        while isinstance(inner, (ast.Attribute, ast.Subscript)):
            inner = inner.value
            owners.add(ast.dump(inner))
        if not owners:
            return False
        scope = self.ctx.scope(node)
        return any(
            position(frozen) < position(node) and ast.dump(frozen) in owners and self.ctx.scope(frozen) is scope
            for frozen in self._frozen_models()
        )

    def _frozen_models(self) -> list[ast.AST]:
        """The modules whose parameters the file freezes, all of them, each as the expression naming it."""
        if self._frozen is not None:
            return self._frozen
        found: list[ast.AST] = []
        self._frozen = found
        for call in self.ctx.nodes(ast.Call):
            if method_call(call, "requires_grad_") and len(call.args) == 1 and is_const(call.args[0], False):
                found.append(call.func.value)  # type: ignore[attr-defined]
        for tp in (ast.For, ast.AsyncFor):
            for loop in self.ctx.nodes(tp):
                it = loop.iter  # type: ignore[attr-defined]
                if not method_call(it, "parameters", "named_parameters"):
                    continue
                target = loop.target  # type: ignore[attr-defined]
                if isinstance(target, ast.Tuple) and len(target.elts) == 2:
                    target = target.elts[1]
                if not isinstance(target, ast.Name):
                    continue
                if any(_freezes(stmt, target.id) for stmt in loop.body):  # type: ignore[attr-defined]
                    found.append(it.func.value)  # type: ignore[attr-defined]
        return found


def _freezes(node: ast.AST, name: str) -> bool:
    """``name.requires_grad = False`` or ``name.requires_grad_(False)`` (a statement of the loop's own body: one
    under an ``if`` may spare the very layer unfrozen later)."""
    if isinstance(node, ast.Expr):
        node = node.value
    if isinstance(node, ast.Assign) and is_const(node.value, False):
        return any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" and isinstance(t.value, ast.Name)
                   and t.value.id == name for t in node.targets)
    if isinstance(node, ast.Call) and method_call(node, "requires_grad_") and len(node.args) == 1:
        func = node.func
        return (is_const(node.args[0], False) and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == name)
    return False

def _to_method_call(node: object, cst: object) -> object:
    """``x.requires_grad = False`` -> ``x.requires_grad_(False)`` (libcst nodes). The value node is reused: a
    value in parentheses over several lines, with comments, becomes the call's argument with the outer
    parentheses' whitespace and comments as the call's own."""
    c: Any = cst
    target = node.targets[0].target  # type: ignore[attr-defined]
    value = node.value  # type: ignore[attr-defined]
    arg = c.Arg(value=value)
    before_args = c.SimpleWhitespace("")
    if value.lpar and value.rpar:
        before_args = value.lpar[0].whitespace_after
        arg = c.Arg(value=value.with_changes(lpar=value.lpar[1:], rpar=value.rpar[:-1]),
                    whitespace_after_arg=value.rpar[-1].whitespace_before)
    call = c.Call(
        func=c.Attribute(value=target.value, attr=c.Name("requires_grad_")),
        args=[arg],
        whitespace_before_args=before_args,
    )
    return c.Expr(value=call, semicolon=node.semicolon)  # type: ignore[attr-defined]
