"""TW109 float16-autocast-without-grad-scaler: float16 training (autocast, a float16 model), no ``GradScaler``."""

from __future__ import annotations

import ast

from trainwise.doctor.context import (
    Context,
    argument,
    dotted,
    is_bound_method,
    is_const,
    keyword,
    last_name,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.dtypes import FP16, OUT_OF_FP16, built_float16, is_float16
from trainwise.doctor.context.freezes import under
from trainwise.doctor.context.functions import callees, functions
from trainwise.doctor.rule import Rule

_AUTOCAST = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast_mode.autocast"}
)
_CUDA_DEFAULT_FP16 = frozenset({"torch.cuda.amp.autocast"})
# Frameworks that scale the loss themselves when they run the backward pass; fp32 master weights, loss scales.
_SCALING_WORDS = ("scaler", "accelerator", "fabric", "engine", "deepspeed", "loss_scal", "master_param")


class Float16AutocastWithoutGradScaler(Rule):
    """float16 training (under `autocast`, or of a model cast to float16) with no `GradScaler` in the file.

    ## What it does
    Finds `torch.autocast(..., dtype=torch.float16)` (also `torch.cuda.amp.autocast()` and
    `torch.autocast("cuda")`, whose default is float16) around code whose loop, or function, calls
    `backward()`, in a file that never creates or uses a gradient scaler; the autocast may be in a loss
    function of the file whose result a caller passes to `backward()` (`loss = loss_step(batch,
    mixed_precision=True)`, the autocast under `if mixed_precision:`). The device type may be a variable
    assigned in the file: `device = "cuda"`, `device = "cuda" if torch.cuda.is_available() else "cpu"` (it
    runs on CUDA wherever a GPU is there), or `device.type` with `device = torch.device(...)` of those.

    Finds pure float16 training too: a module cast to float16 (`model.half()`, `model.to(torch.float16)`,
    `model.to(dtype=torch.half)`, `model.type(torch.cuda.HalfTensor)`, `model = Net().cuda().half()`), cast to
    the dtype of a float16 value (`head = nn.Linear(...).to(clip_model.dtype)` with `clip_model` from OpenAI
    CLIP's `clip.load(name)`, float16 on CUDA, in the function or passed in by every caller), built by a
    function of the run whose every `return` gives a float16 module (`model = make_tower()`, which ends in
    `.half()`), or loaded in float16 (`model = AutoModelForCausalLM.from_pretrained(name,
    torch_dtype=torch.float16)`, `dtype=` too; not in a file that uses `peft`, whose adapters train in float32
    over the frozen float16 base) whose
    parameters an optimizer of the same function or script was built over, when that optimizer steps after
    the cast, next to a `backward()`: in the same place, or in a function (of the file or another file of
    the run) that is handed the optimizer (`train(loader, model, optimizer)` once per epoch).

    ## Why is this bad?
    float16 has a far smaller range than float32: small gradients underflow to zero and large ones overflow
    to `inf`. `torch.amp.GradScaler` multiplies the loss before `backward()` and divides the gradients before
    the step, skipping steps whose gradients overflowed. Without it, fp16 training silently loses
    gradients (the loss stalls) or diverges to `nan`.

    A model cast to float16 is worse off: its weights and their updates are float16 too, so an update
    smaller than about a thousandth of a weight rounds away to nothing, on top of the underflowing
    gradients. Mixed precision keeps float32 weights (autocast computes in float16) and scales the loss.

    The rule stays silent on bfloat16 (which has float32's range and needs no scaler), on float16 used for
    inference only (no `backward()`, no optimizer over the float16 model), on an unknown `dtype=` variable,
    on a device known to be `"cpu"` (CPU autocast defaults to bfloat16) or not known at all (a function
    argument, a setting), when anything in the file looks like a scaler, a loss scale, float32 master
    weights or a framework that scales for you (Accelerate, Fabric, DeepSpeed), and on a float16 model that
    the file casts back (`.float()`, `.to(torch.float32)`) anywhere, casts only after the training, or casts
    on a path that returns before it (`if args.evaluate: model.half(); validate(...); return`).

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
        self._by_scope: dict[int, list[ast.Assign]] | None = None  # scope -> the optimizers it builds

    def visit_withitem(self, node: ast.withitem) -> None:
        """``with autocast(...)``."""
        call = node.context_expr
        self._via = None
        if not isinstance(call, ast.Call) or not self._is_fp16_autocast(call):
            return
        if self._file_scales():
            return
        region = self.ctx.enclosing_loop(call) or self.ctx.scope(call)
        if isinstance(region, ast.Module):
            return
        what = "autocast runs in float16 in a loop that calls backward(), and no GradScaler scales the loss"
        if not _calls_backward(self.ctx, region):
            caller = self._backpropagating_caller(call, region)
            if caller is None:
                return
            what = (f"autocast runs in float16 in `{region.name}`, whose result `{caller}` passes to backward(), "  # type: ignore[attr-defined]
                    f"and no GradScaler scales the loss")
        if self._via is not None:
            what = (f"`{self._via}` can be \"cuda\", where autocast with no dtype runs in float16; this loop calls "
                    f"backward() and no GradScaler scales the loss")
        self.report(
            call,
            f"{what}: small gradients underflow to zero; use torch.amp.GradScaler, or dtype=torch.bfloat16",
        )

    def _backpropagating_caller(self, autocast: ast.Call, fn: ast.AST) -> str | None:
        """Where a loss function's float16 result is backpropagated: ``fn`` (a function of the file) computes
        under the autocast and returns, and a call of it in this file passes it on to ``backward()``
        (``loss = loss_step(batch, mixed_precision=True)``, then ``loss.backward()``), passing true for every
        parameter whose ``if`` guards the autocast. The caller's name, or None."""
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.ctx.enclosing_class(fn) is not None:
            return None
        if not any(isinstance(n, ast.Return) and n.value is not None for n in walk_own(fn.body)):
            return None
        guards = [p.test.id for p in self.ctx.ancestors(autocast)  # type: ignore[union-attr]
                  if isinstance(p, ast.If) and self.ctx.is_inside(p, fn) and isinstance(p.test, ast.Name)]
        for site in self.ctx.call_sites(fn):
            if not isinstance(site.func, ast.Name):
                continue
            if not all(is_const(argument(fn, g, site, default=True), True) for g in guards):
                continue
            outer = self.ctx.scope(site)
            parent = self.ctx.parent(site)
            if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
                name = parent.targets[0].id
                if any(method_call(n, "backward") and dotted(n.func.value) == name  # type: ignore[attr-defined]
                       for n in walk_own(outer.body if hasattr(outer, "body") else [])):  # type: ignore[attr-defined]
                    return getattr(outer, "name", "the script")
        return None

    def visit_Call(self, node: ast.Call) -> None:
        """``model.half()``, ``model.to(torch.float16)``, ``head.to(clip_model.dtype)``, ``model =
        build_half_model()``: a module whose weights are float16, then trained."""
        module = self._cast_to_fp16(node)
        how = "loaded in float16" if method_call(node, "from_pretrained") else "cast to float16"
        if module is not None:
            dtype = self._copied_dtype(node)
            if dtype is not None:
                how = f"cast to `{dtype}` (float16)"
        else:
            module = self._built_in_fp16(node)
            how = f"built in float16 by `{self.ctx.segment(node.func)}`"
        if module is None or self._file_scales() or self._cast_back(module):
            return
        optimizer = self._trained_by(module, node)
        if optimizer is None:
            return
        self.report(
            node,
            f"`{module}` is {how} and `{optimizer}` trains it with no GradScaler and no float32 master "
            f"weights: small gradients underflow to zero and small updates round away; keep the weights in "
            f"float32 and use torch.autocast(dtype=torch.float16) with torch.amp.GradScaler, or bfloat16",
        )

    def _copied_dtype(self, call: ast.Call) -> str | None:
        """The source text of a dtype copied from another value (``clip_model.dtype``), not a float16 literal."""
        for a in (*call.args, *(k.value for k in call.keywords)):
            if not self._is_fp16(a) and is_float16(self.ctx, a, call):
                return self.ctx.segment(a)
        return None

    def _built_in_fp16(self, call: ast.Call) -> str | None:
        """``model = build(cfg)`` (moved on or not, ``.cuda()``) where every ``return`` of the builder, in this
        file or another of the run, gives a float16 module (``return net.half()``): the name bound, or None."""
        if method_call(call, "half", "to", "type", "from_pretrained"):
            return None
        top = _chain_top(self.ctx, call)
        parent = self.ctx.parent(top)
        if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.value is top):
            return None
        if not self._optimizers(self.ctx.scope(call)):
            return None  # nothing here trains what the builder returns
        if isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda", "cpu", "train", "eval"):
            return None  # the chain's inner call answers
        target = parent.targets[0]
        if not isinstance(target, (ast.Name, ast.Attribute)) or not built_float16(self.ctx, call):
            return None
        return dotted(target) if self.ctx.is_module(target) else None

    def _cast_to_fp16(self, call: ast.Call) -> str | None:
        """The module ``call`` puts in float16 (``m.half()``, ``m.to(torch.float16)``, ``m.to(dtype=...)``,
        ``m.type(torch.cuda.HalfTensor)``, ``model = Net().cuda().half()``), or loads in float16
        (``model = AutoModel.from_pretrained(name, torch_dtype=torch.float16)``), or None."""
        func = call.func
        if not isinstance(func, ast.Attribute):
            return None
        if func.attr == "from_pretrained":
            return self._loaded_in_fp16(call)
        copied = False  # the dtype of another value: asked of the value model last, once the rest holds
        if func.attr in ("to", "type"):
            given = [*call.args, *(k.value for k in call.keywords if k.arg in ("dtype", None))]
            if not any(self._is_fp16(a) or self.ctx.qualname(a) in FP16 for a in given):
                if not any(_names_a_dtype(self.ctx, a, call) for a in given):
                    return None
                copied = True
        elif func.attr != "half" or call.args or call.keywords:
            return None
        receiver: ast.AST = func.value
        top = _chain_top(self.ctx, call)
        parent = self.ctx.parent(top)
        if isinstance(receiver, ast.Call) and isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            receiver = parent.targets[0]  # model = Net().half().cuda(): the chain's result is the module
        if not isinstance(receiver, (ast.Name, ast.Attribute)) or not self.ctx.is_module(receiver):
            return None
        module = dotted(receiver)
        if copied and (module is None or self._trained_by(module, call) is None or not any(
                is_float16(self.ctx, a, call) for a in given if _names_a_dtype(self.ctx, a, call))):
            return None
        return module

    def _loaded_in_fp16(self, call: ast.Call) -> str | None:
        """``model = X.from_pretrained(..., torch_dtype=torch.float16)`` (or ``dtype=``, or ``"float16"``), also
        moved on (``.to(device)``, ``.cuda()``): the name the float16 weights are bound to. Not with ``peft``
        in the file, whose adapters train in float32 over a frozen float16 base."""
        dtype = keyword(call, "torch_dtype") or keyword(call, "dtype")
        if dtype is None or not (self._is_fp16(dtype.value) or is_const(dtype.value, "float16")
                                 or is_const(dtype.value, "half")):
            return None
        if any(q.split(".", 1)[0] == "peft" for q in self.ctx.aliases.values()):
            return None
        node: ast.AST = call
        parent = self.ctx.parent(node)
        while isinstance(parent, ast.Attribute) and parent.attr in ("to", "cuda") and isinstance(
                self.ctx.parent(parent), ast.Call):
            node = self.ctx.parent(parent)  # type: ignore[assignment]
            parent = self.ctx.parent(node)
        if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.value is node):
            return None
        return dotted(parent.targets[0])

    def _cast_back(self, module: str) -> bool:
        """Whether the file casts ``module``, a part or a holder of it, to another dtype anywhere (``.float()``
        before training, or after: which runs first is not always clear, so stay silent)."""
        for call in self.ctx.nodes(ast.Call):
            if not isinstance(call.func, ast.Attribute):  # type: ignore[attr-defined]
                continue
            receiver = dotted(call.func.value)  # type: ignore[attr-defined]
            if receiver is None or not (under(receiver, module) or under(module, receiver)):
                continue
            if method_call(call, "float", "double", "bfloat16") or (method_call(call, "to", "type") and any(
                    self.ctx.qualname(a) in OUT_OF_FP16 for a in (*call.args, *(k.value for k in call.keywords)))):  # type: ignore[attr-defined]
                return True
        return False

    def _trained_by(self, module: str, cast: ast.Call) -> str | None:
        """The optimizer, built in the scope of ``cast`` over the parameters of ``module`` (a part or a holder
        of it), that steps after a backward there or in a function the scope calls after the cast."""
        scope = self.ctx.scope(cast)
        for node in self._optimizers(scope):
            name = dotted(node.targets[0])
            modules = functions(self.ctx).optimizer_modules(node.targets[0]) or set()
            if name is not None and any(under(m, module) or under(module, m) for m in modules) and \
                    self._steps_after(name, scope, cast):
                return name
        return None

    def _optimizers(self, scope: ast.AST) -> list[ast.Assign]:
        """``opt = torch.optim.X(...)`` statements of a scope (schedulers left out), indexed once per file."""
        if self._by_scope is None:
            self._by_scope = {}
            for node in self.ctx.nodes(ast.Assign):
                value = node.value  # type: ignore[attr-defined]
                q = self.ctx.qualname(value.func) or "" if isinstance(value, ast.Call) else ""
                if q.startswith("torch.optim.") and "lr_scheduler" not in q and len(node.targets) == 1:  # type: ignore[attr-defined]
                    self._by_scope.setdefault(id(self.ctx.scope(node)), []).append(node)  # type: ignore[arg-type]
        return self._by_scope.get(id(scope), [])

    def _steps_after(self, optimizer: str, scope: ast.AST, cast: ast.Call) -> bool:
        """Whether ``optimizer.step()`` runs after ``cast`` with a backward pass: in the scope itself, or in a
        function (of this file or another of the run) that a later call of the scope hands the optimizer."""
        end = self._path_end(cast, scope)
        later = [n for n in walk_own(ast.iter_child_nodes(scope))
                 if isinstance(n, ast.Call) and position(cast) < position(n) < end]
        if any(method_call(n, "step") and dotted(n.func.value) == optimizer for n in later) and \
                _calls_backward(self.ctx, scope):  # type: ignore[attr-defined]
            return True
        for call in later:
            for ctx, fn in callees(self.ctx, call):
                names = _parameters_given(ctx, fn, call, optimizer)
                if names and _calls_backward(ctx, fn) and any(
                        method_call(n, "step") and dotted(n.func.value) in names  # type: ignore[attr-defined]
                        for n in walk_own(ast.iter_child_nodes(fn))):
                    return True
        return False

    def _path_end(self, node: ast.AST, scope: ast.AST) -> tuple[int, int]:
        """Where the code after ``node`` stops: the first ``return`` or ``raise`` that follows it in its block or
        an enclosing one (``if args.evaluate: model.half(); validate(...); return``), else the end of the file."""
        end = (1 << 30, 0)
        child = node
        for parent in self.ctx.ancestors(node):
            if parent is scope:
                break
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(parent, field, None)
                if isinstance(block, list) and any(s is child for s in block):
                    stops = [position(s) for s in block if isinstance(s, (ast.Return, ast.Raise))
                             and position(s) > position(child)]
                    end = min([end, *stops])
            child = parent
        return end

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
        """A float16 dtype: ``torch.float16``, ``torch.half``, or a name bound once to one."""
        if (self.ctx.qualname(expr) or "") in FP16:
            return True
        if isinstance(expr, ast.Name):
            found = self.ctx.bindings_of(expr)
            if len(found) == 1 and found[0].kind == "assign" and found[0].value is not None and not found[0].unpacked:
                return (self.ctx.qualname(found[0].value) or "") in FP16
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


