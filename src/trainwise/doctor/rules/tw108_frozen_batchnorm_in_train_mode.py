"""TW108 frozen-batchnorm-in-train-mode: a frozen part with BatchNorm put back in train mode by ``model.train()``."""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context import (
    Binding,
    dotted,
    has_star_kwargs,
    is_const,
    keyword,
    last_name,
    method_call,
    position,
)
from trainwise.doctor.rule import Rule

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_BN = re.compile(r"(?:Sync)?BatchNorm(?:[123]d)?|LazyBatchNorm[123]d")
_IN = re.compile(r"(?:Lazy)?InstanceNorm[123]d")
# torchvision constructors of CNNs with BatchNorm, and their children that hold it (None: the whole model).
_TV_BN = re.compile(
    r"resnet\d+|resnext\d+_\w+|wide_resnet\d+_\d|densenet\d+|efficientnet_(?:b\d|v2_[sml])|mobilenet_v[23]\w*|"
    r"regnet_[xy]_\w+|vgg\d+_bn|inception_v3|googlenet|shufflenet_v2_\w+|mnasnet\w*"
)
_BN_CHILDREN = {
    "res": {"bn1", "layer1", "layer2", "layer3", "layer4"},
    "wid": {"bn1", "layer1", "layer2", "layer3", "layer4"},
    "reg": {"stem", "trunk_output"},
}
_DEFAULT_CHILDREN = {"features"}
# timm names of BatchNorm CNNs (resnetv2 and *_gn variants use GroupNorm, convnext LayerNorm: left out).
_TIMM_BN = re.compile(r"(?:resnet\d|resnext|seresne|densenet|efficientnet|tf_efficientnet|mobilenetv[23]|regnet|"
                      r"vgg\d+_bn)\w*")
_NORM_HELPER = re.compile(r"bn|batch_?norm|norm|freeze|frozen", re.IGNORECASE)
# Parameter names of a classification head: ``if "fc" not in name: p.requires_grad = False`` freezes the rest.
_HEAD_WORD = re.compile(r"fc\d*|classifier|heads?|linear\d*|last_linear|logits|out|output|cls|lm_head|"
                        r"(?:fc|head|classifier)_\w+")
_MAX_SITES = 32  # call sites followed from a function to its callers, at most
_RESNETS = ("res", "wid")  # ctor[:3] of torchvision ResNets: BatchNorm in conv1/bn1 and every layer


