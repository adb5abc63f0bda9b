"""TW104 evaluation-with-grad-enabled: an evaluation loop that runs the model with autograd on."""

from __future__ import annotations

import ast
from typing import Any

from trainwise.doctor.context import Context, dotted, is_const, last_name, method_call, position, walk_own
from trainwise.doctor.context.evaluation import evaluation
from trainwise.doctor.context.functions import functions, is_eval_call, same_or_below
from trainwise.doctor.rule import Rule

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_REGION_BLOCKS = (*_FUNCTIONS, ast.For, ast.AsyncFor, ast.While)  # else a region is one statement after .eval()
# Context managers that do not change autograd: anything else around the model call may (tw.evaluating(...)).
_TRANSPARENT_WITH = frozenset({"autocast", "open", "device", "tqdm", "profile", "record_function", "Timer", "timer"})
_DIFFERENTIATING = frozenset({"backward", "grad", "enable_grad", "set_grad_enabled", "requires_grad_", "retain_grad",
                              "vjp", "jvp", "jacobian", "hessian", "manual_backward"})


class EvaluationWithGradEnabled(Rule):
    """An evaluation loop that runs the model without `torch.no_grad()` or `torch.inference_mode()`.

    ## What it does
    Finds a model called inside an evaluation loop when neither the call, the function holding it, nor any
    place that calls the function turns autograd off (`with torch.no_grad()`, `torch.inference_mode()`, the
    decorators, `set_grad_enabled(False)`). An evaluation loop is:

    - a loop over a validation or test loader (`for x, y in val_loader`, `dataloaders["val"]`), in a script,
      a function or a method, also when the same script or function trains elsewhere; a loop over
      validation data not named as a loader (`for x, y in batches(val_data)`) in a function whose other loops
      train (the validation half of a `train()` function);
    - the loop of a function named like `evaluate`, `validate` or `test`, or, in such a function without a
      loop over the model, its single forward (a graph network's full-graph `out = model(data.x,
      data.edge_index)`, a full-batch model) when the function returns or prints what it computes, reads like
      a metric (`acc`, `correct`, `f1`, `.eq(...)`) and is called from a loop that trains (`train(); test()`
      each epoch) or once after one: a shape check that names no metric, or a function no training code
      precedes, is not one;
    - the validation half of a function (or script) that trains without a loop over validation data: a forward
      of `model` after `model.eval()`, which comes after the last `backward()` or optimizer step
      (`model.eval(); output = model(features, adj)` in a graph network's `train()`);
    - a loop that runs a model after `model.eval()` (or `model = ....eval()`) in the same block, with no
      `model.train()` in between: an evaluation function under any name (`check_accuracy(loader, model)`),
      the test section at the end of a training script, a prediction or generation loop;
    - a loop over data (`while not done`, a loader, `for step in range(num_steps)`) that runs a model in a
      script that never trains: the file computes, applies and clears no gradient, builds no optimizer, and
      calls no function of another file nor member of a model that does; the loop is in its top-level code or
      in a same-file function that code calls (a play, predict or demo script, `eval()` or not);
    - a module-level function whose every call (from this file or another of the run) passes a model its
      caller put in eval mode before (`model.eval()`, then `evaluate_valid(model, data)`), under any name;
    - a method of a class that is no module (a planner, a predictor, an attack) that runs a model the class
      puts in eval mode (`self.network.eval()` in `initialize`) and never back in train mode, in a file that
      trains nothing, when no file of the project that trains calls a method of that name (a frozen critic's
      score differentiated in a loss, CLIP guidance, stays silent).

    An evaluation function called from other files of the run (`evaluate(model, val_loader)` in `train.py`,
    defined in `utils/engine.py`) is judged with those calls: any call made with autograd off (or under
    another context manager, or in a decorated function), or whose result reaches a `backward()`, silences
    the rule; otherwise the finding names the calls.

    The model may be of a class the file cannot name (`getattr(models, opt.arch)()`, `build_model(cfg)`, a
    registry `MODELS[name](...)`): it counts as a module when the file calls it like one (`model(x)`) and
    uses it as one (`.parameters()`, `.train()`/`.eval()`, `.state_dict()`/`.load_state_dict()`, `.cuda()`,
    `.requires_grad_()`, or both a mode and a state dict: `agent = policy_class(env)`, `.load_state_dict()`,
    `.eval()`); a registry function, a tokenizer, a scikit-learn estimator or a pipeline moved with `.to()`
    (which runs its own no-grad) is not. A member of a model runs it too: `model.forward(x)`, and
    `agent.get_action(obs)` or `clip_model.visual(images)` when every `nn.Module` class of the project that
    defines the member makes it a submodule or a method that calls one with autograd on (a method decorated
    with `no_grad`, or one class whose member runs no module, leaves the call unknown).

    ## Why is this bad?
    With autograd on, every forward pass records its graph and keeps the activations alive for a backward
    pass that never comes: evaluation uses several times the memory it needs (often the cause of an
    out-of-memory error that appears only at validation), runs slower, and any value accumulated from the
    outputs keeps the graphs of every batch alive.

    The rule stays silent when gradients are wanted: the evaluation function (for any other loop: the loop
    itself, or a same-file function it calls) calls `backward()`, `torch.autograd.grad`, `requires_grad_()`,
    `enable_grad()`, steps an optimizer or zeroes gradients (saliency maps, gradient penalties, adversarial
    examples, fine-tuning with BatchNorm kept in eval mode, distillation from a teacher in eval mode); a
    value the loop computes or collects reaches a `backward()` after it (a rollout kept for the update); or
    the function returns its outputs to a caller that backpropagates them, or yields them. It stays silent
    when the model called is frozen as a whole, so that no graph is built: `model.requires_grad_(False)`,
    `for p in model.parameters(): p.requires_grad = False` with no condition on the parameter, or the
    model passed to `freeze(...)`, `set_requires_grad(...)` or a same-file function that sets
    `requires_grad` to False. A model frozen only in part (its backbone, its biases) still builds a graph
    for the rest and is reported, and freezing other tensors or models of the file changes nothing. It
    stays silent for a whole file that calls `torch.set_grad_enabled(False)` as a statement, when the
    evaluation runs inside any other context manager or is decorated (which may turn autograd off), when
    any call of the function in the file is made with autograd off, for a module-level function that the
    file never calls nor names and that leaves evaluation mode to its caller (no `model.eval()` of its own:
    the `validation(model, ...)` of a training package, whose callers outside the run set the mode and may
    turn autograd off with it), for a loop that ends in an unconditional `break` (one batch to plot) or
    sits after a `return`, and for methods of `nn.Module` and Lightning classes, `*_step` and `on_*` hooks,
    and `model.eval()` loops in test files (pytest, unittest).

    `trainwise lab eval-mode` measures it: evaluation in train mode vs trainwise.evaluating.

    ## Example
    ```python
    import torch

    def evaluate(model, val_loader):
        model.eval()
        correct = 0
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct / len(val_loader.dataset)
    ```

    ## Use instead
    ```python
    import torch

    @torch.inference_mode()
    def evaluate(model, val_loader):
        model.eval()
        correct = 0
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct / len(val_loader.dataset)
    ```

    ## Fix safety
    There is no automatic fix: `inference_mode` tensors cannot later enter autograd, and where the
    evaluation's outputs go is outside the file's view; add the decorator or the `with` block by hand.
    """

    code = "TW104"
    name = "evaluation-with-grad-enabled"
    message = "the evaluation loop runs the model with autograd on: wrap it in torch.no_grad()/inference_mode()"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exits: dict[tuple[int, str], tuple[int, int] | None] = {}
        self._names: set[str] | None = None
        self._outside: dict[int, list[tuple[Context, ast.Call]]] = {}  # function -> its calls from other files

    def visit_Module(self, node: ast.Module) -> None:
        """Check every evaluation loop of the file."""
        if not self.ctx.uses_torch() or self._file_turns_grad_off():
            return
        summaries = functions(self.ctx)
        regions: list[tuple[ast.AST, list[ast.Call]]] = list(self.ctx.evaluation_regions())
        covered = {id(c) for _, calls in regions for c in calls}
        inference: set[int] = set()
        if not self._test_file():
            for found in summaries.eval_loops():
                calls = [c for c in found.calls if id(c) not in covered]
                if calls and not self._hook(found.loop):
                    regions.append((found.loop, calls))
                    covered.update(id(c) for c in calls)
            for loop, loop_calls in evaluation(self.ctx).loops_entered_in_eval():
                calls = [c for c in loop_calls if id(c) not in covered]
                if calls and not self._hook(loop):
                    regions.append((loop, calls))
                    covered.update(id(c) for c in calls)
            for method, method_calls in evaluation(self.ctx).inference_methods():
                calls = [c for c in method_calls if id(c) not in covered]
                if calls:
                    regions.append((method, calls))
                    covered.update(id(c) for c in calls)
            for loop, loop_calls in summaries.inference_loops():
                calls = [c for c in loop_calls if id(c) not in covered]
                if calls and not self._hook(loop):
                    regions.append((loop, calls))
                    covered.update(id(c) for c in calls)
                    inference.add(id(loop))
        frozen: _Frozen | None = None
        for region, calls in regions:
            if self._differentiates(region) or not self._callers_may_enable(region):
                continue
            if self._outputs_returned_to_backward(region):
                continue
            for call in calls:
                if self.ctx.grad_disabled(call) or self.ctx.under_unknown_with(call, _TRANSPARENT_WITH):
                    continue
                if self._runs_once(call) or self._unreachable(call):
                    continue
                if frozen is None:
                    frozen = _Frozen(self.ctx)
                if frozen.covers(call.func):
                    continue
                outside = self._outside.get(id(self._function_of(region)), [])
                where = ""
                if outside:
                    program = self.ctx.program
                    assert program is not None
                    where = f" (called with autograd on from {', '.join(program.where(c, s) for c, s in outside[:3])})"
                if isinstance(region, _FUNCTIONS) and self.ctx.enclosing_loop(call) is None:
                    text = (f"`{self.ctx.segment(call.func)}` runs in the evaluation function `{region.name}` with "
                            f"autograd on{where}: the forward records a graph (and keeps every activation) it never "
                            f"uses; decorate `{region.name}` with `@torch.no_grad()`")
                elif isinstance(region, ast.stmt) and not isinstance(region, _REGION_BLOCKS):
                    text = (f"`{self.ctx.segment(call.func)}` runs after `.eval()` with autograd on{where}: the "
                            f"evaluation forward records a graph (and keeps every activation) it never uses; wrap "
                            f"it in `torch.no_grad()`")
                elif id(region) in inference:
                    text = (f"`{self.ctx.segment(call.func)}` runs in a loop of a script that never trains, with "
                            f"autograd on{where}: every step records a graph nothing uses; wrap the loop in "
                            f"`torch.no_grad()` or `torch.inference_mode()`")
                else:
                    text = (f"`{self.ctx.segment(call.func)}` runs in an evaluation loop with autograd on{where}: "
                            f"every batch records a graph it never uses; wrap the loop in `torch.no_grad()` or "
                            f"`torch.inference_mode()`")
                self.report(
                    call,
                    text,
                    related=tuple(self.ctx.program.place(c, s, "called here with autograd on")  # type: ignore[union-attr]
                                  for c, s in outside[:3]),
                )
                break

    def _runs_once(self, call: ast.Call) -> bool:
        """The loop around the call ends in an unconditional ``break``: one batch to look at, not a loop."""
        loop = self.ctx.enclosing_loop(call)
        return loop is not None and bool(loop.body) and isinstance(loop.body[-1], ast.Break)

    def _unreachable(self, node: ast.AST) -> bool:
        """After a ``return`` or ``raise`` of the same block (code left behind an early ``return``)."""
        child = node
        for parent in self.ctx.ancestors(node):
            if isinstance(child, ast.stmt):
                for field in ("body", "orelse", "finalbody"):
                    stop = self._first_exit(parent, field)
                    if stop is not None and stop < position(child) and any(s is child for s in
                                                                           getattr(parent, field)):
                        return True
            if isinstance(parent, (*_FUNCTIONS, ast.ClassDef, ast.Lambda)):
                return False
            child = parent
        return False

    def _named(self, name: str) -> bool:
        """Whether the file calls or names a function (``main()``, ``fire.Fire(main)``, ``obj.main``)."""
        if self._names is None:
            self._names = {n.id for n in self.ctx.nodes(ast.Name)} | {n.attr for n in self.ctx.nodes(ast.Attribute)}  # type: ignore[attr-defined]
        return name in self._names

    def _first_exit(self, parent: ast.AST, field: str) -> tuple[int, int] | None:
        """Position of the first ``return``/``raise`` of a statement list (cached)."""
        key = (id(parent), field)
        if key not in self._exits:
            block = getattr(parent, field, None)
            exits = [position(s) for s in block if isinstance(s, (ast.Return, ast.Raise))] if isinstance(
                block, list) else []
            self._exits[key] = exits[0] if exits else None
        return self._exits[key]

    def _file_turns_grad_off(self) -> bool:
        """``torch.set_grad_enabled(...)`` as a statement (not ``True``): autograd may be off from there on."""
        for stmt in self.ctx.nodes(ast.Expr):
            call = stmt.value  # type: ignore[attr-defined]
            if (isinstance(call, ast.Call) and last_name(call.func) in ("set_grad_enabled", "_set_grad_enabled")
                    and not (call.args and is_const(call.args[0], True))):
                return True
        return False

    def _test_file(self) -> bool:
        base = self.ctx.path.replace("\\", "/").rsplit("/", 1)[-1]
        if base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py":
            return True
        return any(q.split(".", 1)[0] in ("pytest", "unittest") for q in self.ctx.aliases.values())

    def _hook(self, loop: ast.AST) -> bool:
        """A loop in a method of an ``nn.Module``/Lightning class, or in a ``*_step``/``on_*`` hook."""
        fn = self.ctx.scope(loop)
        if not isinstance(fn, _FUNCTIONS):
            return False
        if fn.name.endswith("_step") or fn.name.startswith("on_"):
            return True
        cls = self.ctx.enclosing_class(fn)
        return cls is not None and cls.name in self.ctx.module_classes

    def _differentiates(self, region: ast.AST) -> bool:
        """Gradients are wanted: the evaluation function (or, for a loop of any other code, the loop itself
        and the functions it calls) differentiates, steps or zeroes; or a value the loop computes or collects
        reaches a ``backward()`` after it."""
        summaries = functions(self.ctx)
        if summaries.trains(region):
            return True
        for node in ast.walk(region):
            if isinstance(node, ast.Attribute) and node.attr in _DIFFERENTIATING | {"requires_grad"}:
                return True
            if isinstance(node, ast.Name) and node.id in ("grad", "enable_grad", "vjp", "jacrev", "jacfwd"):
                return True
        return not isinstance(region, _FUNCTIONS) and summaries.flows_into_backward(region)

    def _outputs_returned_to_backward(self, region: ast.AST) -> bool:
        """The function holding the loop returns something, and a caller's result of it reaches a
        ``backward()`` (features or log-probabilities collected for a later update)."""
        fn = region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)
        if not isinstance(fn, _FUNCTIONS):
            return False
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in walk_own(fn.body)):
            return True  # a generator hands each output to its consumer
        if not any(isinstance(r, ast.Return) and r.value is not None and not _constant(r.value)
                   for r in walk_own(fn.body)):
            return False
        sites = [(self.ctx, site) for site in self.ctx.call_sites(fn)]
        if self.ctx.program is not None:
            sites += self.ctx.program.callers(self.ctx, fn)
        return any(_differentiated_result(ctx, site) for ctx, site in sites)

    def _function_of(self, region: ast.AST) -> ast.AST:
        return region if isinstance(region, _FUNCTIONS) else self.ctx.scope(region)

    def _callers_may_enable(self, region: ast.AST) -> bool:
        """False when the function holding the loop (or one that calls it, two levels up) is decorated or is
        called with autograd off, or inside another context manager, also from another file of the run; and
        when it is a module-level function called from no file of the run, never named in its own, that leaves
        evaluation mode to its caller (no `model.eval()` of its own): its callers, outside the run, set the
        mode and may well turn autograd off with it."""
        first = self._function_of(region)
        if isinstance(first, _FUNCTIONS) and self.ctx.scope(first) is self.ctx.tree:
            outside = self.ctx.program.callers(self.ctx, first) if self.ctx.program is not None else []
            if outside:
                if not all(_may_enable(ctx, [ctx.scope(site)], site) for ctx, site in outside):
                    return False
                self._outside[id(first)] = outside
            elif not self._named(first.name) and not _sets_eval_mode(first) and not functions(self.ctx).trains(first):
                return False  # a function that trains has autograd on: its evaluation half is its own
        return _may_enable(self.ctx, [first])


