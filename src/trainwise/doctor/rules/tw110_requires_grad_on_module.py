"""TW110 requires-grad-on-module: ``model.requires_grad = False`` sets a plain attribute and freezes nothing."""

from __future__ import annotations

import ast
from typing import Any

from trainwise.doctor.context import Context, dotted, is_const
from trainwise.doctor.context.freezes import Freezes
from trainwise.doctor.rule import FixAvailability, Rule


class RequiresGradOnModule(Rule):
    """`requires_grad` set where torch never reads it: on a module, or under a misspelt name.

    ## What it does
    Finds `<module>.requires_grad = False` where the object is an `nn.Module` (a model, a submodule such
    as `model.backbone`, a layer from `model.modules()`, `model.classifier[3]`, or an attribute that every
    module class of the project assigns a module, `self.model.outc` with `self.outc = OutConv(...)`), not a
    tensor or parameter.
    Finds `<module>.requires_grad = True` too when it tries to unfreeze a part of a model whose parameters
    the same code froze before: `model.classifier[3].requires_grad = True` after
    `for p in model.parameters(): p.requires_grad = False` or `model.requires_grad_(False)`.

    Finds a misspelt `requires_grad` too (`p.require_grad = False`, `requires_grads`, `requiresGrad`,
    `reqires_grad`: within two edits of it) on a parameter (a loop variable over `model.parameters()`,
    `layer.weight`), a module, or a tensor made by a torch factory (`torch.zeros(...)`, with `= True`).

    ## Why is this bad?
    `requires_grad` is an attribute of tensors. On a module, the assignment just creates a new Python
    attribute that nothing reads: every parameter still requires grad, the "frozen" backbone keeps
    training, and nothing warns. `module.requires_grad_(False)` sets the flag on every parameter. The same
    goes the other way: `= True` on a layer of a frozen model unfreezes nothing, and the layer meant to
    be fine-tuned stays frozen; `module.requires_grad_(True)` unfreezes it. A misspelt name is worse still:
    tensors and modules take any new attribute, so `p.require_grad = False` freezes nothing, silently.

    The rule stays silent on the attribute of a tensor or a parameter (`p.requires_grad = False` in a
    loop over `model.parameters()`, `model.fc.weight.requires_grad = False`), on a value that may be one
    (a loop over `[self.patch_embed, self.cls_token]` that holds an `nn.Parameter`, the `except` branch of a
    `try` that calls `.parameters()` on it), on `= True` when nothing around it was frozen before in the same
    function or script (parameters require grad already, so it changes nothing), when the freeze was
    conditional (`if` inside the loop over `named_parameters()`, which may spare that very layer), when the
    part was unfrozen again or assigned anew after the freeze (`model.fc = nn.Linear(...)`: a new layer
    trains), and on `= True` on the frozen model itself. A misspelt name stays unreported on an object of
    unknown kind (a config, an argument), on an object's own attribute (`self.require_grad = flag`), when
    code of the run reads an attribute of that name, on `= True` on a parameter nothing froze and on
    `= False` on a new tensor.

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
    The fix rewrites the statement as `<module>.requires_grad_(False)` (or `(True)`), and a misspelt name
    on a parameter or tensor as `requires_grad`. It is safe in the sense that it does what the line says;
    it does change behaviour, since the parameters then stop (or start) training, which was the intent. It
    is offered when the assignment has a single target.
    """

    code = "TW110"
    name = "requires-grad-on-module"
    message = "`requires_grad = False` on a module freezes nothing; use `.requires_grad_(False)`"
    fix_availability = FixAvailability.SOMETIMES

    @property
    def freezes(self) -> Freezes:
        """What the file freezes (``context/freezes.py``)."""
        return self.ctx.analysis(Freezes)

    def visit_Assign(self, node: ast.Assign) -> None:
        """``<module>.requires_grad = False`` (``= True`` on a part of a model frozen before), and a misspelt
        ``requires_grad`` on a parameter, tensor or module."""
        if is_const(node.value, False):
            flag = False
        elif is_const(node.value, True):
            flag = True
        else:
            return
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                self._on_module(node, target, flag)
            elif isinstance(target, ast.Attribute) and misspelt_requires_grad(target.attr):
                self._misspelt(node, target, flag)

    def _on_module(self, node: ast.Assign, target: ast.Attribute, flag: bool) -> None:
        found = self.freezes.grad_target(target.value, node)
        if found is None or found[0] != "module":
            return
        if flag and self.freezes.holds_frozen(target.value, node) is None:
            return  # parameters require grad already: True on the module changes nothing either way
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

    def _misspelt(self, node: ast.Assign, target: ast.Attribute, flag: bool) -> None:
        """``p.require_grad = False``: torch keeps the misspelt attribute and never reads it."""
        found = self.freezes.grad_target(target.value, node)
        if found is None or dotted(target.value) in ("self", "cls") or self._read_back(target.attr):
            return  # unknown, an object's own attribute, or one the code reads: not a misspelt flag
        kind, holder = found
        if kind == "tensor" and not flag:
            return  # a new tensor does not require grad: False changes nothing
        if kind != "tensor" and flag and (
                holder is None or self.freezes.holds_frozen(holder, node, itself=kind == "parameter") is None):
            return  # parameters require grad already
        text = self.ctx.segment(target.value) or "tensor"
        if kind == "module":
            right = f"{text}.requires_grad_({flag})"
            fix = self.make_fix(node, _to_method_call, f"use {right}") if len(node.targets) == 1 else None
        else:
            right = f"{text}.requires_grad = {flag}"
            fix = self.make_fix(node, _rename_attribute, f"write {right}") if len(node.targets) == 1 else None
        effect = ("the tensor still gets no gradient" if kind == "tensor"
                  else "this unfreezes nothing" if flag else "this freezes nothing")
        self.report(target, f"`{target.attr}` is not `requires_grad`: torch keeps the misspelt attribute and never "
                            f"reads it, so {effect}; write `{right}`", fix=fix)

    def _read_back(self, attr: str) -> bool:
        """Whether code of the file (or of another file of the run) reads an attribute of that name."""
        def reads(ctx: Context) -> list[str]:
            return [ctx.path] if any(n.attr == attr and isinstance(n.ctx, ast.Load)  # type: ignore[attr-defined]
                                     for n in ctx.nodes(ast.Attribute)) else []

        program = self.ctx.program
        return bool(reads(self.ctx) or (program is not None
                                        and program.gather(f"TW110 reads .{attr}", reads, needles=(attr,))))


def misspelt_requires_grad(name: str) -> bool:
    """Whether an attribute name is a near-miss of ``requires_grad`` (``require_grad``, ``requires_grads``,
    ``requiresGrad``, ``reqires_grad``, ``requires_gradient``), within two edits of it once case and
    underscores are set aside."""
    if name == "requires_grad":
        return False
    folded = name.lower().replace("_", "")
    return any(_edits(folded, word) <= 2 for word in ("requiresgrad", "requiresgradient"))


def _edits(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions, swaps of neighbours) between two short words."""
    previous: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        before, previous, row = previous, row, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], before[j - 2] + 1)
    return row[-1]


def _rename_attribute(node: object, cst: object) -> object:
    """``p.require_grad = False`` -> ``p.requires_grad = False`` (libcst nodes)."""
    c: Any = cst
    target = node.targets[0]  # type: ignore[attr-defined]
    renamed = target.with_changes(target=target.target.with_changes(attr=c.Name("requires_grad")))
    return node.with_changes(targets=[renamed])  # type: ignore[attr-defined]


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
