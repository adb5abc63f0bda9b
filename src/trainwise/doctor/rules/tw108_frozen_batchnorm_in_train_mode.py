"""TW108 frozen-batchnorm-in-train-mode: a frozen part with BatchNorm put back in train mode by ``model.train()``."""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context import dotted, is_const, keyword, last_name, method_call, position
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


class FrozenBatchnormInTrainMode(Rule):
    """A frozen backbone with BatchNorm layers put back in train mode by `model.train()`.

    ## What it does
    Finds `model.train()` in a training or epoch loop when part of `model` (or all of it) was frozen with
    `requires_grad = False` / `requires_grad_(False)` and the script knows that part has BatchNorm layers
    (a torchvision or timm CNN such as ResNet, EfficientNet or MobileNet, or a class of the file that builds
    `nn.BatchNorm*d`), with no `.eval()` of the frozen part later in the same loop body.

    ## Why is this bad?
    `requires_grad = False` stops the gradients, not the running statistics: in train mode every BatchNorm
    layer still normalises with the batch statistics and overwrites its `running_mean`/`running_var` with
    them. The "frozen" backbone drifts away from its pretrained statistics (badly so with small batches), and
    the model evaluates differently from how it was trained. Put the frozen part back in eval mode after each
    `model.train()`, or freeze with `trainwise.freeze(...)`, which keeps frozen norm layers in eval mode.

    The rule stays silent when the frozen part has no normalisation layers known to the script (a ConvNeXt
    or ViT uses LayerNorm; an unknown module might have none), when the frozen part is unknown, and when
    the loop calls `.eval()` on the frozen part, on its `.modules()`, or `model.apply(...)` after the
    `.train()`.

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

    def visit_Call(self, node: ast.Call) -> None:
        """``model.train()`` in a loop."""
        if not method_call(node, "train") or node.keywords or len(node.args) > 1:
            return
        if node.args and not is_const(node.args[0], True):
            return
        receiver = dotted(node.func.value)  # type: ignore[attr-defined]
        loop = self.ctx.enclosing_loop(node)
        if receiver is None or loop is None or not self.ctx.uses_torch() or self._overrides_train():
            return
        for part in self._frozen_parts(receiver, node):
            if self._has_bn(part, node) and not self._kept_in_eval(loop, node, receiver, part):
                self.report(
                    node,
                    f"`{receiver}.train()` puts the frozen `{part}` back in train mode: its BatchNorm layers keep "
                    f"updating their running statistics; call `.eval()` on the frozen part (or its BatchNorm "
                    f"modules) after `{receiver}.train()`, or freeze with trainwise.freeze",
                )
                return

    # -------------------------------------------------------------------------------------------- freezes
    def _all_freezes(self) -> list[tuple[str, ast.AST, bool]]:
        if self._freezes is None:
            self._freezes = []
            for node in self.ctx.nodes(ast.Assign):
                value = node.value  # type: ignore[attr-defined]
                if not isinstance(value, ast.Constant) or not isinstance(value.value, bool):
                    continue
                for target in node.targets:  # type: ignore[attr-defined]
                    if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                        module = self._param_owner(target.value, node)
                        if module is not None:
                            self._freezes.append((module, node, not value.value))
            for node in self.ctx.nodes(ast.Call):
                if method_call(node, "requires_grad_"):
                    flag = node.args[0] if node.args else getattr(keyword(node, "requires_grad"), "value", None)  # type: ignore[attr-defined]
                    if flag is None or isinstance(flag, ast.Constant):
                        target = node.func.value  # type: ignore[attr-defined]
                        module = self._param_owner(target, node) if isinstance(target, ast.Name) else None
                        if module is None and self.ctx.is_module(target):
                            module = dotted(target)
                        if module is not None:
                            self._freezes.append((module, node, is_const(flag, False)))
        return self._freezes

    def _param_owner(self, expr: ast.AST, at: ast.AST) -> str | None:
        """The module whose ``.parameters()`` the loop variable ``expr`` runs over."""
        if not isinstance(expr, ast.Name):
            return None
        for b in self.ctx.bindings_of(expr, at):
            if b.kind == "for" and self.ctx.is_inside(at, b.stmt) and method_call(b.iter, "parameters",
                                                                                    "named_parameters"):
                if b.iter.func.attr == "named_parameters" and b.index != 1:  # type: ignore[union-attr]
                    return None
                if b.iter.args or b.iter.keywords:  # type: ignore[union-attr]
                    return None
                return dotted(b.iter.func.value)  # type: ignore[union-attr]
        return None

    def _frozen_parts(self, receiver: str, call: ast.Call) -> list[str]:
        """Frozen modules inside ``receiver`` (as dotted paths from it), still frozen at the ``.train()``."""
        parts: list[str] = []
        scope = self.ctx.scope(call)
        cls = self._local_class_of(receiver, call)
        for module, stmt, frozen in self._all_freezes():
            if not frozen:
                continue
            path: str | None = None
            stmt_scope = self.ctx.scope(stmt)
            if stmt_scope is scope or isinstance(stmt_scope, ast.Module):
                if (module == receiver or module.startswith(receiver + ".")) and position(stmt) < position(call):
                    path = module
            elif cls is not None and isinstance(stmt_scope, ast.FunctionDef) and stmt_scope.name == "__init__" and (
                self.ctx.enclosing_class(stmt) is cls and (module == "self" or module.startswith("self."))
            ):
                path = receiver + module[len("self"):]
            if path is not None and not self._unfrozen(path, receiver) and path not in parts:
                parts.append(path)
        return parts

    def _unfrozen(self, path: str, receiver: str) -> bool:
        """Whether the part is unfrozen anywhere (gradual unfreezing: stay silent)."""
        for module, _stmt, frozen in self._all_freezes():
            if frozen:
                continue
            if module.startswith("self"):
                module = receiver + module[len("self"):]
            if path == module or path.startswith(module + "."):
                return True
        return False

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
        rebinds it to itself and does not count."""
        values = []
        for b in self.ctx.lookup(name.id, at):
            if b.kind != "assign" or b.unpacked or b.value is None:
                return None
            value = b.value
            while method_call(value, "to", "cuda", "cpu", "float"):
                value = value.func.value  # type: ignore[attr-defined]
            if not (isinstance(value, ast.Name) and value.id == name.id):
                values.append(value)
        return values[0] if len(values) == 1 else None

    # ------------------------------------------------------------------------------------ norm knowledge
    def _has_bn(self, path: str, at: ast.AST) -> bool:
        """Whether the script knows that the module at ``path`` holds BatchNorm (or tracking InstanceNorm)."""
        root, *attrs = path.split(".")
        value = self._value_of(ast.Name(id=root, ctx=ast.Load()), at)
        return value is not None and self._value_has_bn(value, attrs, at, 0)

    def _value_has_bn(self, value: ast.AST, attrs: list[str], at: ast.AST, depth: int) -> bool:
        if depth > 4 or not isinstance(value, ast.Call):
            return False
        q = self.ctx.qualname(value.func) or ""
        if q.startswith("torchvision.models."):
            ctor = q.rsplit(".", 1)[1]
            if not _TV_BN.fullmatch(ctor):
                return False
            if not attrs:
                return True
            return attrs[0] in _BN_CHILDREN.get(ctor[:3], _DEFAULT_CHILDREN)
        if q == "timm.create_model":
            arch = value.args[0] if value.args else getattr(keyword(value, "model_name"), "value", None)
            name = self.ctx.constant(arch) if arch is not None else ...
            if not isinstance(name, str):
                return False
            name = name.split("/")[-1].split(".")[0]
            return not attrs and bool(_TIMM_BN.fullmatch(name)) and "_gn" not in name and "resnetv2" not in name
        if q.startswith("torch.nn."):
            last = q.rsplit(".", 1)[1]
            if attrs:
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
                return self._class_has_bn(cls, attrs, depth)
            helpers = [fn for fn in self.ctx.functions_named(value.func.id) if self.ctx.enclosing_class(fn) is None]
            if len(helpers) == 1 and not attrs:  # make_layers(cfg): a builder of this file
                return self._builds_bn(helpers[0], depth)
        return False

    def _class_has_bn(self, cls: ast.ClassDef, attrs: list[str], depth: int) -> bool:
        init = next((fn for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name == "__init__"), None)
        if init is None:
            return False
        if not attrs:
            return self._builds_bn(cls, depth)
        for b in self.ctx.attr_bindings.get(f"self.{attrs[0]}", []):
            if (self.ctx.scope(b.stmt) is init and b.value is not None and not b.unpacked
                    and self._value_has_bn(b.value, attrs[1:], b.stmt, depth + 1)):
                return True
        return False

    def _builds_bn(self, container: ast.AST, depth: int) -> bool:
        """Whether code in ``container`` constructs BatchNorm (or a known BatchNorm model, or a class or
        builder of the file that does)."""
        return any(self._value_has_bn(call, [], call, depth + 1) for call in self.ctx.calls_within(container))

    # ------------------------------------------------------------------------------------------- silences
    def _kept_in_eval(self, loop: ast.AST, train: ast.Call, receiver: str, part: str) -> bool:
        """Whether the loop, after the ``.train()``, puts something back in eval mode (other than switching
        the whole receiver to eval for validation) or calls a helper that may do so."""
        after = [c for c in self.ctx.calls_within(loop) if position(c) > position(train)]
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
