"""TW108 frozen-batchnorm-in-train-mode: a frozen part with BatchNorm put back in train mode by ``model.train()``."""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context import (
    Binding,
    Context,
    argument,
    dotted,
    init_of,
    is_bound_method,
    is_const,
    is_param,
    keyword,
    last_name,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.checkpoints import WRAPPERS
from trainwise.doctor.context.modules import HEAD_WORD, Norms
from trainwise.doctor.functions import functions, value_at_call
from trainwise.doctor.rule import Rule

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NORM_HELPER = re.compile(r"bn|batch_?norm|norm|freeze|frozen", re.IGNORECASE)
_MAX_SITES = 32  # call sites followed from a function to its callers, at most
_LIGHTNING_MODULES = frozenset({
    "lightning.LightningModule", "lightning.pytorch.LightningModule", "lightning.pytorch.core.LightningModule",
    "lightning.pytorch.core.module.LightningModule", "pytorch_lightning.LightningModule",
    "pytorch_lightning.core.LightningModule", "pytorch_lightning.core.module.LightningModule",
})
_LIGHTNING_TRAINERS = frozenset({
    "lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.Trainer", "pytorch_lightning.trainer.Trainer",
    "pytorch_lightning.trainer.trainer.Trainer",
})
# Hugging Face trainers: their training_step calls model.train() at every step (transformers, trl).
_HF_TRAINER = re.compile(r"(?:transformers|trl)(?:\.\w+)*\.(?:\w*Seq2Seq|SFT|DPO|Reward|PPO|GRPO|KTO|ORPO|CPO)?Trainer")
# Lightning hooks that run once before training: a freeze there holds for the whole fit.
_BEFORE_TRAINING = frozenset({"__init__", "setup", "configure_model", "configure_sharded_model", "on_fit_start",
                              "on_train_start", "configure_optimizers"})
# Names that say the norm statistics keep training on purpose (``train_bn``, ``update_norm_stats``).
_DELIBERATE = re.compile(r"(?:train|update|adapt|tune)_?(?:bn|norms?|batch_?norms?|running)\w*|"
                         r"(?:bn|norms?)_?(?:train|update|adapt|momentum)\w*", re.IGNORECASE)


class FrozenBatchnormInTrainMode(Rule):
    """A frozen backbone with BatchNorm layers put back in train mode by `model.train()`.

    ## What it does
    Finds `model.train()` in a training or epoch loop, before a training loop (one that calls `backward()`),
    or in a function called from a loop (`train_one_epoch(model, ...)`, a trainer's `self.model.train()`),
    when part of `model` (or all of it) was frozen and the script knows that part has BatchNorm layers, with
    no `.eval()` of the frozen part after the `.train()`. The function may be in another file of the run:
    `fit_one_epoch(model_train, ...)` in `train.py` calling `model_train.train()` in `utils/utils_fit.py`
    (and training there, or called once per epoch) is reported at the call, naming the `.train()` line and
    the line that freezes. A `.train()` that puts back a saved mode (`was_training = model.training`, then
    `model.train(was_training)` or `if was_training: model.train()`) restores the caller's mode and is not
    reported.

    A framework's own `train()` counts too. A `LightningModule` with a `training_step` that freezes part of
    itself before training (in `__init__`, `setup`, `configure_optimizers`, or a method they call) is trained in
    train mode (a module starts in it, and Lightning before 2.2 calls `.train()` after every validation):
    reported at the freeze, naming `training_step`; a freeze under a configuration switch (`if
    cfg.freeze_backbone:`, `if self.hparams.freeze:`) counts, and the message names the switch. A model frozen
    outside and handed to Lightning (`trainer.fit(model)`) or to the Hugging Face `Trainer`
    (`Trainer(model=model).train()`, whose `training_step` calls `model.train()` at every step, so an `.eval()`
    before `trainer.train()` does not hold) is reported at the call, naming the freeze. An `accelerate` loop
    calls `model.train()` itself.

    A part counts as frozen after `part.requires_grad_(False)` (any submodule: `model.backbone`,
    `net.base`, `self.encoder` in `__init__`), `for p in part.parameters(): p.requires_grad = False`, the
    same through a helper of the file (`freeze(model.backbone)`, the tutorial's
    `set_parameter_requires_grad(model, feature_extract)` when the flag is a true constant), and
    `for name, p in model.named_parameters()` when the only conditions on `name` leave the head out
    (`if "fc" not in name`). The model may be built from the frozen part (`nn.Sequential(backbone, head)`,
    `Classifier(backbone)`), or the part passed in (`Classifier(resnet18(...))`, `Trainer(model)`).
    BatchNorm is known in torchvision and timm CNNs (ResNet, EfficientNet, MobileNet, DenseNet, `vgg*_bn`,
    also through `torch.hub.load("pytorch/vision", ...)`, their `features`/`layerN` and
    `list(resnet.children())[:-1]`) and in classes and builders that build `nn.BatchNorm*d`, of the file or of
    another file of the run (`YoloBody` imported from `nets/yolo.py`, whose backbone class builds them). A
    model wrapped in `nn.DataParallel(model)` (or DDP, `torch.compile`) holds what `model` holds.

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
    is not reported, nor a helper of another file that switches to train mode for one forward and back to eval
    (Monte Carlo dropout) without training. With a framework, the rule stays silent when the LightningModule (or
    a base class of it in the run) calls `.eval()` on the frozen part in any method (`on_train_epoch_start`;
    in `__init__` it holds since Lightning 2.2, which keeps the modes of submodules) or Lightning's `freeze()`,
    overrides `train()`, names a deliberate choice (`train_bn`, `train_norm_stats`, `track_running_stats`),
    has a base class from outside the run (its hooks are unknown), has no `training_step`, or freezes under a
    condition; and for a Hugging Face trainer subclass with its own `training_step` or `compute_loss`.

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
        self._frozen_at: dict[str, ast.AST] = {}  # frozen part -> the statement that freezes it
        self._any_frozen: bool | None = None

    def visit_Call(self, node: ast.Call) -> None:
        """``model.train()`` in a loop, before a training loop, or in a function called from a loop; a call
        of a function of another file that puts the model it is given in train mode."""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("fit", "train") and self._through_framework(node):
            return
        if not (isinstance(func, ast.Attribute) and func.attr == "train"):
            self._through_other_file(node)
            return
        if not _sets_train(node) or self.ctx.restores_mode(node):
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
                if (self.ctx.analysis(Norms).has_bn(part, at, self._unfrozen_below(part, path))
                        and not _kept_in_eval(self.ctx, region, node, receiver, local)):
                    self.report(
                        node,
                        f"`{receiver}.train()` puts the frozen `{local}` back in train mode: its BatchNorm layers "
                        f"keep updating their running statistics; call `.eval()` on the frozen part (or its "
                        f"BatchNorm modules) after `{receiver}.train()`, or freeze with trainwise.freeze",
                    )
                    return

    def _freezes_something(self) -> bool:
        if self._any_frozen is None:
            self._any_frozen = self.ctx.uses_torch() and any(frozen for _m, _s, frozen in self._all_freezes())
        return self._any_frozen

    def _through_other_file(self, call: ast.Call) -> None:
        """``fit_one_epoch(model, ...)`` where ``fit_one_epoch``, in another file of the run, calls
        ``model_train.train()`` on the parameter it passes (and trains, or is called once per epoch), after a
        freeze of part of ``model`` that holds BatchNorm: reported at the call, naming both places."""
        program = self.ctx.program
        if program is None or len(program.paths) < 2 or not self._freezes_something():
            return
        found = program.callee(self.ctx, call) if not self._overrides_train() else None
        if found is None:
            return
        callee, fn = found
        for train, param, rest in _train_calls_on_parameters(callee, fn):
            arg = argument(fn, param, call, method=is_bound_method(fn, callee.parent(fn)))
            receiver = dotted(arg) if arg is not None else None
            trains = functions(callee).trains(fn)
            if receiver is None or (not trains and (self.ctx.enclosing_loop(call) is None
                                                    or _restores(callee, fn, train, param + rest))):
                continue  # a helper that switches to train mode for one forward and back (MC dropout)
            receiver += rest
            for part in self._frozen_parts(receiver, call):
                there = param + rest + part[len(receiver):] if _under(part, receiver) else part
                if (not self.ctx.analysis(Norms).has_bn(part, call, self._unfrozen_below(part, receiver))
                        or _kept_in_eval(callee, fn, train, param + rest, there)):
                    continue
                freeze = self._frozen_at[part]
                where = program.where(callee, train)
                self.report(
                    call,
                    f"`{fn.name}()` calls `{param + rest}.train()` ({where}), which puts the frozen `{part}` (line "
                    f"{freeze.lineno}) back in train mode: its BatchNorm layers keep updating their running "  # type: ignore[attr-defined]
                    f"statistics; call `.eval()` on the frozen part (or its BatchNorm modules) after that "
                    f"`.train()`, or freeze with trainwise.freeze",
                    related=(program.place(callee, train, f"`{param + rest}.train()` puts the frozen `{part}` "
                                                          f"back in train mode"),
                             program.place(self.ctx, freeze, f"`{part}` is frozen here")),
                )
                return

    # ------------------------------------------------------------------------ a framework's implicit train()
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """A LightningModule with ``training_step`` that freezes part of itself before training (``__init__``,
        ``setup``, ``configure_optimizers``, or a method they call): Lightning trains it in train mode (a module
        starts in train mode; Lightning before 2.2 also calls ``.train()`` after every validation), so the frozen
        BatchNorm layers update their statistics unless some method puts the part in eval."""
        if not self._freezes_something() or self._overrides_train():
            return
        chain = lightning_chain(self.ctx, node)
        if chain is None:
            return
        methods = [(c, f) for c, cls in chain for f in cls.body if isinstance(f, _FUNCS)]
        steps = [(c, f) for c, f in methods if f.name == "training_step"]
        if not steps or any(f.name == "train" for _c, f in methods) or _deliberate(chain):
            return
        for module, stmt, frozen in self._all_freezes():
            if (not frozen or not module.startswith("self.") or self.ctx.enclosing_class(stmt) is not node
                    or not self._before_training(node, stmt) or self._unfrozen(module, "self")):
                continue
            if not self.ctx.analysis(Norms).has_bn(module, stmt, self._unfrozen_below(module, "self")):
                continue
            if any(_puts_in_eval(c, f, module, 0) for c, f in methods):
                continue
            program = self.ctx.program
            step_ctx, step = steps[0]
            related = () if program is None else (
                program.place(step_ctx, step, f"Lightning runs `training_step` with `{node.name}` in train mode"),)
            switch = _switch_around(self.ctx, stmt)
            when = "" if switch is None else f" (with `{switch}` set)"
            self.report(
                stmt,
                f"`{module}` is frozen{when}, but Lightning trains `{node.name}` in train mode and nothing puts "
                f"`{module}` in eval: its BatchNorm layers keep updating their running statistics; call "
                f"`{module}.eval()` in `on_train_epoch_start`, or freeze with trainwise.freeze",
                related=related,
            )

    def _before_training(self, cls: ast.ClassDef, stmt: ast.AST) -> bool:
        """Whether a freeze runs, unconditionally, in a hook that runs before training, or in a method of the
        class that such a hook calls unconditionally (``self._freeze_backbone()`` in ``__init__``)."""
        fn = self.ctx.scope(stmt)
        if not isinstance(fn, _FUNCS) or not _unconditional(self.ctx, stmt, fn):
            return False
        if fn.name in _BEFORE_TRAINING:
            return True
        if self.ctx.parent(fn) is not cls:
            return False
        for call in self.ctx.calls_named(fn.name):
            hook = self.ctx.scope(call)
            if (isinstance(call.func, ast.Attribute) and dotted(call.func.value) == "self"
                    and isinstance(hook, _FUNCS) and hook.name in _BEFORE_TRAINING
                    and self.ctx.parent(hook) is cls and _unconditional(self.ctx, call, hook)):
                return True
        return False

    def _through_framework(self, call: ast.Call) -> bool:
        """``trainer.fit(model)`` of Lightning, ``Trainer(model=model).train()`` of Hugging Face: the framework
        calls ``model.train()`` (Hugging Face at every step), after a freeze of a part of ``model`` that holds
        BatchNorm. Returns whether the call is such a framework call."""
        func = call.func
        trainer = func.value  # type: ignore[attr-defined]
        ctor = trainer if isinstance(trainer, ast.Call) else (
            self.ctx.value_of(trainer, call) if isinstance(trainer, ast.Name) else None)
        if not isinstance(ctor, ast.Call):
            return False
        kind = self._trainer_kind(ctor, call)
        if kind == "lightning" and func.attr == "fit":  # type: ignore[attr-defined]
            model = call.args[0] if call.args else getattr(keyword(call, "model"), "value", None)
        elif kind == "hf" and func.attr == "train":  # type: ignore[attr-defined]
            model = ctor.args[0] if ctor.args else getattr(keyword(ctor, "model"), "value", None)
        else:
            return False
        receiver = dotted(model) if model is not None else None
        if (receiver is None or not self.ctx.uses_torch() or self._overrides_train()
                or not self._freezes_something()):
            return True
        scope = self.ctx.scope(call)
        for path, at, _in_loop in self._origins(receiver, call):
            for part in self._frozen_parts(path, at):
                freeze = self._frozen_at[part]
                if kind == "lightning" and lightning_chain(self.ctx, self.ctx.enclosing_class(freeze)) is not None:
                    continue  # frozen inside a LightningModule: reported at the freeze (visit_ClassDef)
                local = receiver + part[len(path):] if _under(part, path) else part
                if not self.ctx.analysis(Norms).has_bn(part, at, self._unfrozen_below(part, path)):
                    continue
                if self._class_keeps_eval(path, at, part[len(path) + 1:] if _under(part, path) else None):
                    continue
                if kind == "lightning":
                    kept = (_puts_in_eval(self.ctx, scope, local, 0, outer=receiver)
                            or _kept_in_eval(self.ctx, scope, call, receiver, local))
                    what = f"`{dotted(func) or 'Trainer(...).fit'}({receiver})` trains `{receiver}` in train mode"
                else:
                    kept = _kept_in_eval(self.ctx, scope, call, receiver, local)
                    what = f"the Hugging Face trainer calls `{receiver}.train()` at every training step"
                if kept:
                    continue
                self.report(
                    call,
                    f"{what}, which puts the frozen `{local}` (line {freeze.lineno}) back in train mode: its "  # type: ignore[attr-defined]
                    f"BatchNorm layers keep updating their running statistics; override `train()` in the model "
                    f"to keep the frozen part in eval, or freeze with trainwise.freeze",
                    related=() if self.ctx.program is None else (
                        self.ctx.program.place(self.ctx, freeze, f"`{local}` is frozen here"),),
                )
                return True
        return True

    def _trainer_kind(self, ctor: ast.Call, at: ast.AST) -> str | None:
        """``"lightning"`` for a Lightning ``Trainer(...)``, ``"hf"`` for a Hugging Face trainer (or a class of
        the file deriving from one without its own ``training_step``), else None."""
        q = self.ctx.qualname(ctor.func) or ""
        if q in _LIGHTNING_TRAINERS:
            return "lightning"
        if _HF_TRAINER.fullmatch(q):
            return "hf"
        if isinstance(ctor.func, ast.Name):
            cls = self.ctx.class_named(ctor.func.id, at)
            if (cls is not None and any(_HF_TRAINER.fullmatch(self.ctx.qualname(b) or "") for b in cls.bases)
                    and not any(isinstance(f, _FUNCS) and f.name in ("training_step", "compute_loss")
                                for f in cls.body)):
                return "hf"
        return None

    def _class_keeps_eval(self, receiver: str, at: ast.AST, part: str | None) -> bool:
        """Whether the class of ``receiver`` (of this file or another of the run) overrides ``train()``, puts
        the frozen part in eval in one of its methods, or keeps its norm statistics training on purpose."""
        if "." in receiver:
            return False
        value = self.ctx.value_of(ast.Name(id=receiver, ctx=ast.Load()), at)
        if not isinstance(value, ast.Call):
            return False
        found: tuple[Context, ast.ClassDef] | None = None
        if isinstance(value.func, ast.Name) and (local := self.ctx.class_named(value.func.id, at)) is not None:
            found = (self.ctx, local)
        elif self.ctx.program is not None:
            found = self.ctx.program.class_of(self.ctx, value.func)
        if found is None:
            return False
        ctx, cls = found
        chain = lightning_chain(ctx, cls) or [(ctx, cls)]
        methods = [(c, f) for c, k in chain for f in k.body if isinstance(f, _FUNCS)]
        if any(f.name == "train" for _c, f in methods) or _deliberate(chain):
            return True
        return part is not None and any(_puts_in_eval(c, f, "self." + part, 0) for c, f in methods)

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
            init = init_of(cls)
            found = [b for b in self.ctx.attr_bindings.get(f"self.{attr}", [])
                     if self.ctx.enclosing_class(b.stmt) is cls]
            if init is None or len(found) != 1 or self.ctx.scope(found[0].stmt) is not init:
                return out
            value = self.ctx.strip_moves(found[0].value) if found[0].value is not None else None
            if not (isinstance(value, ast.Name) and is_param(init, value.id)):
                return out
            fn, root, sites = init, value.id, self.ctx.constructions(cls)
        elif is_param(fn, root):
            sites = self.ctx.calls_of(fn)  # type: ignore[arg-type]
        else:
            return out
        for call in sites[:_MAX_SITES]:
            arg = self._argument(fn, root, call)  # type: ignore[arg-type]
            target = dotted(arg) if arg is not None else None
            if target is not None:
                in_loop = self.ctx.enclosing_loop(call) is not None
                out.extend((p, a, lp or in_loop) for p, a, lp in self._origins(target + dot + rest, call, depth + 1))
        return out[:_MAX_SITES]

    def _argument(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call,
                  default: bool = False) -> ast.expr | None:
        """The expression a call passes for parameter ``name`` of a same-file ``fn`` (its default value with
        ``default``), or None when unknown (``*args``, ``**kwargs``)."""
        return argument(fn, name, call, method=is_bound_method(fn, self.ctx.parent(fn)), default=default)

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
        if not isinstance(fn, _FUNCS) or root in ("self", "cls") or not is_param(fn, root):
            return []
        flags = functions(self.ctx).flag_conditions(stmt, fn)
        if flags is None and frozen:
            return []
        out = []
        for call in self.ctx.calls_of(fn)[:_MAX_SITES]:
            arg = self._argument(fn, root, call)
            target = dotted(arg) if arg is not None else None
            if target is None:
                continue
            if frozen and not all(_truthy(self.ctx, fn, name, call) is wanted for name, wanted in flags or ()):
                continue
            out.append((target + dot + rest, call, frozen))
        return out

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
                flags = functions(self.ctx).flag_conditions(stmt, stmt_scope)
                if cls is not None and owner is cls and _under(module, "self") and flags is not None:
                    ctor = self.ctx.value_of(ast.Name(id=receiver, ctx=ast.Load()), call)
                    if isinstance(ctor, ast.Call) and all(_truthy(self.ctx, stmt_scope, name, ctor) is wanted  # type: ignore[arg-type]
                           for name, wanted in flags):  # `if freeze_backbone:` and Net(freeze_backbone=True)
                        path = receiver + module[len("self"):]
                elif own_cls is not None and owner is own_cls and _under(module, receiver) and flags == []:
                    path = module  # a trainer class: self.model.backbone frozen in its __init__
            if path is not None and not self._unfrozen(path, receiver) and path not in parts:
                parts.append(path)
                self._frozen_at.setdefault(path, stmt)
        return parts

    def _global(self, name: str, at: ast.AST) -> bool:
        """Whether ``name`` at ``at`` is the module-level variable (not a local or parameter of the same name)."""
        found = self.ctx.lookup(name, at)
        return bool(found) and all(isinstance(self.ctx.scope(b.stmt), ast.Module) for b in found)

    def _members(self, receiver: str, at: ast.AST) -> set[str]:
        """Names a model is built from, whatever value it holds at ``at``: ``nn.Sequential(backbone, head)``,
        ``Net(backbone)``, ``nn.DataParallel(model)``, ``model.train()`` (``model_train = model.train()``, then
        ``model_train = nn.DataParallel(model)`` under ``if cuda:``)."""
        if "." in receiver:
            return set()
        found: set[str] | None = None
        for b in self.ctx.lookup(receiver, at):
            if b.kind != "assign" or b.unpacked or b.value is None:
                return set()
            value = _unchain(self.ctx.strip_moves(b.value))
            if isinstance(value, ast.Name):
                if value.id == receiver:
                    continue  # model_train = model_train.cuda()
                names = {value.id}
            elif isinstance(value, ast.Call):
                names = self._built_from(value)
            else:
                return set()
            found = names if found is None else found & names
        return found or set()

    def _built_from(self, value: ast.Call) -> set[str]:
        q = self.ctx.qualname(value.func) or ""
        if q in WRAPPERS and value.args and isinstance(value.args[0], ast.Name):
            return {value.args[0].id}
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
        value = self.ctx.value_of(ast.Name(id=receiver, ctx=ast.Load()), at)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return self.ctx.class_named(value.func.id, at)
        return None

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

    def _overrides_train(self) -> bool:
        """A module class of the file overrides ``train()`` (typically to keep frozen norm layers in eval)."""
        for fn in self.ctx.functions_named("train"):
            cls = self.ctx.enclosing_class(fn)
            if cls is not None and cls.name in self.ctx.module_classes:
                return True
        return False


def lightning_chain(ctx: Context, cls: ast.ClassDef | None,
                    depth: int = 0) -> list[tuple[Context, ast.ClassDef]] | None:
    """``cls`` and its ancestors up to the one deriving from ``LightningModule`` (of this file or another of
    the run), each with its file's context; None when ``cls`` is no LightningModule or a base is unknown (a
    class from outside the run may have hooks of its own)."""
    if cls is None or depth > 4:
        return None
    found: list[tuple[Context, ast.ClassDef]] | None = None
    for base in cls.bases:
        q = ctx.qualname(base)
        if q in _LIGHTNING_MODULES:
            found = found or [(ctx, cls)]
            continue
        local = ctx.class_named(base.id, cls) if isinstance(base, ast.Name) else None
        other = (ctx, local) if local is not None else (
            ctx.program.class_of(ctx, base) if ctx.program is not None else None)
        sub = lightning_chain(other[0], other[1], depth + 1) if other is not None else None
        if sub is None:
            if q is not None and q.split(".", 1)[0] in ("abc", "typing"):
                continue
            return None
        found = [(ctx, cls), *sub]
    return found


def _deliberate(chain: list[tuple[Context, ast.ClassDef]]) -> bool:
    """Whether the classes name a choice to keep the norm statistics training (``train_bn``,
    ``update_norm_stats``), or set ``track_running_stats``/``momentum`` on their layers."""
    for _ctx, cls in chain:
        for n in ast.walk(cls):
            word = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else (
                n.arg if isinstance(n, ast.arg) else None)
            if word is not None and (_DELIBERATE.fullmatch(word) or word == "track_running_stats"):
                return True
    return False


def _unconditional(ctx: Context, stmt: ast.AST, fn: ast.AST) -> bool:
    """Whether ``stmt`` runs every time ``fn`` does for some configuration: no ``if``, ``while`` or ``try``
    around it, but the tests of a loop over parameters on their names (already judged by the freeze, ``if "fc"
    not in name``) and configuration switches (``if cfg.freeze_backbone:``, ``if not self.hparams.finetune:``):
    with the switch set, the freeze holds for the whole fit."""
    loop_names: set[str] = set()
    chain = []
    for parent in ctx.ancestors(stmt):
        if parent is fn:
            break
        chain.append(parent)
    for parent in reversed(chain):
        if isinstance(parent, (ast.For, ast.AsyncFor)):
            loop_names |= {n.id for n in ast.walk(parent.target) if isinstance(n, ast.Name)}
        elif isinstance(parent, (ast.If, ast.IfExp)):
            if not any(isinstance(n, ast.Name) and n.id in loop_names for n in ast.walk(parent.test)) \
                    and switch_of(parent.test) is None:
                return False
        elif isinstance(parent, (ast.While, ast.Try, ast.ExceptHandler, ast.Match)):
            return False
    return True


def _switch_around(ctx: Context, stmt: ast.AST) -> str | None:
    """The configuration switch of an ``if`` around ``stmt`` in its function (not a test on a loop variable)."""
    loops = {n.id for p in ctx.ancestors(stmt) if isinstance(p, (ast.For, ast.AsyncFor))
             for n in ast.walk(p.target) if isinstance(n, ast.Name)}
    for parent in ctx.ancestors(stmt):
        if isinstance(parent, _FUNCS):
            return None
        switch = switch_of(parent.test) if isinstance(parent, ast.If) else None
        if switch is not None and switch.split(".", 1)[0] not in loops:
            return switch
    return None


def switch_of(test: ast.AST) -> str | None:
    """The configuration switch an ``if`` tests (``cfg.freeze_backbone``, ``not self.hparams.finetune``,
    ``args.mode == "linear"``): a name or attribute chain, negated or compared with constants; else None
    (a call, a value computed at run time)."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)):
        other = test.comparators[0]
        constant = isinstance(other, ast.Constant) or (
            isinstance(other, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in other.elts))
        if not constant:
            return None
        test = test.left
    if isinstance(test, ast.Subscript) and isinstance(test.slice, ast.Constant):  # cfg["freeze"]
        test = test.value
    return dotted(test)


