"""TW107 frozen-parameters-in-optimizer: parameters frozen, then the whole ``model.parameters()`` optimised."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, keyword, method_call
from trainwise.doctor.context.freezes import Freezes
from trainwise.doctor.rule import FixAvailability, Rule


class FrozenParametersInOptimizer(Rule):
    """Parameters frozen with `requires_grad = False` while the optimizer gets all of `model.parameters()`.

    ## What it does
    Finds an optimizer built over `model.parameters()` after part of `model` (or all of it) was frozen with
    `p.requires_grad = False` or `requires_grad_(False)` in the same function (or in `__init__`, for an
    optimizer built in another method of the class), itself or through a helper of the file that freezes
    the module it is given (`freeze(model.backbone)`).

    ## Why is this bad?
    The optimizer then holds parameters that are not meant to change. They are skipped only while their
    `.grad` is `None`: gradients left from before the freeze (or zeroed with `set_to_none=False`) let
    momentum and weight decay keep moving the "frozen" weights; optimizer state, parameter groups and
    checkpoints carry them for nothing; and the code no longer says what is trained. Hand the optimizer the
    trainable parameters only.

    The rule stays silent when the optimizer is built over a different module than the frozen one (a frozen
    perceptual-loss network next to a trained generator), over an already filtered list, when the frozen
    parameters are unfrozen later (gradual unfreezing keeps them in the optimizer on purpose), and on
    `model.backbone.requires_grad = False`, which freezes nothing (TW110).

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

    def visit_Call(self, node: ast.Call) -> None:
        """An optimizer built over all of ``m.parameters()`` after a freeze of ``m`` or a part of it
        (``context/freezes.py``)."""
        q = self.ctx.qualname(node.func) or ""
        if not q.startswith("torch.optim.") or ".lr_scheduler" in q or ".swa_utils" in q:
            return
        params = node.args[0] if node.args else getattr(keyword(node, "params"), "value", None)
        if not (method_call(params, "parameters") and not params.args and not params.keywords):  # type: ignore[union-attr]
            return
        module = dotted(params.func.value)  # type: ignore[union-attr]
        frozen = self.ctx.analysis(Freezes).kept_frozen(module, node) if module is not None else []
        if not frozen:
            return
        fix = self.make_fix(params, _filter_transform, "pass only parameters that require grad")
        self.report(
            params,
            f"`{frozen[0].module}` is frozen (requires_grad=False), but the optimizer gets all of "
            f"`{module}.parameters()`; pass `(p for p in {module}.parameters() if p.requires_grad)`",
            fix=fix,
        )


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