def _may_enable(ctx: Context, frontier: list[ast.AST], site: ast.Call | None = None) -> bool:
    """False when ``site`` (a call) runs with autograd off or inside an unknown context manager, or when a
    function of ``frontier`` (or one that calls it in its file, two levels up) is decorated or is called so."""
    if site is not None and (ctx.grad_disabled(site) or ctx.under_unknown_with(site, _TRANSPARENT_WITH)):
        return False
    for _ in range(3):
        next_frontier = []
        for fn in frontier:
            if not isinstance(fn, _FUNCTIONS):
                continue
            if any(not _harmless_decorator(d) for d in fn.decorator_list):
                return False
            for call in ctx.call_sites(fn):
                if ctx.grad_disabled(call) or ctx.under_unknown_with(call, _TRANSPARENT_WITH):
                    return False
                next_frontier.append(ctx.scope(call))
            outer = ctx.scope(fn)
            if isinstance(outer, _FUNCTIONS):
                next_frontier.append(outer)
        frontier = next_frontier
    return True


def _differentiated_result(ctx: Context, site: ast.Call) -> bool:
    """Whether the result of a call reaches a ``backward()`` of the scope that makes it."""
    scope = ctx.scope(site)
    wanted = ctx.differentiated(scope) if isinstance(scope, (*_FUNCTIONS, ast.Module)) else set()
    for parent in ctx.ancestors(site):
        if method_call(parent, "backward"):
            return True
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = {dotted(n) for t in targets for n in ast.walk(t) if isinstance(n, (ast.Name, ast.Attribute))}
            return bool(names & wanted)
        if isinstance(parent, ast.stmt):
            return False
    return False