def _names_a_dtype(ctx: Context, expr: ast.AST, at: ast.AST) -> bool:
    """``x.dtype``, or a name last assigned one (``dtype = backbone.dtype``): worth asking the value model
    about (a device or a plain tensor is not)."""
    if isinstance(expr, ast.Name):
        found = ctx.reaching(expr, at)
        return bool(found) and all(b.kind == "assign" and b.value is not None and not b.unpacked
                                   and _names_a_dtype(ctx, b.value, b.stmt) for b in found)
    return isinstance(expr, ast.Attribute) and expr.attr == "dtype"


def _chain_top(ctx: Context, call: ast.Call) -> ast.AST:
    """The outermost call of a chain of methods that return the module: ``Net().half().cuda()`` from ``half()``."""
    node: ast.AST = call
    while True:
        parent = ctx.parent(node)
        outer = ctx.parent(parent) if isinstance(parent, ast.Attribute) else None
        if not (isinstance(parent, ast.Attribute) and parent.attr in ("to", "cuda", "cpu", "train", "eval",
                                                                     "requires_grad_")
                and isinstance(outer, ast.Call) and outer.func is parent):
            return node
        node = outer


def _parameters_given(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, name: str) -> list[str]:
    """The parameters of ``fn`` (in ``ctx``) to which ``call`` passes the variable ``name``."""
    method = is_bound_method(fn, ctx.parent(fn))
    out = []
    for param in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs):
        passed = argument(fn, param.arg, call, method=method)
        if passed is not None and dotted(passed) == name:
            out.append(param.arg)
    return out


def _calls_backward(ctx: Context, region: ast.AST) -> bool:
    """Whether code of ``region`` itself (not nested functions) runs a backward pass."""
    for node in walk_own(ast.iter_child_nodes(region)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "backward" and dotted(func.value) != "torch.autograd":
                return True
            if ctx.qualname(func) == "torch.autograd.backward":
                return True
    return False
