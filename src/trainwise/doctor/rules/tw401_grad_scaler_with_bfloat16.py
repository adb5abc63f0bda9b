"""TW401 grad-scaler-with-bfloat16: a ``GradScaler`` scaling a loss computed under bfloat16 autocast."""

from __future__ import annotations

import ast

from trainwise.doctor.context import Context, is_const, keyword, method_call
from trainwise.doctor.rule import Rule

_AUTOCAST = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
     "torch.amp.autocast_mode.autocast"}
)
_BF16 = frozenset({"torch.bfloat16"})
_SCALERS = frozenset(
    {"torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.cpu.amp.GradScaler",
     "torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
)


class GradScalerWithBfloat16(Rule):
    """A `GradScaler` that scales a loss computed under bfloat16 autocast: wasted work every step.

    ## What it does
    Finds `scaler.scale(loss)` in a loop (or function) whose `torch.autocast(...)` runs in
    `dtype=torch.bfloat16` (directly, or through a name bound once to it), where `scaler` is a
    `torch.amp.GradScaler(...)` or `torch.cuda.amp.GradScaler()` built in the file and not switched off
    (`enabled=` absent or `True`). A performance rule (4xx): it runs only when selected
    (`trainwise doctor --select TW401`, or `select = ["TW4"]` in `[tool.trainwise.doctor]`).

    ## Why is this bad?
    Loss scaling exists for float16, whose narrow exponent range makes small gradients underflow to zero.
    bfloat16 has float32's exponent range: its gradients do not underflow, so the scaler only adds work at
    every step (a multiply of the loss, an unscale and an inf/NaN check of every gradient, a host
    synchronisation in `update()`) and, after an overflow, skips steps for nothing. The results are right;
    the time is wasted. `trainwise lab fp16-underflow` compares float16, float16 with a scaler and bfloat16.

    The rule stays silent on float16 autocast with a scaler (the right way), bfloat16 without a scaler, a
    scaler built with `enabled=False` or with a flag (`enabled=use_fp16`, which the program sets to match
    the format), a dtype it cannot tell (a variable chosen at run time), and a scaler that comes from
    elsewhere (an argument).

    ## Example
    ```python
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Use instead
    ```python
    import torch

    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    There is no automatic fix: removing the scaler changes three lines (`scale`, `step`, `update`) and
    the scaler's state in checkpoints.
    """

    code = "TW401"
    name = "grad-scaler-with-bfloat16"
    message = "a GradScaler scales a loss computed under bfloat16 autocast, which needs no scaling"
    default_enabled = False

    def visit_withitem(self, node: ast.withitem) -> None:
        """``with torch.autocast(..., dtype=torch.bfloat16):`` and the ``scaler.scale(...)`` of its loop."""
        call = node.context_expr
        if not isinstance(call, ast.Call) or not self._is_bf16_autocast(call):
            return
        region = self.ctx.enclosing_loop(call) or self.ctx.scope(call)
        if isinstance(region, ast.Module):
            return
        scope = self.ctx.scope(call)
        for scale in self.ctx.nodes(ast.Call):
            if not (method_call(scale, "scale") and len(scale.args) == 1 and self.ctx.is_inside(scale, region)
                    and self.ctx.scope(scale) is scope):
                continue
            scaler = scale.func.value  # type: ignore[attr-defined]
            if not _is_live_scaler(self.ctx, scaler, scale):
                continue
            text = self.ctx.segment(scaler)
            self.report(
                scale,
                f"`{text}` is a GradScaler, but the loss comes from bfloat16 autocast (line {call.lineno}): bfloat16 "
                f"has float32's range and does not underflow, so the scaler only adds work every step (unscale, "
                f"inf/NaN check, a sync in update()); drop it and call loss.backward() and optimizer.step()",
            )
            return

    def _is_bf16_autocast(self, call: ast.Call) -> bool:
        if (self.ctx.qualname(call.func) or "") not in _AUTOCAST:
            return False
        enabled = keyword(call, "enabled")
        if enabled is not None and not is_const(enabled.value, True):
            return False
        dtype = keyword(call, "dtype")
        if dtype is None:
            return False
        value: ast.AST = dtype.value
        if isinstance(value, ast.Name):
            found = self.ctx.bindings_of(value)
            if len(found) != 1 or found[0].kind != "assign" or found[0].value is None or found[0].unpacked:
                return False
            value = found[0].value
        return (self.ctx.qualname(value) or "") in _BF16


def _is_live_scaler(ctx: Context, scaler: ast.AST, at: ast.AST) -> bool:
    """``scaler`` (a name or ``self.scaler``) is bound only to GradScalers built in the file and always on."""
    if not isinstance(scaler, (ast.Name, ast.Attribute)):
        return False
    found = ctx.bindings_of(scaler, at) if isinstance(scaler, ast.Name) else ctx.bindings_of(scaler)
    if not found:
        return False
    for binding in found:
        value = binding.value
        if binding.kind != "assign" or binding.unpacked or not isinstance(value, ast.Call):
            return False
        if (ctx.qualname(value.func) or "") not in _SCALERS:
            return False
        enabled = keyword(value, "enabled")
        if enabled is not None and not is_const(enabled.value, True):
            return False
        if any(kw.arg is None for kw in value.keywords) or len(value.args) > 1:
            return False  # **kwargs, or enabled given by position (device, init_scale, ..., enabled)
    return True