def _puts_in_eval(ctx: Context, fn: ast.AST, part: str, depth: int, outer: str | None = None) -> bool:
    """Whether ``fn`` (a method, or a script's scope) puts ``part`` in eval: ``.eval()`` or ``.train(False)``
    (or ``.train(flag)``) of the part, of a module inside it or around it (``self`` included, not ``outer``),
    or of a ``.modules()`` loop variable; ``.apply(...)``; Lightning's ``freeze()`` (which ends in ``.eval()``);
    a method of the class that does, or an unknown helper named for norms or freezing."""
    for call in ctx.calls_within(fn):
        if isinstance(fn, ast.Module) and not isinstance(ctx.scope(call), ast.Module):
            continue  # a script: its own statements, not its classes' methods
        func = call.func
        if method_call(call, "eval") or (method_call(call, "train") and call.args and not _sets_train(call)):
            target = dotted(func.value)  # type: ignore[attr-defined]
            if target is None or (target != outer and (_under(part, target) or _under(target, part))):
                return True
            if isinstance(func.value, ast.Name) and any(  # type: ignore[attr-defined]
                    b.kind == "for" for b in ctx.bindings_of(func.value)):  # type: ignore[attr-defined]
                return True
            continue
        if method_call(call, "apply"):
            return True
        if method_call(call, "freeze") and not call.args:
            target = dotted(func.value)  # type: ignore[attr-defined]
            if target is not None and (_under(part, target) or _under(target, part)):
                return True
        name = last_name(func)
        if name is None or not _NORM_HELPER.search(name) or not isinstance(ctx.parent(call), ast.Expr):
            continue  # a helper's result used (``vgg19_bn(...)``, ``nn.BatchNorm2d(...)``): no switch of modes
        if isinstance(func, ast.Attribute) and dotted(func.value) == "self":
            cls = ctx.enclosing_class(fn) if not isinstance(fn, ast.ClassDef) else fn
            own = [f for f in (cls.body if cls is not None else []) if isinstance(f, _FUNCS) and f.name == name]
            if own:
                if depth < 2 and any(_puts_in_eval(ctx, f, part, depth + 1, outer) for f in own):
                    return True
                continue
        elif isinstance(func, ast.Name) and ctx.functions_named(name):
            if depth < 2 and any(_puts_in_eval(ctx, f, part, depth + 1, outer) for f in ctx.functions_named(name)):
                return True
            continue
        return True  # a helper of unknown body, named for norms or freezing: stay silent
    return False


