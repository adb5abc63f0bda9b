"""TW117 exported-in-train-mode: a model trained in the same function or script, exported with no ``eval()``."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, is_const, keyword, position
from trainwise.doctor.context.functions import callees, functions, is_eval_call, reaches_call
from trainwise.doctor.context.modules import Norms
from trainwise.doctor.project import torch_requirements
from trainwise.doctor.rule import Rule

_EXPORTS = {
    "torch.jit.trace": "torch.jit.trace",
    "torch.jit.trace_module": "torch.jit.trace_module",
    "torch.jit.script": "torch.jit.script",
    "torch.export.export": "torch.export.export",
    "torch.export": "torch.export",
    "torch.onnx.export": "torch.onnx.export",
}
_DYNAMO_ONNX_SINCE = (0, 2, 9)  # torch.onnx.export uses the torch.export-based exporter, in the model's own mode
# Calls that may take the model and leave its mode as it was.
_HARMLESS = frozenset({"print", "len", "id", "type", "isinstance", "repr", "str", "torch.save", "count_parameters"})


class ExportedInTrainMode(Rule):
    """A model trained in the same function or script, then traced or exported without `model.eval()`.

    ## What it does
    Finds `torch.jit.trace(model, ...)`, `torch.jit.script(model)`, `torch.export.export(model, ...)` and
    `torch.onnx.export(model, ...)` of a model that the same function (or script) trained before, with
    `model.train()` or a loop that calls it and runs `backward()` and an optimizer `step()`, or built
    there with BatchNorm (a pretrained torchvision CNN), and never put in evaluation mode in between
    (`model.eval()`, `model.train(False)`). `torch.onnx.export` counts when
    it uses the torch.export-based exporter (`dynamo=True`, the default since torch 2.9 when the project
    declares it), which exports the model in its current mode; the older exporter switches to eval itself.

    ## Why is this bad?
    Tracing and export record the model as it runs at that moment. In train mode, dropout stays in the
    graph and drops activations at inference, and BatchNorm normalises each batch with its own statistics
    (and updates the running ones) instead of using the learned running averages: the exported model gives
    different, batch-dependent and noisy answers from the one that was validated. A scripted model keeps
    `training=True` when saved, so whoever loads it runs it in train mode unless they know to call
    `.eval()`. Nothing fails. `trainwise lab export-mode` measures the difference; `trainwise.export`
    always exports in eval mode and checks the artifact, so it cannot make this mistake (there is no
    run-time guard for this code).

    The rule stays silent on an export after `model.eval()` (or `model.train(False)`, or of
    `model.eval()` itself), on `trainwise.export`, on a model that is only loaded in the script, on one
    built there and never trained unless the script shows that it holds BatchNorm (a torchvision or timm
    CNN such as `models.resnet18(weights=...)`, its children in an `nn.Sequential`, a class of the run
    built with `nn.BatchNorm2d`: a new module is in train mode, so the trace records batch statistics;
    `torch.jit.script` of such a model is left alone, the scripted model follows a later `eval()`), on a
    model handed between training and export to a function the doctor cannot
    see (it may call `eval()`), on the legacy ONNX exporter (`dynamo=False`), and when it cannot tell
    whether the model is the one trained.

    ## Example
    ```python
    import torch

    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    traced = torch.jit.trace(model, torch.randn(1, 3, 32, 32))
    traced.save("model.pt")
    ```

    ## Use instead
    ```python
    import torch

    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    model.eval()
    traced = torch.jit.trace(model, torch.randn(1, 3, 32, 32))
    traced.save("model.pt")
    ```

    ## Fix safety
    There is no automatic fix: the doctor cannot tell whether the training goes on after the export (then
    the model must go back to `train()`); add `model.eval()` before the export, or use `trainwise.export`.
    """

    code = "TW117"
    name = "exported-in-train-mode"
    message = "a model trained here is exported in train mode: call model.eval() before the export"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._dynamo_default: bool | None = None

    def visit_Call(self, node: ast.Call) -> None:
        """An export or trace of a plain model name (``model``, ``self.model``)."""
        what = _EXPORTS.get(self.ctx.qualname(node.func) or "")
        if what is None or not node.args:
            return
        model = dotted(node.args[0])
        if model is None or model == "self":
            return
        if what == "torch.onnx.export" and not self._onnx_in_model_mode(node):
            return
        scope = self.ctx.scope(node)
        at = position(node)
        trained = self._trained_at(scope, model, at)
        how = "put in train mode" if isinstance(trained, ast.Call) else "trained"
        if trained is None and what != "torch.jit.script":  # a scripted model follows a later eval()
            trained, how = self._built_with_batchnorm(scope, model, node), "built with BatchNorm"
        if trained is None or self._leaves_train_mode(scope, model, trained, node):
            return
        if what == "torch.jit.script":
            effect = ("the scripted model keeps training=True, so whoever loads it runs dropout and BatchNorm's batch "
                      "statistics unless they call eval()")
        else:
            effect = (f"`{what}` records dropout as active and BatchNorm using batch statistics, so the exported "
                      f"model answers differently from the one validated")
        self.report(
            node,
            f"`{model}` was {how} above (line {trained.lineno}) and is still in train mode here: {effect}; call "
            f"`{model}.eval()` before the export (or use trainwise.export)",
        )

    def _onnx_in_model_mode(self, call: ast.Call) -> bool:
        """The torch.export-based ONNX exporter (exports the model in its current mode)."""
        training = keyword(call, "training")
        if training is not None:
            return False  # the legacy option says which mode explicitly
        dynamo = keyword(call, "dynamo")
        if dynamo is not None:
            return is_const(dynamo.value, True)
        if self._dynamo_default is None:
            found = torch_requirements(self.ctx.path)
            versioned = [r for r in (found[1] if found else ()) if r.versioned]
            self._dynamo_default = bool(versioned) and not any(r.admits_below(_DYNAMO_ONNX_SINCE) for r in versioned)
        return self._dynamo_default

    def _trained_at(self, scope: ast.AST, model: str, at: tuple[int, int]) -> ast.AST | None:
        """The first place before ``at`` in ``scope`` where ``model`` trains: ``model.train()`` or a loop that
        calls it (or passes it on) and trains (backward, optimizer step)."""
        summaries = functions(self.ctx)
        for node in self._own_nodes(scope):
            if position(node) >= at:
                continue
            if isinstance(node, ast.Call) and _is_mode_call(node, model, True):
                return node
            if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and self._uses_model(node, model) \
                    and summaries.trains(node):
                return node
        return None

    def _built_with_batchnorm(self, scope: ast.AST, model: str, export: ast.Call) -> ast.AST | None:
        """The statement of ``scope`` that built ``model`` (a plain name assigned a call), when the script
        knows that it holds BatchNorm (a torchvision or timm CNN, its children, a class of the run) and nothing
        in the scope before the export puts any module in eval mode: a new module is in train mode."""
        if "." in model:
            return None
        at = position(export)
        built = None
        for node in self._own_nodes(scope):
            if position(node) >= at:
                break
            if isinstance(node, ast.Call) and _may_set_eval(node):
                return None  # model.eval() on the network it was cut from, or on anything: leave it
            if isinstance(node, ast.Assign) and any(dotted(t) == model for t in node.targets):
                built = node if isinstance(node.value, ast.Call) else None
        if built is None or not self.ctx.analysis(Norms).has_bn(model, export):
            return None
        return built

    def _uses_model(self, loop: ast.AST, model: str) -> bool:
        for node in ast.walk(loop):
            if isinstance(node, ast.Call) and (dotted(node.func) == model or any(
                    dotted(a) == model for a in node.args)):
                return True
        return False

    def _leaves_train_mode(self, scope: ast.AST, model: str, trained: ast.AST, export: ast.Call) -> bool:
        """Whether, between the training and the export, the model may be put in eval mode: ``.eval()``,
        ``.train(False)``, a rebinding of the name, or the model handed to a call (it may call ``eval()``)."""
        start, end = position(trained), position(export)
        for node in self._own_nodes(scope):
            if not start <= position(node) < end and not self.ctx.is_inside(node, trained):
                continue
            if isinstance(node, ast.Call):
                if node is export:
                    continue
                if _is_mode_call(node, model, False):
                    return True
                q = self.ctx.qualname(node.func) or dotted(node.func) or ""
                if q not in _HARMLESS and any(dotted(a.value if isinstance(a, ast.Starred) else a) == model
                                              for a in [*node.args, *(k.value for k in node.keywords)]) \
                        and self._may_call_eval(node):
                    return True
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node is not trained:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(dotted(t) == model for t in targets):
                    return True
        return False

    def _may_call_eval(self, call: ast.Call) -> bool:
        """A call the model is handed to: unless every function it may call is of the run and never puts
        anything in eval mode (``train_one_epoch(model, ...)``), it may leave the model in eval."""
        found = callees(self.ctx, call)
        if not found:
            return True
        return any(reaches_call(ctx, fn, _may_set_eval) for ctx, fn in found)

    def _own_nodes(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes of a scope, nested functions and classes left out."""
        out: list[ast.AST] = []
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            out.append(node)
            stack.extend(ast.iter_child_nodes(node))
        out.sort(key=position)
        return out


def _may_set_eval(call: ast.Call) -> bool:
    """``x.eval()``, ``x.train(False)`` or ``x.train(flag)``."""
    if is_eval_call(call):
        return True
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "train" and bool(call.args or call.keywords) \
        and not is_const((call.args or [k.value for k in call.keywords])[0], True)


def _is_mode_call(call: ast.Call, model: str, train: bool) -> bool:
    """``model.train()`` (``train=True``) or ``model.eval()``/``model.train(False)`` (``train=False``), also
    chained (``model.to(device).eval()``)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    receiver = func.value
    while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
            and receiver.func.attr in ("to", "cuda", "cpu", "float", "half", "double"):
        receiver = receiver.func.value
    if dotted(receiver) != model:
        return False
    if func.attr == "eval":
        return not train
    if func.attr != "train":
        return False
    flag = call.args[0] if call.args else (call.keywords[0].value if call.keywords else None)
    if flag is None:
        return train
    if is_const(flag, True):
        return train
    if is_const(flag, False):
        return not train
    return not train  # train(mode) with a variable: may be eval
