"""TW110 requires-grad-on-module: ``model.requires_grad = False`` sets a plain attribute and freezes nothing."""

from __future__ import annotations

import ast
from typing import Any

from trainwise.doctor.context import dotted, is_const
from trainwise.doctor.rule import FixAvailability, Rule


class RequiresGradOnModule(Rule):
    """`requires_grad = False` assigned to a module, where it freezes nothing.

    ## What it does
    Finds `<module>.requires_grad = False` where the object is an `nn.Module` (a model, a submodule such
    as `model.backbone`, a layer from `model.modules()`), not a tensor or parameter.

    ## Why is this bad?
    `requires_grad` is an attribute of tensors. On a module, the assignment just creates a new Python
    attribute that nothing reads: every parameter still requires grad, the "frozen" backbone keeps
    training, and nothing warns. `module.requires_grad_(False)` sets the flag on every parameter.

    The rule stays silent on the attribute of a tensor or a parameter (`p.requires_grad = False` in a
    loop over `model.parameters()`, `model.fc.weight.requires_grad = False`).

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
    The fix rewrites the statement as `<module>.requires_grad_(False)`. It is safe in the sense that it
    does what the line says; it does change behaviour, since the parameters then stop training (which was
    the intent). It is offered when the assignment has a single target.
    """

    code = "TW110"
    name = "requires-grad-on-module"
    message = "`requires_grad = False` on a module freezes nothing; use `.requires_grad_(False)`"
    fix_availability = FixAvailability.SOMETIMES

    def visit_Assign(self, node: ast.Assign) -> None:
        """``<module>.requires_grad = False``."""
        if not is_const(node.value, False):
            return
        for target in node.targets:
            if not (isinstance(target, ast.Attribute) and target.attr == "requires_grad"):
                continue
            if not self.ctx.is_module(target.value):
                continue
            text = dotted(target.value) or self.ctx.segment(target.value) or "module"
            fix = None
            if len(node.targets) == 1:
                fix = self.make_fix(node, _to_method_call, f"use {text}.requires_grad_(False)")
            self.report(
                target,
                f"`{text}` is a module: `requires_grad = False` on it freezes nothing; "
                f"use `{text}.requires_grad_(False)`",
                fix=fix,
            )


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