def _kept_in_eval(ctx: Context, region: ast.AST, train: ast.Call, receiver: str, part: str) -> bool:
    """Whether the loop (or function), after the ``.train()``, puts something back in eval mode (other
    than switching the whole receiver to eval for validation) or calls a helper that may do so."""
    after = [c for c in ctx.calls_within(region) if position(c) > position(train)]
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
            _partial_eval(ctx, c) for fn in ctx.functions_named(func.id) for c in ctx.calls_within(fn)
        ):
            return True
    return False


def _partial_eval(ctx: Context, call: ast.Call) -> bool:
    """In a helper: ``.apply(...)``, or ``.eval()`` of a submodule or of a loop variable (``m.eval()`` over
    ``.modules()``); a plain ``model.eval()`` (an evaluation helper) does not count."""
    if method_call(call, "apply"):
        return True
    if not method_call(call, "eval"):
        return False
    target = call.func.value  # type: ignore[attr-defined]
    if isinstance(target, ast.Attribute):
        return True
    return isinstance(target, ast.Name) and any(b.kind == "for" for b in ctx.bindings_of(target))


def _under(path: str, prefix: str) -> bool:
    """Whether the dotted ``path`` is ``prefix`` or inside it."""
    return path == prefix or path.startswith(prefix + ".")


