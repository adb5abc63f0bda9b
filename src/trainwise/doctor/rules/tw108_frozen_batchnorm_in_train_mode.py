"""TW108 frozen-batchnorm-in-train-mode: a frozen part with BatchNorm put back in train mode by ``model.train()``."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from trainwise.doctor.context import (
    Context,
    argument,
    dotted,
    init_of,
    is_bound_method,
    is_param,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.frameworks import (
    before_training,
    deliberate,
    framework_training,
    lightning_chain,
    switch_around,
)
from trainwise.doctor.context.freezes import Freezes, under
from trainwise.doctor.context.functions import functions
from trainwise.doctor.context.modes import class_keeps_eval, kept_in_eval, puts_in_eval, sets_train
from trainwise.doctor.context.modules import ModeLayers, Norms
from trainwise.doctor.rule import Rule

if TYPE_CHECKING:
    from trainwise.doctor.program import Program, Symbol

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DROPOUT_EFFECT = "its dropout is active again while it is frozen, so training sees other features than inference"


class FrozenBatchnormInTrainMode(Rule):
    """A frozen backbone with BatchNorm layers put back in train mode by `model.train()`.

    ## What it does
    Finds `model.train()` in a training or epoch loop, before a training loop (one that calls `backward()`),
    or in a function called from a loop (`train_one_epoch(model, ...)`, a trainer's `self.model.train()`),
    when part of `model` (or all of it) was frozen and the script knows that part has BatchNorm layers, with
    no `.eval()` of the frozen part after the `.train()`. The function may be in another file of the run:
    `fit_one_epoch(model_train, ...)` in `train.py` calling `model_train.train()` in `utils/utils_fit.py`
    (and training there, or called once per epoch) is reported at the call, naming the `.train()` line and
    the line that freezes. A trainer class may freeze in one method (`self.freeze()`) and put the model in
    train mode in another that a method runs after the freeze (`linear_probe` calling `self.freeze()`, then
    `self.fit(...)` which calls `self.one_epoch()`), with no unfreeze between; the model such a class is given is
    learnt where the class is constructed, in any file of the run (`Learner(dls, model)` in `finetune.py`), also
    through functions that hand the model back (`model = restore(model, path)`, `accelerator.prepare(model, ...)`),
    and a helper called after the `.train()` whose loop trains (`self.all_batches()`) makes it a training epoch.

    The same `.train()` undoes the script's own `.eval()` of a frozen part that has dropout instead
    (`model.text_encoder.eval()` after freezing a T5 or BERT text encoder of the model, or a part of the run
    that builds `nn.Dropout`): reported too, as the script said the part belongs in eval mode; a class that
    freezes such a part and puts it in eval in `__init__` only is reported there. A `.train()` that puts back a
    saved mode (`was_training = model.training`, then `model.train(was_training)` or `if was_training:
    model.train()`) restores the caller's mode and is not reported.

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
    `efficientnet.features.requires_grad_(True)`), when a frozen part has dropout but the script never puts it in
    eval itself (then its mode is a choice), when a module class of the file overrides `train()`, or the
    model's own class (of any file of the run, through factories and registries) does or puts the frozen part
    in eval in one of its methods, and
    when, after the `.train()`, the loop or function calls `.eval()` on the frozen part or on its
    `.modules()`, `model.apply(...)`, or a helper that does. A `.train()` run once with no training after it
    is not reported, nor a helper of another file that switches to train mode for one forward and back to eval
    (Monte Carlo dropout) without training. With a framework, the rule stays silent when the LightningModule (or
    a base class of it in the run) calls `.eval()` on the frozen part in any method (`on_train_epoch_start`;
    in `__init__` it holds since Lightning 2.2, which keeps the modes of submodules) or Lightning's `freeze()`,
    overrides `train()`, names a deliberate choice (`train_bn`, `train_norm_stats`, `track_running_stats`),
    has a base class from outside the run (its hooks are unknown), has no `training_step`, or freezes under a
    condition; and for a Hugging Face trainer subclass with its own `training_step` or `compute_loss`.

    `trainwise lab frozen-norm` measures it: frozen BatchNorm: requires_grad_(False) vs freeze().

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reported_freezes: set[int] = set()  # freezes already reported through a helper of another file

    @property
    def freezes(self) -> Freezes:
        """What the file freezes (``context/freezes.py``)."""
        return self.ctx.analysis(Freezes)

    def visit_Call(self, node: ast.Call) -> None:
        """``model.train()`` in a loop, before a training loop, or in a function called from a loop; a call
        of a function of another file that puts the model it is given in train mode."""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("fit", "train") and self._through_framework(node):
            return
        if not (isinstance(func, ast.Attribute) and func.attr == "train"):
            self._through_other_file(node)
            return
        if not sets_train(node) or self.ctx.restores_mode(node):
            return
        receiver = dotted(node.func.value)  # type: ignore[attr-defined]
        if receiver is None or not self.ctx.uses_torch() or self._overrides_train():
            return
        if not any(frozen for _m, _s, frozen in self.freezes.all()):
            return
        loop = self.ctx.enclosing_loop(node)
        trains_after: bool | None = None if loop is None else True
        region = loop if loop is not None else self.ctx.scope(node)
        for path, at, called_in_loop in self.freezes.origins(receiver, node):
            parts = self.freezes.frozen_parts(path, at)
            if not parts:
                continue
            if loop is None and not called_in_loop:
                if trains_after is None:
                    trains_after = self._training_follows(node)
                if not trains_after:
                    continue
            for part in parts:
                local = receiver + part[len(path):] if under(part, path) else part
                excluded = self.freezes.unfrozen_below(part, path)
                norms = self.ctx.analysis(Norms).has_bn(part, at, excluded)
                evaluated = None if norms else self.freezes.put_in_eval(part, at)
                if not (norms or (evaluated is not None and self.ctx.analysis(ModeLayers).has_bn(part, at, excluded))):
                    continue
                if kept_in_eval(self.ctx, region, node, receiver, local) or class_keeps_eval(self.ctx, path, at, part):
                    continue
                if evaluated is not None:
                    self.report(node, f"`{receiver}.train()` puts the frozen `{local}` back in train mode, undoing its "
                                      f"`.eval()` on line {evaluated.lineno}: {_DROPOUT_EFFECT}; call `{local}.eval()` "
                                      f"after `{receiver}.train()`")
                    return
                self.report(
                    node,
                    f"`{receiver}.train()` puts the frozen `{local}` back in train mode: its BatchNorm layers "
                    f"keep updating their running statistics; call `.eval()` on the frozen part (or its "
                    f"BatchNorm modules) after `{receiver}.train()`, or freeze with trainwise.freeze",
                )
                return


    def _through_other_file(self, call: ast.Call) -> None:
        """``fit_one_epoch(model, ...)`` where ``fit_one_epoch``, in another file of the run, calls
        ``model_train.train()`` on the parameter it passes (and trains, or is called once per epoch), after a
        freeze of part of ``model`` that holds BatchNorm: reported at the call, naming both places."""
        program = self.ctx.program
        if program is None or len(program.paths) < 2 or not self.freezes.any_frozen():
            return
        symbol = program.resolve(self.ctx, call.func) if not self._overrides_train() else None
        if symbol is None or not program.remember(("TW108 trains a parameter", symbol.path, symbol.name),
                                                  lambda: _trains_a_parameter(program, symbol)):
            return  # most helpers of another file put nothing in train mode: their file is not parsed again
        found = program.function(symbol)
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
            for part in self.freezes.frozen_parts(receiver, call):
                there = param + rest + part[len(receiver):] if under(part, receiver) else part
                if (not self.ctx.analysis(Norms).has_bn(part, call, self.freezes.unfrozen_below(part, receiver))
                        or kept_in_eval(callee, fn, train, param + rest, there)
                        or class_keeps_eval(self.ctx, receiver, call, part)):
                    continue
                freeze = self.freezes.frozen_at[part]
                if id(freeze) in self._reported_freezes:
                    return
                self._reported_freezes.add(id(freeze))
                where = program.where(callee, train)
                self.report(  # at the freeze: the line of the user's that the helper of another file undoes
                    freeze,
                    f"`{part}` is frozen here, but `{fn.name}()` (called on line {call.lineno}) runs "
                    f"`{param + rest}.train()` ({where}), which puts it back in train mode: its BatchNorm layers "
                    f"keep updating their running statistics; call `.eval()` on the frozen part (or its BatchNorm "
                    f"modules) after that `.train()`, or freeze with trainwise.freeze",
                    related=(program.place(callee, train, f"`{param + rest}.train()` puts the frozen `{part}` "
                                                          f"back in train mode"),
                             program.place(self.ctx, call, f"`{fn.name}()` is called here")),
                )
                return

    # ------------------------------------------------------------------------ a framework's implicit train()
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """A LightningModule with ``training_step`` that freezes part of itself before training (``__init__``,
        ``setup``, ``configure_optimizers``, or a method they call): Lightning trains it in train mode (a module
        starts in train mode; Lightning before 2.2 also calls ``.train()`` after every validation), so the frozen
        BatchNorm layers update their statistics unless some method puts the part in eval."""
        if not self.freezes.any_frozen() or self._overrides_train():
            return
        chain = lightning_chain(self.ctx, node)
        if chain is None:
            self._eval_only_at_construction(node)
            return
        methods = [(c, f) for c, cls in chain for f in cls.body if isinstance(f, _FUNCS)]
        steps = [(c, f) for c, f in methods if f.name == "training_step"]
        if not steps or any(f.name == "train" for _c, f in methods) or deliberate(chain):
            return
        for module, stmt, frozen in self.freezes.all():
            if (not frozen or not module.startswith("self.") or self.ctx.enclosing_class(stmt) is not node
                    or not before_training(self.ctx, node, stmt) or self.freezes.unfrozen(module, "self")):
                continue
            if not self.ctx.analysis(Norms).has_bn(module, stmt, self.freezes.unfrozen_below(module, "self")):
                continue
            if any(puts_in_eval(c, f, module, 0) for c, f in methods):
                continue
            program = self.ctx.program
            step_ctx, step = steps[0]
            related = () if program is None else (
                program.place(step_ctx, step, f"Lightning runs `training_step` with `{node.name}` in train mode"),)
            switch = switch_around(self.ctx, stmt)
            when = "" if switch is None else f" (with `{switch}` set)"
            self.report(
                stmt,
                f"`{module}` is frozen{when}, but Lightning trains `{node.name}` in train mode and nothing puts "
                f"`{module}` in eval: its BatchNorm layers keep updating their running statistics; call "
                f"`{module}.eval()` in `on_train_epoch_start`, or freeze with trainwise.freeze",
                related=related,
            )


    def _eval_only_at_construction(self, node: ast.ClassDef) -> None:
        """A module class that freezes a part holding BatchNorm in ``__init__`` and puts it in eval mode there
        only: the first ``model.train()`` (every training loop and framework calls one) undoes that ``.eval()``,
        as no ``train()`` override or other method puts the part back in eval."""
        init = init_of(node)
        if init is None or not self.ctx.is_module_class(node):
            return
        methods = [f for f in node.body if isinstance(f, _FUNCS)]
        if any(f.name == "train" for f in methods):
            return
        for module, stmt, frozen in self.freezes.all():
            if (not frozen or not module.startswith("self.") or self.ctx.scope(stmt) is not init
                    or self.freezes.unfrozen(module, "self")):
                continue
            evals = [c for c in self.ctx.calls_within(init) if method_call(c, "eval") and not c.args
                     and dotted(c.func.value) == module]  # type: ignore[attr-defined]
            if not evals or any(puts_in_eval(self.ctx, f, module, 0) for f in methods if f is not init):
                continue
            excluded = self.freezes.unfrozen_below(module, "self")
            norms = self.ctx.analysis(Norms).has_bn(module, stmt, excluded)
            if not norms and not self.ctx.analysis(ModeLayers).has_bn(module, stmt, excluded):
                continue
            effect = ("its BatchNorm layers update their running statistics" if norms else
                      _DROPOUT_EFFECT.replace("its dropout is", "its dropout is then"))
            self.report(
                evals[0],
                f"`{module}` is frozen and put in eval mode in `__init__` only: the first `.train()` of a "
                f"`{node.name}` (every training loop and framework calls one) puts it back in train mode and "
                f"{effect}; override `train()` to keep `{module}` in eval mode"
                + (", or freeze with trainwise.freeze" if norms else ""),
            )
            return

    def _through_framework(self, call: ast.Call) -> bool:
        """``trainer.fit(model)`` of Lightning, ``Trainer(model=model).train()`` of Hugging Face: the framework
        calls ``model.train()`` (Hugging Face at every step), after a freeze of a part of ``model`` that holds
        BatchNorm. Returns whether the call is such a framework call."""
        found = framework_training(self.ctx, call)
        if found is None:
            return False
        kind, model = found
        func = call.func
        receiver = dotted(model) if model is not None else None
        if (receiver is None or not self.ctx.uses_torch() or self._overrides_train()
                or not self.freezes.any_frozen()):
            return True
        scope = self.ctx.scope(call)
        for path, at, _in_loop in self.freezes.origins(receiver, call):
            for part in self.freezes.frozen_parts(path, at):
                freeze = self.freezes.frozen_at[part]
                if kind == "lightning" and lightning_chain(self.ctx, self.ctx.enclosing_class(freeze)) is not None:
                    continue  # frozen inside a LightningModule: reported at the freeze (visit_ClassDef)
                local = receiver + part[len(path):] if under(part, path) else part
                if not self.ctx.analysis(Norms).has_bn(part, at, self.freezes.unfrozen_below(part, path)):
                    continue
                if class_keeps_eval(self.ctx, path, at, part):
                    continue
                if kind == "lightning":
                    kept = (puts_in_eval(self.ctx, scope, local, 0, outer=receiver)
                            or kept_in_eval(self.ctx, scope, call, receiver, local))
                    what = f"`{dotted(func) or 'Trainer(...).fit'}({receiver})` trains `{receiver}` in train mode"
                else:
                    kept = kept_in_eval(self.ctx, scope, call, receiver, local)
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


    # ----------------------------------------------------------------------------- where the model comes from


    # -------------------------------------------------------------------------------------------- freezes


    # ------------------------------------------------------------------------------------------- silences
    def _training_follows(self, train: ast.Call) -> bool:
        """Whether a training loop (one that calls ``backward()`` or ``optimizer.step()``, itself or in a
        helper) comes after the ``.train()`` in the same function or module, or in a same-file helper called
        after it (a trainer's ``self.model.train()`` then ``self.all_batches()``, whose loop trains)."""
        scope = self.ctx.scope(train)
        for tp in (ast.For, ast.AsyncFor, ast.While):
            for loop in self.ctx.nodes(tp):
                if (position(loop) > position(train) and self.ctx.scope(loop) is scope
                        and self.ctx.reaches_call(loop, self._updates, depth=2)):
                    return True
        after = [c for c in self.ctx.calls_within(scope)
                 if position(c) > position(train) and self.ctx.scope(c) is scope]
        return any(self._trains_in_a_loop(fn) for call in after for fn in self.ctx.helpers_called(call, depth=2))

    def _trains_in_a_loop(self, fn: ast.AST) -> bool:
        """Whether a loop of the function's own body trains (``backward()``/``optimizer.step()``, itself or in a
        helper)."""
        return any(isinstance(n, (ast.For, ast.AsyncFor, ast.While))
                   and self.ctx.reaches_call(n, self._updates, depth=2) for n in walk_own(getattr(fn, "body", [])))

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