class _Frozen:
    """Modules of the file frozen as a whole, so that running them builds no graph: ``m.requires_grad_(False)``
    (also in a chain, ``Net().eval().requires_grad_(False)``), ``for p in m.parameters(): p.requires_grad =
    False`` (not under a condition on the parameter), or ``m`` passed to a function named like ``freeze`` or
    ``set_requires_grad`` or to a same-file function that sets ``requires_grad`` to False."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.names: set[str] = set()
        self._helpers: dict[int, set[str]] = {}
        for call in ctx.nodes(ast.Call):
            self._from_call(call)  # type: ignore[arg-type]
        for assign in ctx.nodes(ast.Assign):
            self._from_assignment(assign)  # type: ignore[arg-type]

    def covers(self, func: ast.AST) -> bool:
        """Whether the module called as ``func(...)`` is (part of) a module frozen as a whole."""
        name = dotted(func)
        if name is None or not self.names:
            return False
        candidates = {name} | _aliases(self.ctx, func)
        return any(same_or_below(c, frozen) for c in candidates for frozen in self.names)

    def _add(self, node: ast.AST) -> None:
        node = _unchain(node)
        name = dotted(node)
        if name is not None:
            self.names.add(name)
            self.names |= _aliases(self.ctx, node)

    def _from_call(self, call: ast.Call) -> None:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "requires_grad_" and _turns_off(call):
            receiver = _unchain(func.value)
            if isinstance(receiver, ast.Call):  # Net().eval().requires_grad_(False): the assigned name
                stmt = self.ctx.parent(call)
                while stmt is not None and not isinstance(stmt, ast.stmt):
                    stmt = self.ctx.parent(stmt)
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    self._add(stmt.targets[0])
                return
            source = self._parameters_of(receiver, call)
            if source is not None:
                self._add(source)
            elif self.ctx.is_module(receiver):
                self._add(receiver)
            return
        name = (last_name(func) or "").lower()
        summaries = functions(self.ctx)
        frozen_args: list[ast.AST] = []
        for fn in summaries.targets(call):  # a same-file helper: the arguments of the parameters it freezes
            frozen = self._frozen_params(fn)
            if frozen:
                bound = summaries.bind(call, fn)
                frozen_args += [bound[p] for p in frozen if bound.get(p) is not None]  # type: ignore[misc]
        if not frozen_args and ("freeze" in name or "requires_grad" in name):
            frozen_args = [*call.args, *(kw.value for kw in call.keywords)]  # freeze(model), tw.freeze(...)
        for arg in frozen_args:
            for element in (arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]):
                if dotted(_unchain(element)) is not None:
                    self._add(element)

    def _frozen_params(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
        """Parameters of a same-file function whose ``requires_grad`` it turns off: ``def freeze(net):
        net.requires_grad_(False)``, ``def set_requires_grad(nets, flag): for net in nets: for p in
        net.parameters(): p.requires_grad = flag`` (cached)."""
        cached = self._helpers.get(id(fn))
        if cached is None:
            params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
            cached = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and not is_const(node.value, True):
                    receivers = [t.value for t in node.targets
                                 if isinstance(t, ast.Attribute) and t.attr == "requires_grad"]
                elif method_call(node, "requires_grad_") and _turns_off(node):  # type: ignore[arg-type]
                    receivers = [node.func.value]  # type: ignore[attr-defined]
                else:
                    continue
                names = {n.id for r in receivers for n in ast.walk(r) if isinstance(n, ast.Name)}
                for parent in self.ctx.ancestors(node):  # the loops it runs in: for p in net.parameters()
                    if parent is fn:
                        break
                    if isinstance(parent, (ast.For, ast.AsyncFor)):
                        names |= {n.id for n in ast.walk(parent.iter) if isinstance(n, ast.Name)}
                cached |= names & params
            self._helpers[id(fn)] = cached
        return cached

    def _parameters_of(self, receiver: ast.AST, at: ast.AST) -> ast.AST | None:
        """``m`` when ``receiver`` is ``p`` of ``for p in m.parameters()`` (or of a comprehension) and ``at``
        runs for every parameter (no condition on the parameter or its name)."""
        if not isinstance(receiver, ast.Name):
            return None
        for b in self.ctx.bindings_of(receiver, at):
            if b.kind != "for" or not method_call(b.iter, "parameters", "named_parameters"):
                continue
            if b.unpacked and b.index != 1:
                continue
            loop = b.stmt
            if isinstance(loop, ast.comprehension):
                if loop.ifs:
                    return None
            elif not self.ctx.is_inside(at, loop) or self._conditional(at, loop):
                return None
            return b.iter.func.value  # type: ignore[union-attr]
        return None

    def _from_assignment(self, assign: ast.Assign) -> None:
        """``p.requires_grad = False`` in a loop over ``m.parameters()``."""
        for target in assign.targets:
            if not (isinstance(target, ast.Attribute) and target.attr == "requires_grad"):
                continue
            if is_const(assign.value, True):
                continue
            source = self._parameters_of(target.value, assign)
            if source is not None:
                self._add(source)

    def _conditional(self, node: ast.AST, loop: ast.AST) -> bool:
        """Whether ``node`` sits under an ``if`` (or ``continue``/``break`` guard) that reads the loop's target."""
        targets = {n.id for n in ast.walk(getattr(loop, "target", loop)) if isinstance(n, ast.Name)}
        for parent in self.ctx.ancestors(node):
            if parent is loop:
                break
            if isinstance(parent, (ast.If, ast.IfExp, ast.While)):
                used = {n.id for n in ast.walk(parent.test) if isinstance(n, ast.Name)}
                if used & targets:
                    return True
        for sub in ast.walk(loop):  # for name, p in ...: if "fc" in name: continue
            if isinstance(sub, ast.If) and any(isinstance(s, (ast.Continue, ast.Break)) for s in sub.body):
                used = {n.id for n in ast.walk(sub.test) if isinstance(n, ast.Name)}
                if used & targets:
                    return True
        return False