class FrozenBatchnormInTrainMode(Rule):
    """A frozen backbone with BatchNorm layers put back in train mode by `model.train()`.

    ## What it does
    Finds `model.train()` in a training or epoch loop, before a training loop (one that calls `backward()`),
    or in a function called from a loop (`train_one_epoch(model, ...)`, a trainer's `self.model.train()`),
    when part of `model` (or all of it) was frozen and the script knows that part has BatchNorm layers, with
    no `.eval()` of the frozen part after the `.train()`.

    A part counts as frozen after `part.requires_grad_(False)` (any submodule: `model.backbone`,
    `net.base`, `self.encoder` in `__init__`), `for p in part.parameters(): p.requires_grad = False`, the
    same through a helper of the file (`freeze(model.backbone)`, the tutorial's
    `set_parameter_requires_grad(model, feature_extract)` when the flag is a true constant), and
    `for name, p in model.named_parameters()` when the only conditions on `name` leave the head out
    (`if "fc" not in name`). The model may be built from the frozen part (`nn.Sequential(backbone, head)`,
    `Classifier(backbone)`), or the part passed in (`Classifier(resnet18(...))`, `Trainer(model)`).
    BatchNorm is known in torchvision and timm CNNs (ResNet, EfficientNet, MobileNet, DenseNet, `vgg*_bn`,
    also through `torch.hub.load("pytorch/vision", ...)`, their `features`/`layerN` and
    `list(resnet.children())[:-1]`) and in classes and builders of the file that build `nn.BatchNorm*d`.

    ## Why is this bad?
    `requires_grad = False` stops the gradients, not the running statistics: in train mode every BatchNorm
    layer still normalises with the batch statistics and overwrites its `running_mean`/`running_var` with
    them. The "frozen" backbone drifts away from its pretrained statistics (badly so with small batches), and
    the model evaluates differently from how it was trained. Put the frozen part back in eval mode after each
    `model.train()`, or freeze with `trainwise.freeze(...)`, which keeps frozen norm layers in eval mode.

    The rule stays silent when the frozen part has no normalisation layers known to the script (`vgg16`
    without `_bn`, a ConvNeXt or ViT with LayerNorm, a frozen `fc`, an unknown module), when what is frozen
    cannot be told (a freeze under a condition on a parameter's name other than "not the head", a freeze
    under `if flag:` whose flag is not a known true value, a freeze in a method that may not be called,
    children sliced past the BatchNorm ones), when the frozen part is unfrozen again (whole, or so far that
    what stays frozen has no BatchNorm: `efficientnet.requires_grad_(False)` then
    `efficientnet.features.requires_grad_(True)`), when a module class of the file overrides `train()`, and
    when, after the `.train()`, the loop or function calls `.eval()` on the frozen part or on its
    `.modules()`, `model.apply(...)`, or a helper that does. A `.train()` run once with no training after it
    is not reported.

    ## Example
    ```python
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights="DEFAULT")
    for p in model.parameters():
        p.requires_grad = False
    model.fc = torch.nn.Linear(2048, 10)
    optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01)

    for epoch in range(10):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    ```

    ## Use instead
    ```python
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights="DEFAULT")
    for p in model.parameters():
        p.requires_grad = False
    model.fc = torch.nn.Linear(2048, 10)
    optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01)

    for epoch in range(10):
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    ```
    Or freeze with `trainwise.freeze(model, "layer*")`, which keeps the frozen norm layers in eval mode.

    ## Fix safety
    There is no automatic fix: which modules to keep in eval mode (only the frozen BatchNorm layers, or
    the whole frozen part with its dropout) is a modelling choice.
    """

    code = "TW108"
    name = "frozen-batchnorm-in-train-mode"
    message = "model.train() puts the frozen BatchNorm layers back in train mode: their running statistics change"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._freezes: list[tuple[str, ast.AST, bool]] | None = None  # (dotted module, statement, frozen?)
        self._by_name: dict[str, list[ast.Call]] | None = None

    def visit_Call(self, node: ast.Call) -> None:
        """``model.train()`` in a loop, before a training loop, or in a function called from a loop."""
        if not method_call(node, "train") or node.keywords or len(node.args) > 1:
            return
        if node.args and not is_const(node.args[0], True):
            return
        receiver = dotted(node.func.value)  # type: ignore[attr-defined]
        if receiver is None or not self.ctx.uses_torch() or self._overrides_train():
            return
        if not any(frozen for _m, _s, frozen in self._all_freezes()):
            return
        loop = self.ctx.enclosing_loop(node)
        trains_after: bool | None = None if loop is None else True
        region = loop if loop is not None else self.ctx.scope(node)
        for path, at, called_in_loop in self._origins(receiver, node):
            parts = self._frozen_parts(path, at)
            if not parts:
                continue
            if loop is None and not called_in_loop:
                if trains_after is None:
                    trains_after = self._training_follows(node)
                if not trains_after:
                    continue
            for part in parts:
                local = receiver + part[len(path):] if _under(part, path) else part
                if (self._has_bn(part, at, self._unfrozen_below(part, path))
                        and not self._kept_in_eval(region, node, receiver, local)):
                    self.report(
                        node,
                        f"`{receiver}.train()` puts the frozen `{local}` back in train mode: its BatchNorm layers "
                        f"keep updating their running statistics; call `.eval()` on the frozen part (or its "
                        f"BatchNorm modules) after `{receiver}.train()`, or freeze with trainwise.freeze",
                    )
                    return

    # ----------------------------------------------------------------------------- where the model comes from
    def _origins(self, path: str, at: ast.AST, depth: int = 0) -> list[tuple[str, ast.AST, bool]]:
        """``(path, place, called in a loop)``: the module ``path`` at ``at`` and, when its root is a parameter
        of the enclosing function (``def train_one_epoch(model, ...)``) or an attribute that a class's
        ``__init__`` takes as an argument (``self.model = model``), the argument passed at each call site."""
        out = [(path, at, False)]
        fn = self.ctx.scope(at)
        if depth >= 2 or not isinstance(fn, _FUNCS):
            return out
        root, dot, rest = path.partition(".")
        if root == "self":
            cls = self.ctx.enclosing_class(fn)
            if not rest or cls is None or cls.name in self.ctx.module_classes:
                return out
            attr, dot, rest = rest.partition(".")
            init = _init_of(cls)
            found = [b for b in self.ctx.attr_bindings.get(f"self.{attr}", [])
                     if self.ctx.enclosing_class(b.stmt) is cls]
            if init is None or len(found) != 1 or self.ctx.scope(found[0].stmt) is not init:
                return out
            value = self._unwrap(found[0].value) if found[0].value is not None else None
            if not (isinstance(value, ast.Name) and _is_param(init, value.id)):
                return out
            fn, root, sites = init, value.id, self._constructions(cls)
        elif _is_param(fn, root):
            sites = self._call_sites(fn)  # type: ignore[arg-type]
        else:
            return out
        for call in sites[:_MAX_SITES]:
            arg = self._argument(fn, root, call)  # type: ignore[arg-type]
            target = dotted(arg) if arg is not None else None
            if target is not None:
                in_loop = self.ctx.enclosing_loop(call) is not None
                out.extend((p, a, lp or in_loop) for p, a, lp in self._origins(target + dot + rest, call, depth + 1))
        return out[:_MAX_SITES]

    def _constructions(self, cls: ast.ClassDef) -> list[ast.Call]:
        return [c for c in self._calls_by_name().get(cls.name, []) if isinstance(c.func, ast.Name)]

    def _call_sites(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """The calls of a same-file function by its name: ``f(...)`` (or ``utils.f(...)``) for a function,
        ``self.f(...)`` / ``obj.f(...)`` for a method; none when another function or method of the same kind
        has that name."""
        method = _is_method(fn, self.ctx.parent(fn))
        same_kind = [f for f in self.ctx.functions_named(fn.name) if _is_method(f, self.ctx.parent(f)) == method]
        if len(same_kind) != 1:
            return []
        calls = self._calls_by_name().get(fn.name, [])
        if method:
            return [c for c in calls if isinstance(c.func, ast.Attribute)]
        if any(_is_method(f, self.ctx.parent(f)) for f in self.ctx.functions_named(fn.name)):
            return [c for c in calls if isinstance(c.func, ast.Name)]
        return calls

    def _calls_by_name(self) -> dict[str, list[ast.Call]]:
        if self._by_name is None:
            self._by_name = {}
            for call in self.ctx.nodes(ast.Call):
                name = last_name(call.func)  # type: ignore[attr-defined]
                if name is not None:
                    self._by_name.setdefault(name, []).append(call)  # type: ignore[arg-type]
        return self._by_name

    def _argument(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call,
                  default: bool = False) -> ast.expr | None:
        """The expression a call passes for parameter ``name`` of ``fn`` (its default value when ``default``),
        or None when unknown (``*args``, ``**kwargs``)."""
        kw = keyword(call, name)
        if kw is not None:
            return kw.value
        args = fn.args
        positional = [a.arg for a in (*args.posonlyargs, *args.args)]
        if name in positional:
            offset = 1 if _is_method(fn, self.ctx.parent(fn)) else 0
            index = positional.index(name) - offset
            if index < 0 or any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
                return None
            if index < len(call.args):
                return call.args[index]
            if not default or has_star_kwargs(call):
                return None
            first_default = len(positional) - len(args.defaults)
            at = positional.index(name)
            return args.defaults[at - first_default] if at >= first_default else None
        for arg, value in zip(args.kwonlyargs, args.kw_defaults):
            if arg.arg == name and default and not has_star_kwargs(call):
                return value
        return None

    # -------------------------------------------------------------------------------------------- freezes
    def _all_freezes(self) -> list[tuple[str, ast.AST, bool]]:
        if self._freezes is None:
            raw: list[tuple[str, ast.AST, bool]] = []
            for node in self.ctx.nodes(ast.Assign):
                value = node.value  # type: ignore[attr-defined]
                if not isinstance(value, ast.Constant) or not isinstance(value.value, bool):
                    continue
                for target in node.targets:  # type: ignore[attr-defined]
                    if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                        loop = self._param_loop(target.value, node)
                        if loop is not None and (value.value or self._freezes_all(loop, node)):
                            raw.append((dotted(loop.iter.func.value), node, not value.value))  # type: ignore[arg-type, union-attr]
            for node in self.ctx.nodes(ast.Call):
                if method_call(node, "requires_grad_"):
                    flag = node.args[0] if node.args else getattr(keyword(node, "requires_grad"), "value", None)  # type: ignore[attr-defined]
                    if flag is None or isinstance(flag, ast.Constant):
                        frozen = is_const(flag, False)
                        target = node.func.value  # type: ignore[attr-defined]
                        loop = self._param_loop(target, node)
                        if loop is not None:
                            if frozen and not self._freezes_all(loop, node):
                                continue
                            module = dotted(loop.iter.func.value)  # type: ignore[union-attr]
                        else:
                            module = dotted(target)  # whether it holds BatchNorm decides, not its name
                        if module is not None:
                            raw.append((module, node, frozen))
            self._freezes = list(raw)
            for module, stmt, frozen in raw:
                self._freezes.extend(self._through_helper(module, stmt, frozen))
        return self._freezes

    def _param_loop(self, expr: ast.AST, at: ast.AST) -> Binding | None:
        """The ``for p in module.parameters()`` (or ``named_parameters()``) loop that binds ``expr``."""
        if not isinstance(expr, ast.Name):
            return None
        for b in self.ctx.bindings_of(expr, at):
            if b.kind == "for" and self.ctx.is_inside(at, b.stmt) and method_call(b.iter, "parameters",
                                                                                    "named_parameters"):
                if b.iter.func.attr == "named_parameters" and b.index != 1:  # type: ignore[union-attr]
                    return None
                if b.iter.args or b.iter.keywords or dotted(b.iter.func.value) is None:  # type: ignore[union-attr]
                    return None
                return b
        return None

    def _freezes_all(self, loop: Binding, at: ast.AST) -> bool:
        """Whether a freeze in ``for name, p in m.named_parameters()`` freezes all of ``m``, but perhaps its
        head: every condition on ``name`` keeps only head parameters (fc, classifier, head) out. A condition
        on anything else (``"bn" not in name``, ``"layer4" in name``) leaves the frozen part unknown."""
        stmt = loop.stmt
        target = getattr(stmt, "target", None)
        if not (isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name)):
            return True
        var = target.elts[0].id
        for node in ast.walk(stmt):
            if not isinstance(node, (ast.If, ast.IfExp)) or not _mentions(node.test, var):
                continue
            if self.ctx.is_inside(at, node):
                in_body = any(self.ctx.is_inside(at, s) for s in _as_list(node.body))
                if not _head_test(node.test, var, excluding=in_body):
                    return False
            elif (isinstance(node, ast.If) and any(isinstance(n, (ast.Continue, ast.Break)) for s in node.body
                                                    for n in ast.walk(s))
                  and not _head_test(node.test, var, excluding=False)):
                return False  # `if "fc" in name: continue` skips the head; any other skip: unknown
        return True

    def _through_helper(self, module: str, stmt: ast.AST, frozen: bool) -> list[tuple[str, ast.AST, bool]]:
        """A freeze of a parameter of a same-file helper (``def freeze(m): m.requires_grad_(False)``, the
        tutorial's ``set_parameter_requires_grad(model, feature_extracting)``), as a freeze of the argument at
        each call. A freeze under ``if flag:`` counts only where the call passes a true constant for ``flag``."""
        fn = self.ctx.scope(stmt)
        root, dot, rest = module.partition(".")
        if not isinstance(fn, _FUNCS) or root in ("self", "cls") or not _is_param(fn, root):
            return []
        flags = self._flag_conditions(stmt, fn)
        if flags is None and frozen:
            return []
        out = []
        for call in self._call_sites(fn)[:_MAX_SITES]:
            arg = self._argument(fn, root, call)
            target = dotted(arg) if arg is not None else None
            if target is None:
                continue
            if frozen and not all(self._truthy(fn, name, call) is wanted for name, wanted in flags or ()):
                continue
            out.append((target + dot + rest, call, frozen))
        return out

    def _flag_conditions(self, stmt: ast.AST, fn: ast.AST) -> list[tuple[str, bool]] | None:
        """The ``if flag:`` / ``if not flag:`` tests on parameters of ``fn`` around ``stmt``; None when a test
        on a parameter has another shape."""
        out = []
        child = stmt
        for parent in self.ctx.ancestors(stmt):
            if parent is fn:
                return out
            if isinstance(parent, ast.If) and any(_is_param(fn, n.id) for n in ast.walk(parent.test)  # type: ignore[arg-type]
                                                  if isinstance(n, ast.Name)):
                wanted = any(child is s for s in parent.body)
                test = parent.test
                if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                    test, wanted = test.operand, not wanted
                if not isinstance(test, ast.Name):
                    return None
                out.append((test.id, wanted))
            child = parent
        return out

    def _truthy(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call) -> bool | None:
        arg = self._argument(fn, name, call, default=True)
        value = self.ctx.constant(arg) if arg is not None else ...
        return None if value is ... else bool(value)

    def _frozen_parts(self, receiver: str, call: ast.AST) -> list[str]:
        """Frozen modules inside ``receiver`` (as dotted paths from it, or modules that ``receiver`` is built
        from: ``nn.Sequential(backbone, head)``), still frozen at the ``.train()``."""
        parts: list[str] = []
        scope = self.ctx.scope(call)
        cls = self._local_class_of(receiver, call)
        members = self._members(receiver, call)
        own_cls = self.ctx.enclosing_class(call) if receiver.startswith("self.") else None
        for module, stmt, frozen in self._all_freezes():
            if not frozen:
                continue
            path: str | None = None
            stmt_scope = self.ctx.scope(stmt)
            root = module.split(".", 1)[0]
            if stmt_scope is scope or isinstance(stmt_scope, ast.Module):
                if position(stmt) < position(call) and (_under(module, receiver) or root in members) and (
                    stmt_scope is scope or self._global(root, call)
                ):
                    path = module
            elif isinstance(stmt_scope, ast.FunctionDef) and stmt_scope.name == "__init__":
                owner = self.ctx.enclosing_class(stmt)
                flags = self._flag_conditions(stmt, stmt_scope)
                if cls is not None and owner is cls and _under(module, "self") and flags is not None:
                    ctor = self._value_of(ast.Name(id=receiver, ctx=ast.Load()), call)
                    if isinstance(ctor, ast.Call) and all(self._truthy(stmt_scope, name, ctor) is wanted  # type: ignore[arg-type]
                           for name, wanted in flags):  # `if freeze_backbone:` and Net(freeze_backbone=True)
                        path = receiver + module[len("self"):]
                elif own_cls is not None and owner is own_cls and _under(module, receiver) and flags == []:
                    path = module  # a trainer class: self.model.backbone frozen in its __init__
            if path is not None and not self._unfrozen(path, receiver) and path not in parts:
                parts.append(path)
        return parts

    def _global(self, name: str, at: ast.AST) -> bool:
        """Whether ``name`` at ``at`` is the module-level variable (not a local or parameter of the same name)."""
        found = self.ctx.lookup(name, at)
        return bool(found) and all(isinstance(self.ctx.scope(b.stmt), ast.Module) for b in found)

    def _members(self, receiver: str, at: ast.AST) -> set[str]:
        """Names a model is built from: ``nn.Sequential(backbone, head)``, ``Net(backbone)``."""
        if "." in receiver:
            return set()
        value = self._value_of(ast.Name(id=receiver, ctx=ast.Load()), at)
        if not isinstance(value, ast.Call):
            return set()
        q = self.ctx.qualname(value.func) or ""
        local = isinstance(value.func, ast.Name) and value.func.id in self.ctx.module_classes
        if q not in ("torch.nn.Sequential", "torch.nn.ModuleList") and not local:
            return set()
        items = [a.value if isinstance(a, ast.Starred) else a for a in value.args] + [k.value for k in value.keywords]
        items = [e for a in items for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
        return {a.id for a in items if isinstance(a, ast.Name)}

    def _unfreezes(self, receiver: str) -> list[str]:
        out = []
        for module, stmt, frozen in self._all_freezes():
            if not frozen:
                if _under(module, "self") and not _under(receiver, "self"):
                    module = receiver + module[len("self"):]
                out.append(self._iterated(module, stmt) or module)
        return out

    def _iterated(self, module: str, at: ast.AST) -> str | None:
        """``X`` for a loop variable over ``X.modules()`` / ``X.children()``: unfreezing some of them (the
        BatchNorm layers, on purpose) counts as unfreezing ``X``, so the rule stays silent."""
        if "." in module:
            return None
        for b in self.ctx.lookup(module, at):
            if b.kind != "for":
                continue
            if (method_call(b.iter, "modules", "children") and not b.unpacked) or (
                method_call(b.iter, "named_modules", "named_children") and b.index == 1
            ):
                return dotted(b.iter.func.value)  # type: ignore[union-attr]
        return None

    def _unfrozen(self, path: str, receiver: str) -> bool:
        """Whether the part is unfrozen anywhere (gradual unfreezing: stay silent)."""
        return any(_under(path, module) for module in self._unfreezes(receiver))

    def _unfrozen_below(self, path: str, receiver: str) -> set[str]:
        """Children of the frozen part that are unfrozen again (``model.requires_grad_(False)`` then
        ``model.classifier.requires_grad_(True)``)."""
        return {m[len(path) + 1:].split(".")[0] for m in self._unfreezes(receiver) if m.startswith(path + ".")}

    def _local_class_of(self, receiver: str, at: ast.AST) -> ast.ClassDef | None:
        if "." in receiver:
            return None
        value = self._value_of(ast.Name(id=receiver, ctx=ast.Load()), at)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return self._class_named(value.func.id, at)
        return None

    def _class_named(self, name: str, at: ast.AST) -> ast.ClassDef | None:
        for b in self.ctx.lookup(name, at):
            if b.kind == "def" and isinstance(b.stmt, ast.ClassDef):
                return b.stmt
        return None

    def _value_of(self, name: ast.Name, at: ast.AST) -> ast.AST | None:
        """The one value a name is built from: ``model = resnet50(...).to(device)``; ``model = model.cuda()``
        and ``model = torch.compile(model)`` rebind it to itself and do not count, and the same construction
        repeated (a notebook cell run again, copied further down) counts once."""
        values: dict[str, ast.AST] = {}
        for b in self.ctx.lookup(name.id, at):
            if b.kind != "assign" or b.unpacked or b.value is None:
                return None
            value = self._unwrap(b.value)
            if not (isinstance(value, ast.Name) and value.id == name.id):
                values.setdefault(ast.dump(value), value)
        return next(iter(values.values())) if len(values) == 1 else None

    def _self_value(self, cls: ast.ClassDef, attr: str) -> ast.AST | None:
        """The one value ``self.<attr>`` is built from in the methods of ``cls``."""
        values = []
        for b in self.ctx.attr_bindings.get(f"self.{attr}", []):
            if self.ctx.enclosing_class(b.stmt) is not cls:
                continue
            if b.kind != "assign" or b.unpacked or b.value is None:
                return None
            value = self._unwrap(b.value)
            if dotted(value) != f"self.{attr}":
                values.append(value)
        return values[0] if len(values) == 1 else None

    def _unwrap(self, value: ast.expr) -> ast.expr:
        while True:
            if method_call(value, "to", "cuda", "cpu", "float"):
                value = value.func.value  # type: ignore[attr-defined]
            elif (isinstance(value, ast.Call) and len(value.args) == 1 and not isinstance(value.args[0], ast.Starred)
                  and self.ctx.qualname(value.func) == "torch.compile"):
                value = value.args[0]
            else:
                return value

    # ------------------------------------------------------------------------------------ norm knowledge
    def _has_bn(self, path: str, at: ast.AST, excluded: set[str] | frozenset[str] = frozenset()) -> bool:
        """Whether the script knows that the module at ``path`` holds BatchNorm (or tracking InstanceNorm)
        outside its ``excluded`` children."""
        root, *attrs = path.split(".")
        value: ast.AST | None
        if root == "self":
            cls = self.ctx.enclosing_class(at)
            if cls is None or not attrs:
                return False
            if cls.name in self.ctx.module_classes:
                return self._class_has_bn(cls, attrs, 0, None, excluded)
            value, attrs = self._self_value(cls, attrs[0]), attrs[1:]
            init = _init_of(cls)
            if isinstance(value, ast.Name) and init is not None and _is_param(init, value.id):
                args = [(self._argument(init, value.id, c), c) for c in self._constructions(cls)[:_MAX_SITES]]
                return any(a is not None and self._value_has_bn(a, attrs, c, 1, excluded) for a, c in args)
        else:
            value = self._value_of(ast.Name(id=root, ctx=ast.Load()), at)
        return value is not None and self._value_has_bn(value, attrs, at, 0, excluded)

    def _value_has_bn(self, value: ast.AST, attrs: list[str], at: ast.AST, depth: int,
                      excluded: set[str] | frozenset[str] = frozenset()) -> bool:
        if depth > 4:
            return False
        if isinstance(value, ast.Name):
            inner = self._value_of(value, at)
            return inner is not None and self._value_has_bn(inner, attrs, at, depth + 1, excluded)
        if isinstance(value, ast.Subscript):
            return not attrs and not excluded and self._children_slice_has_bn(value, at, depth)
        if isinstance(value, ast.Attribute):  # features = models.vgg16_bn(weights=...).features
            return self._value_has_bn(value.value, [value.attr, *attrs], at, depth + 1, excluded)
        if not isinstance(value, ast.Call):
            return False
        q = self.ctx.qualname(value.func) or ""
        ctor = None
        if q.startswith("torchvision.models."):
            ctor = q.rsplit(".", 1)[1]
        elif q == "torch.hub.load" and len(value.args) >= 2:
            repo, entry = self.ctx.constant(value.args[0]), self.ctx.constant(value.args[1])
            if isinstance(repo, str) and repo.split(":")[0] == "pytorch/vision" and isinstance(entry, str):
                ctor = entry
        if ctor is not None:
            if not _TV_BN.fullmatch(ctor):
                return False
            children = _BN_CHILDREN.get(ctor[:3], _DEFAULT_CHILDREN)
            if not attrs:
                return not excluded or bool(children - excluded)
            return attrs[0] in children and not excluded
        if q == "timm.create_model":
            arch = value.args[0] if value.args else getattr(keyword(value, "model_name"), "value", None)
            name = self.ctx.constant(arch) if arch is not None else ...
            if not isinstance(name, str):
                return False
            name = name.split("/")[-1].split(".")[0]
            return (not attrs and bool(_TIMM_BN.fullmatch(name)) and "_gn" not in name and "resnetv2" not in name
                    and all(_HEAD_WORD.fullmatch(e) for e in excluded))
        if q.startswith("torch.nn."):
            last = q.rsplit(".", 1)[1]
            if attrs or excluded:
                return False
            if _BN.fullmatch(last):
                return True
            if _IN.fullmatch(last):
                return is_const(getattr(keyword(value, "track_running_stats"), "value", None), True)
            if last in ("Sequential", "ModuleList"):
                items = [a.value if isinstance(a, ast.Starred) else a for a in value.args]
                items = [e for a in items for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
                return any(self._value_has_bn(a, [], at, depth + 1) for a in items)
            return False
        if isinstance(value.func, ast.Name):
            cls = self._class_named(value.func.id, at)
            if cls is not None:
                return self._class_has_bn(cls, attrs, depth, value, excluded)
            helpers = [fn for fn in self.ctx.functions_named(value.func.id) if self.ctx.enclosing_class(fn) is None]
            if len(helpers) == 1 and not attrs and not excluded:  # make_layers(cfg): a builder of this file
                return self._builds_bn(helpers[0], depth)
        return False

    def _children_slice_has_bn(self, expr: ast.Subscript, at: ast.AST, depth: int) -> bool:
        """``list(resnet.children())[:-1]``: the first children of a torchvision CNN with BatchNorm (its stem
        for a ResNet, ``features`` for the others) are kept."""
        sl = expr.slice
        if not isinstance(sl, ast.Slice) or sl.step is not None or not (sl.lower is None or is_const(sl.lower, 0)):
            return False
        inner = expr.value
        if isinstance(inner, ast.Name):
            inner = self._value_of(inner, at)  # type: ignore[assignment]
        if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in ("list", "tuple")
                and len(inner.args) == 1):
            inner = inner.args[0]
        if not method_call(inner, "children") or inner.args or not isinstance(inner.func.value, ast.Name):  # type: ignore[attr-defined]
            return False
        upper = sl.upper
        stop = (-upper.operand.value if isinstance(upper, ast.UnaryOp) and isinstance(upper.op, ast.USub)  # type: ignore[attr-defined]
                and isinstance(upper.operand, ast.Constant) else getattr(upper, "value", None))
        if not isinstance(stop, int) or isinstance(stop, bool):
            return False
        source = self._value_of(inner.func.value, at)  # type: ignore[attr-defined]
        q = self.ctx.qualname(source.func) if isinstance(source, ast.Call) else None
        if q is None or not q.startswith("torchvision.models.") or not _TV_BN.fullmatch(q.rsplit(".", 1)[1]):
            return False
        if q.rsplit(".", 1)[1][:3] in _RESNETS:
            return -8 <= stop <= -1 or stop >= 2
        return stop == -1 or stop >= 1

    def _class_has_bn(self, cls: ast.ClassDef, attrs: list[str], depth: int, ctor: ast.Call | None = None,
                      excluded: set[str] | frozenset[str] = frozenset()) -> bool:
        init = _init_of(cls)
        if init is None:
            return False
        if not attrs:
            names = {b.split(".", 1)[1] for b in self.ctx.attr_bindings if b.startswith("self.") and b.count(".") == 1
                     and any(self.ctx.scope(x.stmt) is init for x in self.ctx.attr_bindings[b])}
            if excluded:  # the class's parts, but those unfrozen again
                return any(self._class_has_bn(cls, [n], depth, ctor) for n in sorted(names - excluded))
            return self._builds_bn(cls, depth) or (
                ctor is not None and any(self._class_has_bn(cls, [n], depth, ctor) for n in sorted(names))
            )
        for b in self.ctx.attr_bindings.get(f"self.{attrs[0]}", []):
            if self.ctx.scope(b.stmt) is not init or b.value is None or b.unpacked:
                continue
            value: ast.AST | None = b.value
            where: ast.AST = b.stmt
            if isinstance(value, ast.Name) and _is_param(init, value.id):
                if ctor is None:
                    continue
                value, where = self._argument(init, value.id, ctor), ctor  # Classifier(resnet18(...), 10)
            if value is not None and self._value_has_bn(value, attrs[1:], where, depth + 1, excluded):
                return True
        return False

    def _builds_bn(self, container: ast.AST, depth: int) -> bool:
        """Whether code in ``container`` constructs BatchNorm (or a known BatchNorm model, or a class or
        builder of the file that does)."""
        return any(self._value_has_bn(call, [], call, depth + 1) for call in self.ctx.calls_within(container))

    # ------------------------------------------------------------------------------------------- silences
    def _training_follows(self, train: ast.Call) -> bool:
        """Whether a training loop (one that calls ``backward()`` or ``optimizer.step()``, itself or in a
        helper) comes after the ``.train()`` in the same function or module."""
        scope = self.ctx.scope(train)
        for tp in (ast.For, ast.AsyncFor, ast.While):
            for loop in self.ctx.nodes(tp):
                if (position(loop) > position(train) and self.ctx.scope(loop) is scope
                        and self.ctx.reaches_call(loop, self._updates, depth=2)):
                    return True
        return False

    def _updates(self, call: ast.Call) -> bool:
        if method_call(call, "backward"):
            return True
        return method_call(call, "step") and self.ctx.is_optimizer(call.func.value)  # type: ignore[attr-defined]

    def _kept_in_eval(self, region: ast.AST, train: ast.Call, receiver: str, part: str) -> bool:
        """Whether the loop (or function), after the ``.train()``, puts something back in eval mode (other
        than switching the whole receiver to eval for validation) or calls a helper that may do so."""
        after = [c for c in self.ctx.calls_within(region) if position(c) > position(train)]
        for call in after:
            func = call.func
            if method_call(call, "eval"):
                target = dotted(func.value)  # type: ignore[attr-defined]
                if target is None:
                    return True  # unknown: stay silent
                if target == receiver:
                    continue  # the whole model switched to eval for validation
                outside = target.startswith(receiver + ".") and not (
                    target == part or target.startswith(part + ".") or part.startswith(target + ".")
                )
                if not outside:  # the frozen part, a part of it, or anything else (a .modules() loop variable)
                    return True
                continue
            if method_call(call, "train") and call.args and is_const(call.args[0], False):
                return dotted(func.value) != receiver  # type: ignore[attr-defined]
            if method_call(call, "apply"):
                return True
            name = last_name(func)
            if name is not None and _NORM_HELPER.search(name):
                return True
            if isinstance(func, ast.Name) and any(
                self._partial_eval(c) for fn in self.ctx.functions_named(func.id) for c in self.ctx.calls_within(fn)
            ):
                return True
        return False

    def _partial_eval(self, call: ast.Call) -> bool:
        """In a helper: ``.apply(...)``, or ``.eval()`` of a submodule or of a loop variable (``m.eval()`` over
        ``.modules()``); a plain ``model.eval()`` (an evaluation helper) does not count."""
        if method_call(call, "apply"):
            return True
        if not method_call(call, "eval"):
            return False
        target = call.func.value  # type: ignore[attr-defined]
        if isinstance(target, ast.Attribute):
            return True
        return isinstance(target, ast.Name) and any(b.kind == "for" for b in self.ctx.bindings_of(target))

    def _overrides_train(self) -> bool:
        """A module class of the file overrides ``train()`` (typically to keep frozen norm layers in eval)."""
        for fn in self.ctx.functions_named("train"):
            cls = self.ctx.enclosing_class(fn)
            if cls is not None and cls.name in self.ctx.module_classes:
                return True
        return False


def _under(path: str, prefix: str) -> bool:
    """Whether the dotted ``path`` is ``prefix`` or inside it."""
    return path == prefix or path.startswith(prefix + ".")


def _init_of(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((fn for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name == "__init__"), None)


def _is_param(fn: ast.AST, name: str) -> bool:
    args = getattr(fn, "args", None)
    if not isinstance(args, ast.arguments):
        return False
    return any(a.arg == name for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _is_method(fn: ast.AST, parent: ast.AST | None) -> bool:
    """A method bound to its instance (its first parameter is ``self``), not a static method."""
    if not isinstance(parent, ast.ClassDef):
        return False
    return not any(last_name(d) == "staticmethod" for d in getattr(fn, "decorator_list", ()))


def _mentions(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _as_list(body: object) -> list[ast.AST]:
    return body if isinstance(body, list) else [body]  # type: ignore[list-item, return-value]


def _head_name(text: object) -> bool:
    """``"fc"``, ``"fc."``, ``"classifier.1.weight"``: the name of a classification head's parameters."""
    if not isinstance(text, str):
        return False
    parts = [p for p in text.split(".") if p]
    return bool(parts) and bool(_HEAD_WORD.fullmatch(parts[0])) and all(
        p.isdigit() or p in ("weight", "bias") or _HEAD_WORD.fullmatch(p) for p in parts[1:]
    )


def _head_strings(node: ast.AST) -> bool:
    """A head name, or a tuple/list of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_head_strings(e) for e in node.elts)
    return isinstance(node, ast.Constant) and _head_name(node.value)


def _head_test(test: ast.AST, var: str, *, excluding: bool) -> bool:
    """Whether ``test`` on the parameter name ``var`` is true exactly for head parameters (``excluding``
    false: ``"fc" in name``, ``name.startswith("classifier")``) or exactly for the others (``excluding``:
    ``"fc" not in name``, ``not name.startswith("head")``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _head_test(test.operand, var, excluding=not excluding)
    if isinstance(test, ast.BoolOp):
        combined = ast.And if excluding else ast.Or
        return isinstance(test.op, combined) and all(_head_test(v, var, excluding=excluding) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        positive, negative = ((ast.In, ast.Eq), (ast.NotIn, ast.NotEq))
        if isinstance(left, ast.Name) and left.id == var:
            other = right
            if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                return False  # name in some_string: not a membership of names
        elif isinstance(right, ast.Name) and right.id == var:
            other = left
        else:
            return False
        wanted = negative if excluding else positive
        return isinstance(op, wanted) and _head_strings(other)
    if isinstance(test, ast.Call) and not excluding and isinstance(test.func, ast.Attribute):
        func = test.func
        if func.attr == "startswith" and isinstance(func.value, ast.Name) and func.value.id == var:
            return len(test.args) == 1 and _head_strings(test.args[0])
    return False
