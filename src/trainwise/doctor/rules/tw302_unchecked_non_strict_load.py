"""TW302 unchecked-non-strict-load: ``load_state_dict(strict=False)`` whose key report nobody reads."""

from __future__ import annotations

import ast

from trainwise.doctor.context import is_const, keyword, position
from trainwise.doctor.rule import Rule


class UncheckedNonStrictLoad(Rule):
    """`load_state_dict(..., strict=False)` whose missing and unexpected keys are never looked at.

    ## What it does
    Finds `load_state_dict(state, strict=False)` calls whose result (the named tuple of `missing_keys` and
    `unexpected_keys`) is discarded, or assigned to names that are never read.

    ## Why is this bad?
    With `strict=False`, keys that do not match are skipped silently. A checkpoint saved from
    `DataParallel`/DDP (`module.` prefixes) or from a compiled model (`_orig_mod.`) then loads *nothing*:
    training or evaluation runs from random weights and the only symptom is a bad number much later. The
    call returns the keys it could not match; look at them (or use `trainwise.checkpoint.load_weights`,
    which fixes the prefixes and reports what was left out).

    The rule stays silent when the result is used: assigned and then read, printed, asserted or returned.

    ## Example
    ```python
    import torch

    model.load_state_dict(torch.load("weights.pt", weights_only=True), strict=False)
    ```

    ## Use instead
    ```python
    import torch

    result = model.load_state_dict(torch.load("weights.pt", weights_only=True), strict=False)
    if result.missing_keys or result.unexpected_keys:
        print(f"missing: {result.missing_keys}, unexpected: {result.unexpected_keys}")
    ```

    ## Fix safety
    There is no automatic fix: what to do with keys that did not match depends on the model.
    """

    code = "TW302"
    name = "unchecked-non-strict-load"
    message = "load_state_dict(strict=False) ignores mismatched keys silently; check the returned keys"

    def visit_Call(self, node: ast.Call) -> None:
        """``x.load_state_dict(state, strict=False)`` or ``(state, False)``."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "load_state_dict"):
            return
        strict = keyword(node, "strict")
        if not (is_const(strict.value, False) if strict is not None else (
            len(node.args) >= 2 and is_const(node.args[1], False))):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, ast.Expr):
            self.report(node, "load_state_dict(strict=False) discards its report of missing and unexpected keys: "
                              "a checkpoint whose keys do not match loads nothing, silently; check the result")
            return
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = []
            for target in targets:
                elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                for element in elements:
                    if isinstance(element, ast.Starred):
                        element = element.value
                    if not isinstance(element, ast.Name):
                        return  # stored on an object or in a container: assume someone reads it
                    names.append(element.id)
            if all(name.startswith("_") for name in names):
                return  # an explicit discard
            if not self._read_later(set(names), parent):
                self.report(node, f"the keys that load_state_dict(strict=False) could not match are assigned to "
                                  f"`{', '.join(names)}` but never read; a checkpoint whose keys do not match "
                                  f"loads nothing, silently")

    def _read_later(self, names: set[str], stmt: ast.AST) -> bool:
        scope = self.ctx.scope(stmt)
        after = position(stmt)
        for name in self.ctx.nodes(ast.Name):
            if name.id in names and isinstance(name.ctx, ast.Load) and position(name) > after:  # type: ignore[attr-defined]
                inner = self.ctx.scope(name)
                if inner is scope or self.ctx.is_inside(inner, scope):
                    return True
        return False