def _sets_eval_mode(fn: ast.AST) -> bool:
    """``x.eval()`` or ``x.train(False)`` somewhere in a function's own body."""
    return any(is_eval_call(n) for n in walk_own(fn.body))  # type: ignore[attr-defined]


def _turns_off(call: ast.Call) -> bool:
    """``requires_grad_(False)`` or ``requires_grad_(flag)``: not ``requires_grad_()`` / ``(True)``."""
    values = [*call.args, *(kw.value for kw in call.keywords if kw.arg == "requires_grad")]
    return bool(values) and not is_const(values[0], True)


def _unchain(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
        "to", "cuda", "cpu", "eval", "train", "float", "half", "double", "bfloat16", "requires_grad_"
    ):
        node = node.func.value
    return node


def _aliases(ctx: Context, node: ast.AST) -> set[str]:
    """Other names of the same module: ``self.model = model`` -> ``model`` (one step, either side)."""
    found: set[str] = set()
    for b in ctx.bindings_of(node):
        if b.kind == "assign" and not b.unpacked and b.value is not None:
            name = dotted(_unchain(b.value))
            if name is not None:
                found.add(name)
    name = dotted(node)
    for key, bindings in ctx.attr_bindings.items():
        if any(b.kind == "assign" and b.value is not None and dotted(_unchain(b.value)) == name for b in bindings):
            found.add(key)
    return found


def _constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) or (
        isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant) for e in node.elts)
    )


def _harmless_decorator(decorator: ast.AST) -> bool:
    name = dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
    if isinstance(decorator, ast.Call) and name.endswith("set_grad_enabled"):
        return bool(decorator.args) and is_const(decorator.args[0], True)
    last = name.rsplit(".", 1)[-1]
    if last.startswith("register") or name.endswith("enable_grad"):
        return True  # a registry (`@register_train("example")`, `@MODELS.register_module()`) hands the function back
    if name in ("hydra.main", "main") or name.split(".", 1)[0] == "click":
        return True  # command-line entry points: they parse arguments, autograd stays as it was
    return last in ("staticmethod", "classmethod", "property", "abstractmethod", "override")