def _sets_train(call: ast.Call) -> bool:
    """``x.train()`` or ``x.train(True)``."""
    return method_call(call, "train") and not call.keywords and (
        not call.args or (len(call.args) == 1 and is_const(call.args[0], True)))


def _unchain(value: ast.AST) -> ast.AST:
    """``model.train()`` / ``model.eval()`` -> ``model`` (they return the module itself)."""
    while method_call(value, "train", "eval") and not value.args:  # type: ignore[attr-defined]
        value = value.func.value  # type: ignore[attr-defined]
    return value


def _train_calls_on_parameters(ctx: Context, fn: ast.AST) -> list[tuple[ast.Call, str, str]]:
    """``(call, parameter, rest)`` for each ``param.train()`` / ``param.rest.train()`` of a function's own body
    (``self`` left out): the modules it is given and puts in train mode."""
    out = []
    for node in walk_own(getattr(fn, "body", [])):
        if isinstance(node, ast.Call) and _sets_train(node) and not ctx.restores_mode(node):
            name = dotted(node.func.value)  # type: ignore[attr-defined]
            root, dot, rest = (name or "").partition(".")
            if name is not None and root not in ("self", "cls") and is_param(fn, root):
                out.append((node, root, dot + rest))
    return sorted(out, key=lambda t: position(t[0]))