def _trains_a_parameter(program: Program, symbol: Symbol) -> bool:
    """Whether the function ``symbol`` names calls ``.train()`` on one of its parameters."""
    found = program.function(symbol)
    return found is not None and bool(_train_calls_on_parameters(*found))


def _train_calls_on_parameters(ctx: Context, fn: ast.AST) -> list[tuple[ast.Call, str, str]]:
    """``(call, parameter, rest)`` for each ``param.train()`` / ``param.rest.train()`` of a function's own body
    (``self`` left out): the modules it is given and puts in train mode."""
    out = []
    for node in walk_own(getattr(fn, "body", [])):
        if isinstance(node, ast.Call) and sets_train(node) and not ctx.restores_mode(node):
            name = dotted(node.func.value)  # type: ignore[attr-defined]
            root, dot, rest = (name or "").partition(".")
            if name is not None and root not in ("self", "cls") and is_param(fn, root):
                out.append((node, root, dot + rest))
    return sorted(out, key=lambda t: position(t[0]))


def _restores(ctx: Context, fn: ast.AST, train: ast.Call, receiver: str) -> bool:
    """Whether the function, after ``train``, sets ``receiver``'s mode again (``.eval()``, ``.train(was)``)."""
    return any(method_call(c, "eval", "train") and c is not train and position(c) > position(train)
               and dotted(c.func.value) == receiver and not sets_train(c)  # type: ignore[attr-defined]
               for c in ctx.calls_within(fn))


