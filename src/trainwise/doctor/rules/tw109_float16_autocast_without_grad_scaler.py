"""TW109 float16-autocast-without-grad-scaler: fp16 mixed-precision training with no ``GradScaler``."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, is_const, keyword, last_name, walk_own
from trainwise.doctor.rule import Rule

_AUTOCAST = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast_mode.autocast"}
)
_CUDA_DEFAULT_FP16 = frozenset({"torch.cuda.amp.autocast"})
_FP16 = frozenset({"torch.float16", "torch.half"})
# Frameworks that scale the loss themselves when they run the backward pass.
_SCALING_WORDS = ("scaler", "accelerator", "fabric", "engine", "deepspeed")


class Float16AutocastWithoutGradScaler(Rule):
    """Training under `autocast` with `torch.float16` and no `GradScaler` in the file.

    ## What it does
    Finds `torch.autocast(..., dtype=torch.float16)` (also `torch.cuda.amp.autocast()` and
    `torch.autocast("cuda")`, whose default is float16) around code whose loop, or function, calls
    `backward()`, in a file that never creates or uses a gradient scaler. The device type may be a variable
    assigned in the file: `device = "cuda"`, `device = "cuda" if torch.cuda.is_available() else "cpu"` (it
    runs on CUDA wherever a GPU is there), or `device.type` with `device = torch.device(...)` of those.

    ## Why is this bad?
    float16 has a far smaller range than float32: small gradients underflow to zero and large ones overflow
    to `inf`. `torch.amp.GradScaler` multiplies the loss before `backward()` and divides the gradients before
    the step, skipping steps whose gradients overflowed. Without it, fp16 training silently loses
    gradients (the loss stalls) or diverges to `nan`.

    The rule stays silent on bfloat16 (which has float32's range and needs no scaler), on float16 used for
    inference only (no `backward()`), on an unknown `dtype=` variable, on a device known to be `"cpu"` (CPU
    autocast defaults to bfloat16) or not known at all (a function argument, a setting), and when anything
    in the file looks like a scaler or a framework that scales for you (Accelerate, Fabric, DeepSpeed).

    `trainwise lab fp16-underflow` measures it: float16 gradients without a scaler vs with one vs bfloat16.

    ## Example
    ```python
    import torch

    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    Or use `dtype=torch.bfloat16` where the hardware supports it, with no scaler.

    ## Fix safety
    There is no automatic fix: a scaler changes three lines (`scale`, `step`, `update`), and switching to
    bfloat16 depends on the hardware.
    """

    code = "TW109"
    name = "float16-autocast-without-grad-scaler"
    message = "float16 autocast in a training loop with no GradScaler: small gradients underflow to zero"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._scaled: bool | None = None
        self._via: str | None = None  # the device variable that makes the autocast CUDA's float16 default

    def visit_withitem(self, node: ast.withitem) -> None:
        """``with autocast(...)``."""
        call = node.context_expr
        self._via = None
        if not isinstance(call, ast.Call) or not self._is_fp16_autocast(call):
            return
        if self._file_scales():
            return
        region = self.ctx.enclosing_loop(call) or self.ctx.scope(call)
        if isinstance(region, ast.Module) or not self._calls_backward(region):
            return
        what = "autocast runs in float16 in a loop that calls backward(), and no GradScaler scales the loss"
        if self._via is not None:
            what = (f"`{self._via}` can be \"cuda\", where autocast with no dtype runs in float16; this loop calls "
                    f"backward() and no GradScaler scales the loss")
        self.report(
            call,
            f"{what}: small gradients underflow to zero; use torch.amp.GradScaler, or dtype=torch.bfloat16",
        )

    def _is_fp16_autocast(self, call: ast.Call) -> bool:
        q = self.ctx.qualname(call.func) or ""
        if q not in _AUTOCAST:
            return False
        enabled = keyword(call, "enabled")
        if enabled is not None and is_const(enabled.value, False):
            return False
        dtype = keyword(call, "dtype")
        if dtype is not None:
            return self._is_fp16(dtype.value)
        if any(kw.arg is None for kw in call.keywords):
            return False
        if q in _CUDA_DEFAULT_FP16:  # torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, ...)
            if call.args and is_const(call.args[0], False):
                return False
            return self._is_fp16(call.args[1]) if len(call.args) > 1 else True
        device = keyword(call, "device_type")
        device_value = device.value if device is not None else (call.args[0] if call.args else None)
        if len(call.args) > 1:
            return self._is_fp16(call.args[1])
        if device_value is None or "cuda" not in self._device_types(device_value, call, 0):
            return False
        if not isinstance(device_value, ast.Constant):
            self._via = self.ctx.segment(device_value)
        return True

    def _device_types(self, expr: ast.AST, at: ast.AST, depth: int) -> frozenset[str]:
        """The device types ``expr`` can hold: ``"cuda"``, ``device`` bound to ``"cuda"``, to ``"cuda" if
        torch.cuda.is_available() else "cpu"``, or ``device.type`` with ``device = torch.device(...)`` of those.
        Empty when any of its values is unknown (an argument, a setting): the rule then stays silent."""
        if depth > 4:
            return frozenset()
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str) and expr.value:
                return frozenset({expr.value.split(":", 1)[0]})
            return frozenset()
        if isinstance(expr, ast.IfExp):
            body = self._device_types(expr.body, at, depth + 1)
            orelse = self._device_types(expr.orelse, at, depth + 1)
            return body | orelse if body and orelse else frozenset()
        if isinstance(expr, ast.Call) and self.ctx.qualname(expr.func) == "torch.device" and len(expr.args) == 1 \
                and not expr.keywords:
            return self._device_types(expr.args[0], at, depth + 1)
        if isinstance(expr, ast.Attribute) and expr.attr == "type" and isinstance(expr.value, ast.Name):
            found = self._values(expr.value, at)
            if not found or not all(isinstance(v, ast.Call) and self.ctx.qualname(v.func) == "torch.device"
                                    for v in found):
                return frozenset()
            return self._union([self._device_types(v, v, depth + 1) for v in found])
        if isinstance(expr, ast.Name):
            found = self._values(expr, at)
            if not found or any(isinstance(v, ast.Call) and self.ctx.qualname(v.func) == "torch.device"
                                for v in found):
                return frozenset()  # a torch.device, not a string: autocast wants device.type
            return self._union([self._device_types(v, v, depth + 1) for v in found])
        return frozenset()

    def _values(self, name: ast.Name, at: ast.AST) -> list[ast.expr]:
        """The values a name most likely holds at ``at``; empty unless every one is a plain assignment."""
        found = self.ctx.reaching(name, at)
        if not all(b.kind == "assign" and b.value is not None and not b.unpacked for b in found):
            return []
        return [b.value for b in found if b.value is not None]

    @staticmethod
    def _union(parts: list[frozenset[str]]) -> frozenset[str]:
        if not parts or not all(parts):
            return frozenset()
        return frozenset().union(*parts)

    def _is_fp16(self, expr: ast.AST) -> bool:
        if (self.ctx.qualname(expr) or "") in _FP16:
            return True
        if isinstance(expr, ast.Name):
            found = self.ctx.bindings_of(expr)
            if len(found) == 1 and found[0].kind == "assign" and found[0].value is not None and not found[0].unpacked:
                return (self.ctx.qualname(found[0].value) or "") in _FP16
        return False

    def _file_scales(self) -> bool:
        if self._scaled is None:
            self._scaled = False
            for node in ast.walk(self.ctx.tree):
                name = last_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
                if name is not None and any(w in name.lower() for w in _SCALING_WORDS):
                    self._scaled = True
                    break
            if not self._scaled:
                self._scaled = any(q.split(".", 1)[0] in ("accelerate", "lightning", "pytorch_lightning", "deepspeed")
                                   or "GradScaler" in q for q in self.ctx.aliases.values())
        return self._scaled

    def _calls_backward(self, region: ast.AST) -> bool:
        for node in walk_own(ast.iter_child_nodes(region)):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr == "backward" and dotted(func.value) != "torch.autograd":  # noqa: E501
                    return True
                if self.ctx.qualname(func) == "torch.autograd.backward":
                    return True
        return False