def _restores(ctx: Context, fn: ast.AST, train: ast.Call, receiver: str) -> bool:
    """Whether the function, after ``train``, sets ``receiver``'s mode again (``.eval()``, ``.train(was)``)."""
    return any(method_call(c, "eval", "train") and c is not train and position(c) > position(train)
               and dotted(c.func.value) == receiver and not _sets_train(c)  # type: ignore[attr-defined]
               for c in ctx.calls_within(fn))


def _truthy(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call) -> bool | None:
    """Whether the value a same-file call gives the parameter ``name`` is true; None when unknown."""
    value = value_at_call(ctx, fn, name, ctx, call)
    return None if value is ... else bool(value)


def _mentions(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _as_list(body: object) -> list[ast.AST]:
    return body if isinstance(body, list) else [body]  # type: ignore[list-item, return-value]


def _head_name(text: object) -> bool:
    """``"fc"``, ``"fc."``, ``"classifier.1.weight"``: the name of a classification head's parameters."""
    if not isinstance(text, str):
        return False
    parts = [p for p in text.split(".") if p]
    return bool(parts) and bool(HEAD_WORD.fullmatch(parts[0])) and all(
        p.isdigit() or p in ("weight", "bias") or HEAD_WORD.fullmatch(p) for p in parts[1:]
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
