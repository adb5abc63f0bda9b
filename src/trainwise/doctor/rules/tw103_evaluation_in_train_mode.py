"""TW103 evaluation-in-train-mode: evaluation without ``model.eval()``, or training left in eval mode after it."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from trainwise.doctor.context import (
    Context,
    argument,
    dotted,
    is_const,
    keyword,
    last_name,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.evaluation import evaluation
from trainwise.doctor.context.functions import functions, reaches_call
from trainwise.doctor.context.modules import assigns_in_init, mode_dependent_parts, mode_free_class
from trainwise.doctor.context.values import Built, classes_built
from trainwise.doctor.rule import Rule

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_TRANSPARENT_WITH = frozenset({"no_grad", "inference_mode", "autocast", "open", "device", "tqdm", "set_grad_enabled",
                               "profile", "record_function"})


def _sets_eval(call: ast.Call) -> bool:
    """``x.eval()``, ``x.train(False)``, ``x.train(mode=False)``."""
    if method_call(call, "eval") and not call.args and not call.keywords:
        return True
    if method_call(call, "train"):
        mode = call.args[0] if call.args else getattr(keyword(call, "mode"), "value", None)
        return is_const(mode, False)
    return False


def _sets_train(call: ast.Call) -> bool:
    """``x.train()``, ``x.train(True)``, or ``x.train(<anything but False>)``."""
    if not method_call(call, "train"):
        return False
    mode = call.args[0] if call.args else getattr(keyword(call, "mode"), "value", None)
    return not is_const(mode, False)


class EvaluationInTrainMode(Rule):
    """An evaluation loop with no `model.eval()` on its path, or training resumed in eval mode after one.

    ## What it does
    Finds two mistakes about a model's mode:

    - an evaluation loop (a loop over a validation or test loader, a loop over validation data such as
      `val_data` in a function whose other loops train (the validation half of a `train()` function), or
      the loop of a function named like `evaluate`, `validate` or `test` that runs the model) when neither
      that function, nor a function of the same file it calls, nor a function that calls it puts the model in
      eval mode (`model.eval()` or `model.train(False)`). An evaluation function without a loop counts too:
      one full-graph or full-batch forward (`out = model(data.x, data.edge_index)` in a graph network's
      `test()`) in a function named like `test` or `evaluate` that returns what it computes, reads like a
      metric (`acc`, `correct`, `f1`, `.eq(...)`) and is called from a loop that trains (`for epoch ...:
      train(); test()`);
    - a loop that trains (calls `backward()`) and runs such an evaluation, which calls `.eval()`, but never
      calls `model.train()` again: from the second epoch on, training runs in eval mode;
    - an evaluation function that puts only parts of the model it runs in eval mode (`model.head.eval()`,
      then `model(x)`), with no `model.eval()` on that path (none, or only in the other branch of an `if`),
      when every class the model may be (built where each call of the function gets it, in any file of the
      run) that has those parts holds dropout or BatchNorm in another part (`nn.Dropout`, a transformer
      layer, a BatchNorm CNN, a Hugging Face model of a family with dropout by default such as GPT-2 or
      BERT): that part evaluates in train mode.

    The model may be of a class the file cannot name (`getattr(models, opt.arch)()`, `build_model(cfg)`, a
    registry `MODELS[name](...)`): it counts as a module when the file calls it like one (`model(x)`) and
    uses it as one (`.parameters()`, `.train()`/`.eval()`, `.state_dict()`/`.load_state_dict()`, `.cuda()`,
    `.requires_grad_()`); a registry function, a tokenizer, a scikit-learn estimator or a pipeline moved
    with `.to()` (which runs its own no-grad) is not. A model whose layers all act alike in both modes (an MLP,
    convolutions without dropout or BatchNorm) is reported too, and the message says so: its numbers are
    right today and wrong the day a dropout or BatchNorm layer is added.

    ## Why is this bad?
    Dropout and BatchNorm behave differently in the two modes. Evaluating in train mode drops activations at
    random and normalises with the batch's statistics (and updates the running statistics with validation
    data): the metrics are noisy and pessimistic, and the model changes by being evaluated. Training in eval
    mode after the first validation turns dropout off and freezes BatchNorm statistics, which quietly
    degrades the model.

    The rule stays silent when the mode is set in a helper of the same file (followed three calls deep), in
    any caller of the evaluation function, by an unknown context manager around the model call (such as
    `trainwise.evaluating(model)`), on models loaded with `from_pretrained` or `load` (which may already be
    in eval mode), and on `.train()` called on anything at all inside the training loop. It stays silent on
    an evaluation function that runs a model it takes as an argument, is called nowhere in the file, and
    sets neither the mode nor autograd (no `eval()`, no `no_grad`): its callers, in another file, set up
    the evaluation. And it stays silent on training that puts the model in eval mode itself before its
    `backward()` (a linear probe on a frozen backbone, whose BatchNorm statistics must not change): that
    mode is chosen, not left over from the evaluation.

    When such an evaluation function is called from other files of the run (`validate(model, val_loader)`
    in `train.py`, the function in `utils/metrics.py`), those calls decide: a caller (or a helper it calls, in
    any file of the run) that puts the model in eval mode silences the rule; when none does, the finding names
    the calls.

    `trainwise lab eval-mode` measures it: evaluation in train mode vs trainwise.evaluating.

    ## Example
    ```python
    import torch

    def validate(model, val_loader, criterion):
        total = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                total += criterion(model(x), y).item()
        return total / len(val_loader)
    ```

    ## Use instead
    ```python
    import torch

    def validate(model, val_loader, criterion):
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                total += criterion(model(x), y).item()
        return total / len(val_loader)
    ```
    In the training loop, call `model.train()` at the start of each epoch, not once before the loop.

    ## Fix safety
    There is no automatic fix: the call must go where the mode changes (start of the evaluation, start of
    each epoch), and a model shared by several loops may need its previous mode restored instead.
    """

    code = "TW103"
    name = "evaluation-in-train-mode"
    message = "the evaluation runs the model in train mode: call model.eval() first"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outside: dict[int, list[tuple[Context, ast.Call]]] = {}  # function -> its calls from other files

    def visit_Module(self, node: ast.Module) -> None:
        """Check the evaluation loops, then the training loops that run them."""
        regions = self.ctx.evaluation_regions()
        if not regions:
            return
        for region, calls in regions:
            if _mode_set_around(self.ctx, region, _sets_eval):
                self._partial_eval(region, calls)
                continue
            if self._mode_left_to_callers(region, calls):
                continue
            fn = region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)
            outside = self._outside.get(id(fn), [])[:3]
            program = self.ctx.program
            where = "" if not outside or program is None else (
                f" (nor where it is called, {', '.join(program.where(c, s) for c, s in outside)})")
            related = () if program is None else tuple(
                program.place(c, s, "called here, with nothing that puts the model in eval mode") for c, s in outside)
            for call in calls:
                if self.ctx.under_unknown_with(call, _TRANSPARENT_WITH) or self._loaded_model(call):
                    continue
                kind, before = "an evaluation loop", "before the loop"
                if isinstance(region, _FUNCTIONS) and self.ctx.enclosing_loop(call) is None:
                    kind, before = f"the evaluation function `{region.name}`", "before the forward"
                effect = ("no layer of it depends on the mode today, but one dropout or BatchNorm layer added "
                          "later changes the numbers" if self._mode_free_model(call)
                          else "dropout and BatchNorm act as in training")
                self.report(
                    call,
                    f"`{self.ctx.segment(call.func)}` runs in {kind}, but nothing puts it in eval mode"
                    f"{where}: {effect}; call `.eval()` {before}",
                    related=related,
                )
                break
        self._training_after_evaluation(regions)

    # --------------------------------------------------------------------------------- eval() of parts
    def _partial_eval(self, region: ast.AST, calls: list[ast.Call]) -> None:
        """An evaluation function that, on some path, puts only parts of the model it runs in eval mode
        (``model.encoder.eval(); model.head.eval()``, then ``model(x)``), when every class the model may be
        (from every call of the function, or its own assignments) that has those parts holds dropout or
        BatchNorm in another part: that part evaluates in train mode."""
        fn = region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)
        if not isinstance(fn, _FUNCTIONS):
            return
        own = [c for c in walk_own(fn.body) if isinstance(c, ast.Call) and _sets_eval(c)]
        for call in calls:
            model = self.ctx.called_module(call)
            if not isinstance(model, ast.Name):
                continue
            parts = [c for c in own if (dotted(c.func.value) or "").startswith(model.id + ".")]  # type: ignore[attr-defined]
            whole = [c for c in own if dotted(c.func.value) == model.id]  # type: ignore[attr-defined]
            if not parts or len(parts) + len(whole) != len(own) or not self._exclusive(parts, whole, call):
                continue
            if any(reaches_call(self.ctx, h, _sets_eval) for h in self.ctx.helpers_called(fn)):
                continue
            names = {dotted(c.func.value)[len(model.id) + 1:].split(".")[0] for c in parts}  # type: ignore[attr-defined, index]
            built = self._model_classes(fn, model, call)
            holding = [b for b in built or [] if all(assigns_in_init(b.ctx, b.cls, n) for n in names)]  # type: ignore[arg-type]
            left = [(b, mode_dependent_parts(b.ctx, b.cls, names)) for b in holding]  # type: ignore[arg-type]
            if not left or not all(found for _, found in left):
                continue
            cls, found = left[0][0].cls, left[0][1]
            self.report(
                min(parts, key=position),
                f"only {', '.join(f'`{model.id}.{n}`' for n in sorted(names))} of `{model.id}` go to eval mode "
                f"before `{self.ctx.segment(call.func)}` runs in this evaluation: "
                f"{', '.join(f'`{n}`' for n in found)} of `{cls.name}` (dropout or BatchNorm) stays in train "  # type: ignore[union-attr]
                f"mode; call `{model.id}.eval()`",
            )
            return

    def _exclusive(self, parts: list[ast.Call], whole: list[ast.Call], call: ast.Call) -> bool:
        """The parts are put in eval mode before ``call`` on a path that never puts the whole model in eval
        mode: no ``model.eval()`` at all, or only in the other branch of an ``if`` holding every part."""
        if any(position(p) > position(call) for p in parts):
            return False
        if not whole:
            return True
        for node in self.ctx.ancestors(parts[0]):
            if not isinstance(node, ast.If) or self.ctx.is_inside(call, node):
                continue
            for mine, other in ((node.body, node.orelse), (node.orelse, node.body)):
                if all(any(p is s or self.ctx.is_inside(p, s) for s in mine) for p in parts) and \
                        all(any(w is s or self.ctx.is_inside(w, s) for s in other) for w in whole):
                    return True
        return False

    def _model_classes(self, fn: ast.AST, model: ast.Name, call: ast.Call) -> list[Built] | None:
        """The classes of the run the model called may be: for a parameter, those every call of the function
        passes (in this file or another of the run); else those its own assignments build."""
        if not any(b.kind == "param" and b.stmt is fn for b in self.ctx.bindings_of(model)):
            return classes_built(self.ctx, model, call)
        sites = [(self.ctx, s) for s in self.ctx.call_sites(fn) if isinstance(s.func, ast.Name)]  # type: ignore[arg-type]
        if self.ctx.program is not None:
            sites += self.ctx.program.callers(self.ctx, fn)
        found: list[Built] = []
        for ctx, site in sites:
            passed = argument(fn, model.id, site)  # type: ignore[arg-type]
            if not isinstance(passed, ast.Name) or evaluation(ctx).in_eval_mode(site, passed.id):
                return None
            more = classes_built(ctx, passed, site)
            if more is None:
                return None
            found += [b for b in more if all(b.node is not f.node for f in found)]
        return found or None

    # --------------------------------------------------------------------------------- eval() missing
    def _mode_left_to_callers(self, region: ast.AST, calls: list[ast.Call]) -> bool:
        """An evaluation function of a model it takes as an argument, called nowhere in this file, that sets
        neither the mode nor autograd (no ``eval()``/``train()``, no ``no_grad``): its callers set up the
        evaluation. When they are in other files of the run, they decide: the mode set around any of them
        silences the rule, none set it reports; when they are outside the run, the file alone cannot tell."""
        fn = region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)
        if not isinstance(fn, _FUNCTIONS) or self.ctx.call_sites(fn):
            return False
        outside = self.ctx.program.callers(self.ctx, fn) if self.ctx.program is not None else []
        if outside:
            if any(_mode_set_around(ctx, site, _sets_eval) for ctx, site in outside):
                return True
            self._outside[id(fn)] = outside
            return False
        if any(self.ctx.grad_disabled(call) for call in calls):
            return False  # it turns autograd off itself: an evaluation complete but for eval()
        if self.ctx.reaches_call(fn, lambda c: _sets_eval(c) or _sets_train(c)):
            return False
        return all(self._argument_model(call, fn) for call in calls)

    def _argument_model(self, call: ast.Call, fn: ast.AST) -> bool:
        """``model(x)`` (or ``model.module(x)``) where ``model`` is a parameter of ``fn``."""
        func = self.ctx.called_module(call)
        while isinstance(func, ast.Attribute) and func.attr in ("module", "model"):
            func = func.value
        if not isinstance(func, ast.Name):
            return False
        found = self.ctx.bindings_of(func)
        return bool(found) and all(b.kind == "param" and b.stmt is fn for b in found)

    def _mode_free_model(self, call: ast.Call) -> bool:
        """The model called is built from a class of the run (``self.G = Generator(...)``, ``net = Net()``)
        whose layers are all known and behave alike in both modes (``modules.mode_free_class``)."""
        func = self.ctx.called_module(call)
        values: list[ast.AST | None] = []
        if isinstance(func, ast.Name):
            values = [self.ctx.value_of(func, call)]
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            cls = self.ctx.enclosing_class(call)  # every self.G = Generator(...) of the class (one per dataset)
            values = [b.value for b in self.ctx.attr_bindings.get(f"self.{func.attr}", [])
                      if cls is not None and self.ctx.enclosing_class(b.stmt) is cls]
        if not values:
            return False
        for value in values:
            if not isinstance(value, ast.Call):
                return False
            local = self.ctx.class_named(value.func.id, call) if isinstance(value.func, ast.Name) else None
            found = (self.ctx, local) if local is not None else (
                self.ctx.program.class_of(self.ctx, value.func) if self.ctx.program is not None else None)
            if found is None or not mode_free_class(found[0], found[1]):
                return False
        return True

    def _loaded_model(self, call: ast.Call) -> bool:
        """A model whose bindings come from ``from_pretrained``/``load``: its mode is not known."""
        func = self.ctx.called_module(call)
        while isinstance(func, ast.Attribute) and func.attr in ("module", "model"):
            func = func.value
        for b in self.ctx.bindings_of(func):
            value = b.value
            for sub in ast.walk(value) if value is not None else ():
                name = last_name(sub.func) if isinstance(sub, ast.Call) else None
                if name is not None and ("load" in name or name == "from_pretrained"):
                    return True
        return False

    # ------------------------------------------------------------------------- train() never restored
    def _training_after_evaluation(self, regions: list[tuple[ast.AST, list[ast.Call]]]) -> None:
        if not any(method_call(c, "backward") for c in self.ctx.nodes(ast.Call)):
            return
        evaluating = [r for r, _ in regions]
        evaluating_functions = {id(r) for r in evaluating if isinstance(r, _FUNCTIONS)}
        candidates = []
        for tp in _LOOPS:
            for loop in self.ctx.nodes(tp):
                if evaluating_functions and any(id(a) in evaluating_functions for a in self.ctx.ancestors(loop)):
                    continue  # a loop of the evaluation itself
                reached = (loop, *self.ctx.helpers_called(loop))
                if not any(_calls_backward(n) for n in reached):
                    continue
                eval_calls = [c for n in reached for c in self.ctx.calls_within(n) if _sets_eval(c)
                              and self._inside_evaluation(c, evaluating) and not self._on_a_copy(c, loop)]
                if not eval_calls or any(_sets_train(c) for n in reached for c in self.ctx.calls_within(n)):
                    continue
                if self._trains_in_eval_mode(reached, eval_calls, evaluating):
                    continue
                candidates.append(loop)
        chosen = {id(loop) for loop in candidates}
        holding = {id(a) for other in candidates for a in self.ctx.ancestors(other) if id(a) in chosen}
        for loop in candidates:
            if id(loop) in holding:
                continue  # the innermost loop that trains and evaluates reports
            self.report(
                loop,
                "this loop trains and runs an evaluation that calls .eval(), but never calls .train() again: "
                "from the second pass on, training runs in eval mode; call model.train() at the start of each epoch",
            )

    def _trains_in_eval_mode(self, reached: tuple[ast.AST, ...], eval_calls: list[ast.Call],
                             evaluating: list[ast.AST]) -> bool:
        """The training code itself puts the evaluated model in eval mode before its ``backward()`` (a linear
        probe on a frozen backbone keeps BatchNorm statistics fixed on purpose): the mode it trains in is
        chosen, not left over from the evaluation."""
        evaluated = {_receiver_name(c) for c in eval_calls} - {None}
        for node in reached:
            for call in self.ctx.calls_within(node):
                if not _sets_eval(call) or _receiver_name(call) not in evaluated:
                    continue
                if self._inside_evaluation(call, evaluating):
                    continue
                fn = self.ctx.scope(call)
                if any(method_call(c, "backward") and position(c) > position(call) and self.ctx.scope(c) is fn
                       for c in self.ctx.calls_within(fn)):
                    return True
        return False

    def _on_a_copy(self, call: ast.Call, loop: ast.AST) -> bool:
        """The ``.eval()`` acts on a model built apart from the one trained (``eval_model = Net(...)``, loaded
        with the weights, then ``evaluate(eval_model)``): the trained model's mode is untouched. The receiver is
        followed through the helpers the loop calls to the expression it stands for in the loop."""
        receiver = call.func.value  # type: ignore[attr-defined]
        summaries = functions(self.ctx)
        if self.ctx.scope(call) is self.ctx.scope(loop):
            tops: list[ast.expr | None] = [receiver]
        else:
            tops = [summaries.translate(receiver, r.params) for r in summaries.reached(loop)
                    if self.ctx.is_inside(call, r.function)]
        forwards = {c.func.id for c in self.ctx.calls_within(loop) if isinstance(c.func, ast.Name)}
        return bool(tops) and all(isinstance(top, ast.Name) and top.id not in forwards
                                  and self.ctx.is_new_object(top, top) for top in tops)

    def _inside_evaluation(self, call: ast.Call, evaluating: list[ast.AST]) -> bool:
        if any(self.ctx.is_inside(call, r) for r in evaluating):
            return True
        fn = self.ctx.scope(call)  # model.eval() right before an evaluation loop of the same function and loop
        loop = self.ctx.enclosing_loop(call)
        return any(
            not isinstance(r, _FUNCTIONS) and self.ctx.scope(r) is fn and self.ctx.enclosing_loop(r) is loop
            for r in evaluating
        )


def _mode_set_around(ctx: Context, region: ast.AST, predicate: Callable[[ast.Call], bool]) -> bool:
    """The mode call in the function holding the region, its helpers (of any file of the run), or its callers
    in the file (two levels up)."""
    start = region if isinstance(region, _FUNCTIONS) else ctx.scope(region)
    frontier = [start]
    for _ in range(3):
        next_frontier = []
        for fn in frontier:
            if reaches_call(ctx, fn, predicate):
                return True
            if isinstance(fn, _FUNCTIONS):
                next_frontier.extend(ctx.scope(site) for site in ctx.call_sites(fn) if not _mode_call(ctx, site))
                outer = ctx.scope(fn)
                if isinstance(outer, _FUNCTIONS):
                    next_frontier.append(outer)
        frontier = next_frontier
    return False


def _mode_call(ctx: Context, site: ast.Call) -> bool:
    """``model.train()`` / ``self.model.eval()`` on a module: not a call of a function of the file that is
    named ``train`` (a ``Trainer.train`` method beside a model's mode switch)."""
    return method_call(site, "train", "eval") and ctx.is_module(site.func.value)  # type: ignore[attr-defined]


def _receiver_name(call: ast.Call) -> str | None:
    """``model`` for ``model.eval()``, ``self.model.eval()`` and ``model.module.eval()``."""
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    while isinstance(receiver, ast.Attribute) and receiver.attr == "module":
        receiver = receiver.value
    return last_name(receiver) if receiver is not None else None


def _calls_backward(container: ast.AST) -> bool:
    return any(method_call(c, "backward") for c in ast.walk(container))
