"""Per-function and per-block summaries shared by the training-loop rules (TW104, TW105, TW106).

``Context`` answers questions about one node; this module answers questions that follow a call into the
same-file function it calls, or read a block's statements in order:

- ``Functions.reached(container)``: the same-file functions that code in ``container`` calls (transitively),
  each with the call that reaches it and what each of its parameters stands for at the top call (``self``
  included), so that ``clear(opt_d)`` -> ``def clear(optimizer): optimizer.zero_grad()`` zeroes ``opt_d``;
- ``Functions.trains(container)``: whether code there (or a function it calls) runs a backward pass, steps
  an optimizer, zeroes gradients, or asks autograd for gradients: training, not evaluation;
- ``Functions.flows_into_backward(region)``: whether a value computed or collected in ``region`` reaches a
  ``backward()`` of the same scope after it (rollouts stored for a later update);
- ``Functions.eval_loops()``: loops that run a model after ``model.eval()`` (or ``model = ....eval()``) in
  the same block, with no ``model.train()`` in between;
- ``Functions.optimizer_modules(node)``: the modules whose ``.parameters()`` an optimizer was built from;
- ``Functions.flag_conditions(stmt, fn)``: the ``if flag:`` tests on parameters a statement runs under, and
  ``Functions.cudnn_switches(fn)``: the cuDNN switches a function sets (TW202);
- ``function_values(ctx, expr, at)``: the functions a callback stands for (``worker_init_fn=seed_worker``, a
  lambda, ``functools.partial(f, ...)``, ``self.method``, an instance's ``__call__``, a function imported from
  another file of the run);
- ``callees(ctx, call)``: the functions a call may call, in its own file or (through the program) another
  one; ``value_at_call(...)``: the constant a call gives a parameter, its default included;
  ``reaches_call(ctx, container, predicate)``: a call that code there makes, itself or through helpers of
  any file of the run; ``started_functions(ctx, call)``: the functions ``mp.spawn(f, ...)`` or
  ``Process(target=f)`` runs in new processes (TW202).

The evaluation questions that follow calls across functions and files (a function entered with its model
already in eval mode, inference methods of a non-module class) live in :mod:`.evaluation`.

Built lazily, once per ``Context`` (``ctx.analysis``, kept with the file); every answer leans towards
"unknown" (``None``) or towards silence, as the context does. No torch import, no recursion over the tree.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from trainwise.doctor.context import (
    DEFINITIONS,
    Binding,
    Context,
    argument,
    dotted,
    is_bound_method,
    is_const,
    is_param,
    keyword,
    last_name,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.calls import cacheable_predicate

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)

_STATEMENT_LISTS = ("body", "orelse", "finalbody")
# Calls that mean "this code trains": gradients are computed, applied or cleared.
_TRAINING_METHODS = frozenset({"backward", "manual_backward", "zero_grad", "retain_grad", "requires_grad_"})
_AUTOGRAD_FUNCTIONS = frozenset({"grad", "vjp", "jvp", "jacobian", "hessian", "jacrev", "jacfwd", "vmap_grad",
                                 "enable_grad", "set_grad_enabled", "backward"})
# Methods that return the module itself (model.to(device).eval()).
_CHAINABLE = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "eval", "train",
                        "requires_grad_"})
# nn.Module methods: on a module they are torch's, not a same-named method of a non-module class of the file
_MODULE_API = frozenset({"train", "eval", "to", "cuda", "cpu", "forward", "parameters", "named_parameters",
                         "state_dict", "load_state_dict", "zero_grad", "apply", "modules", "children",
                         "requires_grad_", "half", "float", "double", "register_forward_hook"})
_MAX_REACHED = 200  # functions followed from one container: enough for real files, bounded for generated ones
_COLLECTING = frozenset({"append", "extend", "insert", "add", "update", "appendleft", "put", "setdefault"})


@dataclass(frozen=True)
class Reached:
    """A same-file function reached from a container: ``call`` is the call that reaches it (in the container,
    or in a function reached before it); ``params`` maps each parameter the call fills to the expression it
    stands for at the top (``None`` when that is not a plain name or attribute chain)."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    call: ast.Call
    params: dict[str, ast.expr | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Switch:
    """A cuDNN switch a function sets, ``torch.backends.cudnn.<name> = <value>``: ``value`` the constant
    (``...`` when not one), ``param`` the parameter it reads instead (``cudnn.benchmark = benchmark``), and
    the ``if flag:`` tests on parameters it runs under."""

    name: str
    value: object
    param: str | None
    node: ast.Assign
    conditions: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True)
class EvalLoop:
    """A loop that runs ``model`` after ``marker`` (``model.eval()``) in the same block."""

    marker: ast.stmt
    model: str
    loop: ast.AST
    calls: tuple[ast.Call, ...]


class Functions:
    """Summaries of one file's functions and blocks, computed on demand and cached."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._trains: dict[int, bool] = {}
        self._seeds: dict[int, list[tuple[ast.AST, ast.Call]]] = {}
        self._flows: dict[int, tuple[set[int], set[str]]] = {}
        self._eval_loops: list[EvalLoop] | None = None
        self._inference_loops: list[tuple[ast.AST, tuple[ast.Call, ...]]] | None = None
        self._switches: dict[int, list[Switch]] = {}

    # ------------------------------------------------------------------------------------- call resolution
    def targets(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """Same-file functions a call may call, by name: ``f(...)`` a function that is not a method,
        ``self.f(...)`` / ``obj.f(...)`` a method of a class of the file. ``model.train()`` on a module is
        ``nn.Module.train`` unless a module class of the file defines it (not a ``def train(...)`` loop)."""
        func = call.func
        name = last_name(func)
        if name is None:
            return []
        found = []
        for fn in self.ctx.functions_named(name):
            owner = self.ctx.scope(fn)
            is_method = isinstance(owner, ast.ClassDef)
            if is_method != isinstance(func, ast.Attribute):
                continue
            if (is_method and name in _MODULE_API and dotted(func.value) != "self"  # type: ignore[attr-defined]
                    and self.ctx.is_module(func.value) and owner.name not in self.ctx.module_classes):  # type: ignore[attr-defined]
                continue
            found.append(fn)
        return found

    def bind(self, call: ast.Call, fn: ast.FunctionDef | ast.AsyncFunctionDef,
             outer: dict[str, ast.expr | None] | None = None) -> dict[str, ast.expr | None]:
        """Parameter name -> the expression passed for it (``self`` -> the receiver of a method call),
        translated through ``outer`` (the parameters of the function holding the call)."""
        args = fn.args
        params = [a.arg for a in (*args.posonlyargs, *args.args)]
        # a parameter the call does not fill (a default, *args, **kwargs) stands for nothing known
        bound: dict[str, ast.expr | None] = {a.arg: None for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                bound[extra.arg] = None
        is_method = self.ctx.enclosing_class(fn) is not None and self.ctx.scope(fn) is self.ctx.enclosing_class(fn)
        static = any(last_name(d) == "staticmethod" for d in fn.decorator_list)
        if is_method and not static and params and isinstance(call.func, ast.Attribute):
            bound[params[0]] = call.func.value
            params = params[1:]
        elif is_method and not static and params and params[0] in ("self", "cls"):
            params = params[1:]
        for name, arg in zip(params, call.args):
            if isinstance(arg, ast.Starred):
                break
            bound[name] = arg
        for kw in call.keywords:
            if kw.arg in bound:
                bound[kw.arg] = kw.value
        if outer is None:
            return bound
        return {name: self.translate(expr, outer) for name, expr in bound.items()}

    def translate(self, expr: ast.expr | None, params: dict[str, ast.expr | None]) -> ast.expr | None:
        """``expr`` (inside a reached function) as the expression it stands for at the top: a parameter is
        replaced by its argument; anything else that starts from a parameter, or is not a plain name or
        attribute chain, is ``None``; names that are not parameters stay as they are (globals, ``self.x``
        when ``self`` was not bound)."""
        if expr is None or dotted(expr) is None:
            return None
        root = expr
        while isinstance(root, ast.Attribute):
            root = root.value
        assert isinstance(root, ast.Name)
        if root.id not in params:
            return expr
        if root is expr:
            return params[root.id]
        base = params[root.id]
        if base is None or dotted(base) is None:
            return None
        if dotted(base) == root.id:  # self.method() calling self.helper(): same receiver, same nodes
            return expr
        return None

    def reached(self, container: ast.AST, depth: int = 3) -> list[Reached]:
        """Same-file functions that calls in ``container`` reach, transitively (``depth`` levels): once per
        call that reaches them, so that ``clear(opt_d)`` and ``clear(opt_g)`` both count (at most 200)."""
        found: list[Reached] = []
        seen: set[tuple[int, int]] = set()  # (function, call): clear(opt_d) and clear(opt_g) both count
        frontier: list[tuple[ast.AST, dict[str, ast.expr | None] | None]] = [(container, None)]
        for _ in range(depth):
            next_frontier: list[tuple[ast.AST, dict[str, ast.expr | None] | None]] = []
            for node, outer in frontier:
                for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                    for fn in self.targets(call):
                        if fn is container or (id(fn), id(call)) in seen or len(found) >= _MAX_REACHED:
                            continue
                        seen.add((id(fn), id(call)))
                        params = self.bind(call, fn, outer)
                        found.append(Reached(fn, call, params))
                        next_frontier.append((fn, params))
            frontier = next_frontier
            if not frontier:
                break
        return found

    # ----------------------------------------------------------------------------------------- training
    def trains(self, container: ast.AST, depth: int = 2) -> bool:
        """Whether code in ``container`` or a same-file function it calls computes, applies or clears
        gradients: ``backward()``, ``optimizer.step()``, ``zero_grad()``, ``torch.autograd.grad``,
        ``requires_grad_()``, ``enable_grad()``, an assignment to ``.requires_grad``."""
        if self.trains_here(container):
            return True
        return any(self.trains_here(r.function) for r in self.reached(container, depth))

    def trains_here(self, container: ast.AST) -> bool:
        """Whether code in ``container`` itself (no call followed) trains; cached per container."""
        key = id(container)
        cached = self._trains.get(key)
        if cached is None:
            cached = any(self._training_node(n) for n in ast.walk(container))
            self._trains[key] = cached
        return cached

    def _training_node(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            if node.attr in _TRAINING_METHODS or node.attr == "requires_grad":
                return True
            if node.attr in _AUTOGRAD_FUNCTIONS and (dotted(node) or "").startswith(("torch.", "autograd.")):
                return True
        if isinstance(node, ast.Name) and node.id in ("grad", "backward", "enable_grad", "vjp", "jacrev", "jacfwd"):
            return self.ctx.qualname(node) is not None  # from torch.autograd import grad
        if method_call(node, "step"):
            receiver = node.func.value  # type: ignore[attr-defined]
            name = (dotted(receiver) or "").lower()
            return "sched" not in name and (self.ctx.is_optimizer(receiver) or "scaler" in name)
        return False

    def flows_into_backward(self, region: ast.AST) -> bool:
        """Whether a value bound or collected inside ``region`` reaches a ``backward()`` (or
        ``torch.autograd.grad``) of the same scope: outputs kept for a later update. (A backward inside the
        region itself is ``trains``' business.)"""
        feeding, keys = self._feeding(self.ctx.scope(region))
        if id(region) in feeding:
            return True
        collected = _collected_in(region)
        return any(key in collected or key.split(".", 1)[0] in collected for key in keys)

    def _feeding(self, scope: ast.AST) -> tuple[set[int], set[str]]:
        """For a scope: the ids of every node holding a binding whose value flows into one of its
        ``backward()`` calls (the binding statements and all their ancestors), and the dotted names read on
        the way. Computed once per scope, whatever region is asked about."""
        cached = self._flows.get(id(scope))
        if cached is not None:
            return cached
        feeding: set[int] = set()
        keys: set[str] = set()
        seen: set[tuple[str, int]] = set()
        work = [(expr, at, 0) for expr, at in self._backward_seeds(scope)]
        while work:
            expr, at, depth = work.pop()
            for ref in _references(expr):
                key = dotted(ref) or ""
                keys.add(key)
                if depth >= 6 or (key, id(at)) in seen:
                    continue
                seen.add((key, id(at)))
                for b in self._reaching(ref, at):
                    if b.kind == "for":  # a loop target is a batch, not a value computed in the scope
                        continue
                    if id(b.stmt) not in feeding:
                        feeding.add(id(b.stmt))
                        feeding.update(id(a) for a in self.ctx.ancestors(b.stmt))
                    if b.value is not None and b.kind in ("assign", "augassign", "walrus", "with"):
                        work.append((b.value, b.stmt, depth + 1))
        self._flows[id(scope)] = (feeding, keys)
        return feeding, keys

    def _backward_seeds(self, scope: ast.AST) -> list[tuple[ast.AST, ast.Call]]:
        """(differentiated expression, the call) for every ``backward()``/``autograd.grad`` of a scope."""
        cached = self._seeds.get(id(scope))
        if cached is not None:
            return cached
        body = scope.body if isinstance(scope, (*_FUNCTIONS, ast.Module)) else []  # type: ignore[attr-defined]
        seeds: list[tuple[ast.AST, ast.Call]] = []
        for node in walk_own(body):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("backward", "manual_backward"):
                seeds.append((func.value, node))
                seeds.extend((a, node) for a in node.args)
            elif last_name(func) in ("grad", "backward") and (self.ctx.qualname(func) or "").startswith("torch."):
                seeds.extend((a, node) for a in node.args)
        self._seeds[id(scope)] = seeds
        return seeds

    def _reaching(self, ref: ast.AST, at: ast.AST) -> list[Binding]:
        """The binding of ``ref`` last before ``at`` in the source, a loop enclosing ``at`` included (so that
        ``x = x.to(device)`` reads the loop's ``x``); all of them when none is before."""
        return self.ctx.last_bound_before(ref, at)

    # -------------------------------------------------------------------------------------- evaluation
    def eval_loops(self) -> list[EvalLoop]:
        """Loops that call a model after ``model.eval()`` / ``model.train(False)`` / ``model = ....eval()``
        in the same statement list, before any ``model.train()``: the outermost such loop of each later
        statement, with the calls of that model (or of its submodules) in it."""
        if self._eval_loops is not None:
            return self._eval_loops
        found: list[EvalLoop] = []
        if not any(method_call(c, "eval", "train") for c in self.ctx.nodes(ast.Call)):
            self._eval_loops = found
            return found
        for statements in self._statement_lists():
            for i, stmt in enumerate(statements):
                model = self.eval_marker(stmt)
                if model is None:
                    continue
                for later in statements[i + 1:]:
                    if self.sets_train_mode(later, model) or self.eval_marker(later) == model:
                        break  # back to training, or a new marker of the same model that takes over
                    for loop in outer_loops(later):
                        calls = tuple(c for c in self.model_calls(loop) if _same_or_below(dotted(c.func), model))
                        if calls:
                            found.append(EvalLoop(stmt, model, loop, calls))
        self._eval_loops = found
        return found

    def inference_loops(self) -> list[tuple[ast.AST, tuple[ast.Call, ...]]]:
        """The data loops of a script that never trains, with the model calls each runs: the file computes,
        applies and clears no gradient anywhere, and a loop over data (``while not done``, a loader, ``for step
        in range(num_steps)``) in its top-level code, or in a same-file function that code calls (three levels),
        runs a model. Such a file is a program of its own (a play, predict or demo script): nothing in it wants
        the graph its forwards record."""
        if self._inference_loops is not None:
            return self._inference_loops
        found: list[tuple[ast.AST, tuple[ast.Call, ...]]] = []
        self._inference_loops = found
        tree = self.ctx.tree
        if self.trains_here(tree):
            return found
        scopes: list[ast.AST] = [tree]
        frontier: list[ast.AST] = [tree]
        for _ in range(3):
            calls = [n for scope in frontier for n in walk_own(scope.body) if isinstance(n, ast.Call)]  # type: ignore[attr-defined]
            frontier = [fn for call in calls for fn in self.targets(call) if all(fn is not s for s in scopes)]
            frontier = list({id(fn): fn for fn in frontier}.values())
            scopes += frontier
        for scope in scopes:
            taken: list[ast.AST] = []
            for loop in walk_own(scope.body):  # type: ignore[attr-defined]
                if not isinstance(loop, _LOOPS) or any(self.ctx.is_inside(loop, t) for t in taken):
                    continue
                if self.ctx.iterates_over_data(loop):
                    calls = self.model_calls(loop)
                    if calls:
                        taken.append(loop)
                        found.append((loop, tuple(calls)))
        if found and self._trains_elsewhere():
            found.clear()
        return found

    def _trains_elsewhere(self) -> bool:
        """Whether the file builds an optimizer, or calls a function of another file of the run or a member of
        a module that trains (``fit_one_epoch(...)`` from ``utils/``, ``discriminator.update(batch)``)."""
        program = self.ctx.program
        for call in self.ctx.nodes(ast.Call):
            if (self.ctx.qualname(call.func) or "").startswith("torch.optim."):  # type: ignore[attr-defined]
                return True
            func = call.func  # type: ignore[attr-defined]
            if isinstance(func, ast.Attribute) and self.ctx.is_module(func.value):
                kinds = program.member_kinds(self.ctx, func.attr) if program is not None else \
                    self.ctx.member_kinds_here(func.attr)
                if "trains" in kinds:
                    return True
            if program is not None:
                found = program.callee(self.ctx, call)  # type: ignore[arg-type]
                if found is not None and functions(found[0]).trains(found[1]):
                    return True
        return False

    def _statement_lists(self) -> Iterator[list[ast.stmt]]:
        stack: list[ast.AST] = [self.ctx.tree]
        while stack:
            for statements in blocks_of(stack.pop()):
                yield statements
                stack.extend(statements)

    def eval_marker(self, stmt: ast.stmt) -> str | None:
        """``model.eval()`` / ``model.train(False)`` as a statement, or ``model = <chain>.eval()``: the model."""
        if isinstance(stmt, ast.Expr):
            call = stmt.value
            while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                if is_eval_call(call):
                    receiver = unchain(call.func.value)
                    name = dotted(receiver)
                    if name is not None and self.ctx.is_module(receiver):
                        return name
                    return None
                if call.func.attr not in _CHAINABLE:
                    return None
                call = call.func.value
            return None
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            if len(targets) != 1 or dotted(targets[0]) is None or value is None:
                return None
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                if is_eval_call(value):
                    return dotted(targets[0])
                if value.func.attr not in _CHAINABLE:
                    return None
                value = value.func.value
        return None

    def sets_train_mode(self, stmt: ast.stmt, model: str) -> bool:
        """Whether ``stmt`` puts ``model``, a part of it, a module around it or an unknown one back in train mode."""
        for node in walk_own([stmt]):
            if method_call(node, "train") and not is_eval_call(node):  # type: ignore[arg-type]
                name = dotted(unchain(node.func.value))  # type: ignore[attr-defined]
                if name is None or _same_or_below(model, name) or _same_or_below(name, model):
                    return True
        return False

    def model_calls(self, region: ast.AST) -> list[ast.Call]:
        """The calls of a model (not of a loss) in ``region``, functions defined there excluded."""
        return [n for n in walk_own(ast.iter_child_nodes(region))
                if isinstance(n, ast.Call) and dotted(n.func) is not None and self.ctx.is_model_call(n)
                and not self.ctx.is_loss_call(n)]

    # --------------------------------------------------------------------------------------- optimizers
    def optimizer_modules(self, node: ast.AST) -> set[str] | None:
        """Dotted names of the modules an optimizer was built from (``Adam(netG.parameters())`` ->
        ``{"netG"}``; param groups, ``chain``, ``list(a.parameters()) + ...`` included); ``None`` when any
        place that builds it is unknown (a parameter, a factory, a list of tensors)."""
        bindings = [b for b in self.ctx.bindings_of(node) if b.kind != "del"]
        if not bindings:
            return None
        modules: set[str] = set()
        for b in bindings:
            if b.kind != "assign" or b.unpacked or not isinstance(b.value, ast.Call):
                return None
            found = self._parameter_sources(b.value, b.stmt, 0)
            if not found:
                return None
            modules |= found
        return modules

    def _parameter_sources(self, expr: ast.AST, at: ast.AST, depth: int) -> set[str] | None:
        found: set[str] = set()
        for node in ast.walk(expr):
            if method_call(node, "parameters", "named_parameters"):
                name = dotted(unchain(node.func.value))  # type: ignore[attr-defined]
                if name is None:
                    return None
                found.add(name)
            elif isinstance(node, ast.Name) and depth < 3 and node is not getattr(expr, "func", None):
                for b in self.ctx.reaching(node, at):
                    if b.kind == "assign" and b.value is not None and not b.unpacked:
                        more = self._parameter_sources(b.value, b.stmt, depth + 1)
                        if more:
                            found |= more
        return found or None


    # ------------------------------------------------------------------------------------- conditions
    def flag_conditions(self, stmt: ast.AST, fn: ast.AST) -> list[tuple[str, bool]] | None:
        """The ``if flag:`` / ``if not flag:`` tests on parameters of ``fn`` around ``stmt`` (``(flag, True)``
        in the body of ``if flag:``); None when a test on a parameter has another shape (``if args.x:``,
        ``if a and b:``). Tests that read no parameter are left out: they do not depend on the call."""
        out = []
        child = stmt
        for parent in self.ctx.ancestors(stmt):
            if parent is fn:
                return out
            if isinstance(parent, ast.If) and any(is_param(fn, n.id) for n in ast.walk(parent.test)
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

    # ---------------------------------------------------------------------------------------- cudnn
    def cudnn_switches(self, fn: ast.AST) -> list[Switch]:
        """The ``torch.backends.cudnn.deterministic``/``benchmark`` assignments of a function's own body, in
        order; one under a test on a parameter of another shape than ``if flag:`` is left out (unknown)."""
        cached = self._switches.get(id(fn))
        if cached is not None:
            return cached
        found: list[Switch] = []
        for node in walk_own(getattr(fn, "body", [])):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if not (isinstance(target, ast.Attribute) and target.attr in ("deterministic", "benchmark")
                        and self.ctx.qualname(target.value) == "torch.backends.cudnn"):
                    continue
                conditions = self.flag_conditions(node, fn)
                if conditions is None:
                    continue
                value = node.value
                param = value.id if isinstance(value, ast.Name) and is_param(fn, value.id) else None
                constant = value.value if isinstance(value, ast.Constant) else ...
                found.append(Switch(target.attr, constant, param, node, tuple(conditions)))
        found.sort(key=lambda s: position(s.node))
        self._switches[id(fn)] = found
        return found


def callees(ctx: Context, call: ast.Call) -> list[tuple[Context, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The functions ``call`` may call, each with its file's context: same-file functions by name (see
    ``Functions.targets``), or the function of another file of the run it imports."""
    found = [(ctx, fn) for fn in functions(ctx).targets(call)]
    if not found and ctx.program is not None:
        other = ctx.program.callee(ctx, call)
        if other is not None:
            found.append(other)
    return found


def reaches_call(ctx: Context, container: ast.AST, predicate: Callable[[ast.Call], bool], depth: int = 3) -> bool:
    """Whether a call satisfying ``predicate`` happens in ``container``, in a same-file helper it calls
    (``Context.reaches_call``), or in a function of another file of the run that one of them calls (followed
    the same way there, ``depth`` levels in all). Answered once per container, predicate and depth."""
    if ctx.reaches_call(container, predicate, depth):
        return True
    program = ctx.program
    if program is None or depth <= 0 or len(program.paths) < 2:
        return False
    if not cacheable_predicate(predicate):
        return _reaches_call_across(ctx, container, predicate, depth)
    key = ("reaches_call_across", id(container), predicate, depth)
    known = ctx._cache.get(key)  # type: ignore[arg-type]
    if known is not None and known[0] is container:  # type: ignore[index]
        return known[1]  # type: ignore[index, return-value]
    found = _reaches_call_across(ctx, container, predicate, depth)
    ctx._cache[key] = (container, found)  # type: ignore[index]
    return found


def _reaches_call_across(ctx: Context, container: ast.AST, predicate: Callable[[ast.Call], bool], depth: int) -> bool:
    program = ctx.program
    assert program is not None
    for node in (container, *ctx.helpers_called(container, depth)):
        for call in ctx.calls_within(node):
            found = program.callee(ctx, call)
            if found is not None and reaches_call(found[0], found[1], predicate, depth - 1):
                return True
    return False


def constant_of(ctx: Context, expr: ast.AST) -> object:
    """A literal, a name bound once to one, or a constant imported from another file of the run; ``...``."""
    return ctx.program.constant(ctx, expr) if ctx.program is not None else ctx.constant(expr)


def value_at_call(callee: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, caller: Context,
                  call: ast.Call) -> object:
    """The constant ``call`` (in ``caller``) gives the parameter ``name`` of ``fn`` (in ``callee``): the
    argument it passes, else the parameter's default; ``...`` when unknown."""
    method = is_bound_method(fn, callee.parent(fn))  # obj.f(...), Cls(...) for __init__: self is not passed
    passed = argument(fn, name, call, method=method)
    if passed is not None:
        return constant_of(caller, passed)
    default = argument(fn, name, call, method=method, default=True)
    return constant_of(callee, default) if default is not None else ...


def conditions_hold(callee: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                    conditions: tuple[tuple[str, bool], ...] | list[tuple[str, bool]], caller: Context,
                    call: ast.Call) -> bool:
    """Whether every ``if flag:`` test holds for the constants ``call`` passes (unknown values do not)."""
    for name, wanted in conditions:
        value = value_at_call(callee, fn, name, caller, call)
        if value is ... or bool(value) is not wanted:
            return False
    return True


def functions(ctx: Context) -> Functions:
    """The (cached) function summaries of one file."""
    return ctx.analysis(Functions)


def same_or_below(name: str | None, module: str) -> bool:
    """``model`` or ``model.encoder`` for ``model``: the module or one of its attributes."""
    return _same_or_below(name, module)


def _same_or_below(name: str | None, module: str) -> bool:
    return name is not None and (name == module or name.startswith(module + "."))


def is_eval_call(call: ast.AST) -> bool:
    """``x.eval()`` or ``x.train(False)`` / ``x.train(mode=False)``."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr == "eval":
        return not call.args and not call.keywords
    if call.func.attr == "train":
        values = [*call.args, *(kw.value for kw in call.keywords if kw.arg == "mode")]
        return len(values) == 1 and is_const(values[0], False)
    return False


def unchain(node: ast.AST) -> ast.AST:
    """``model.to(device).eval()`` -> ``model``: strip calls of methods that return the module."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CHAINABLE:
        node = node.func.value
    return node


def blocks_of(node: ast.AST) -> Iterator[list[ast.stmt]]:
    """The statement lists directly under ``node`` (a body, an ``else``, handlers' and cases' bodies)."""
    for name in _STATEMENT_LISTS:
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield value
    for holder in (*(getattr(node, "handlers", ()) or ()), *(getattr(node, "cases", ()) or ())):
        yield holder.body


def outer_loops(stmt: ast.stmt) -> list[ast.AST]:
    """The outermost loops (``for``/``while``, or a comprehension's expression) in a statement."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, DEFINITIONS):
            continue
        if isinstance(node, (*_LOOPS, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            found.append(node)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _references(expr: ast.AST) -> list[ast.AST]:
    """Names and attribute chains read in an expression (``outputs.loss`` and ``outputs``)."""
    refs: list[ast.AST] = []
    for node in ast.walk(expr):
        if isinstance(node, (ast.Name, ast.Attribute)) and dotted(node) is not None:
            refs.append(node)
    return refs


def _collected_in(region: ast.AST) -> set[str]:
    """Dotted names that ``region`` adds to in place: ``xs.append(...)``, ``xs[i] = ...``, ``xs += ...``."""
    found: set[str] = set()
    for node in ast.walk(region):
        if method_call(node, *_COLLECTING):
            name = dotted(node.func.value)  # type: ignore[attr-defined]
            if name is not None:
                found.add(name)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and dotted(target.value) is not None:
                    found.add(dotted(target.value))  # type: ignore[arg-type]
                elif isinstance(node, ast.AugAssign) and dotted(target) is not None and not isinstance(
                    node.value, ast.Constant
                ):
                    found.add(dotted(target))  # type: ignore[arg-type]
    return found


@dataclass(frozen=True)
class FunctionValue:
    """A function named as a value (a callback such as ``worker_init_fn=seed_worker``): the function, its
    file's context, and how many of its leading positional parameters are already filled when it is called
    back (``self`` of a bound method, the positional arguments of ``functools.partial``)."""

    ctx: Context
    function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    bound: int = 0

    def parameter(self, index: int) -> str | None:
        """The name of the ``index``-th positional parameter the caller fills (0: the first argument it
        passes), None when ``*args`` or a missing parameter takes it."""
        args = self.function.args
        positional = [a.arg for a in (*args.posonlyargs, *args.args)]
        index += self.bound
        return positional[index] if index < len(positional) else None


def function_values(ctx: Context, expr: ast.AST, at: ast.AST, depth: int = 0) -> list[FunctionValue] | None:
    """The functions an expression passed as a callback stands for: a lambda, a function of the file (also
    through a variable bound once), ``self.method`` of the enclosing class, ``functools.partial(f, ...)``, the
    ``__call__`` of an instance built there (``SeedWorkers(seed)``), either branch of ``a if c else b``, or a
    function of another file of the run it imports. ``[]`` for
    ``None``; None when any part is unknown (a parameter, a library function, a body that cannot be seen)."""
    if depth > 4:
        return None
    if isinstance(expr, ast.Constant) and expr.value is None:
        return []
    if isinstance(expr, ast.Lambda):
        return [FunctionValue(ctx, expr)]
    if isinstance(expr, ast.IfExp):
        body = function_values(ctx, expr.body, at, depth + 1)
        orelse = function_values(ctx, expr.orelse, at, depth + 1)
        return None if body is None or orelse is None else body + orelse
    if isinstance(expr, ast.Call):
        if last_name(expr.func) != "partial":
            return _instance_call(ctx, expr, at)
        if not expr.args or any(isinstance(a, ast.Starred) for a in expr.args):
            return None
        if ctx.qualname(expr.func) not in (None, "functools.partial"):
            return None
        inner = function_values(ctx, expr.args[0], at, depth + 1)
        if inner is None:
            return None
        extra = len(expr.args) - 1
        return [FunctionValue(v.ctx, v.function, v.bound + extra) for v in inner]
    if isinstance(expr, ast.Name):
        found = ctx.lookup(expr.id, at)
        defs = [b.stmt for b in found if b.kind == "def"]
        if found and len(defs) == len(found) == 1 and isinstance(defs[0], _FUNCTIONS):
            return [FunctionValue(ctx, defs[0])]
        reaching = ctx.reaching(expr, at)
        if found and not all(b.kind == "import" for b in found):
            if len(reaching) == 1 and reaching[0].kind == "assign" and not reaching[0].unpacked:
                value = reaching[0].value
                return function_values(ctx, value, reaching[0].stmt, depth + 1) if value is not None else None
            return None
    elif isinstance(expr, ast.Attribute) and dotted(expr.value) == "self":
        cls = ctx.enclosing_class(at)
        methods = [s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name == expr.attr] if cls else []
        if len(methods) != 1 or ctx.attr_bindings.get(f"self.{expr.attr}"):
            return None
        method = methods[0]
        if any(last_name(d) == "classmethod" for d in method.decorator_list):
            return None
        return [FunctionValue(ctx, method, 1 if is_bound_method(method, cls) else 0)]
    if ctx.program is None:
        return None
    symbol = ctx.program.resolve(ctx, expr)
    other = ctx.program.function(symbol) if symbol is not None and symbol.name and "." not in symbol.name else None
    return [FunctionValue(other[0], other[1])] if other is not None else None


def _instance_call(ctx: Context, expr: ast.Call, at: ast.AST) -> list[FunctionValue] | None:
    """``SeedWorkers(seed)`` passed as a callback: the ``__call__`` its class (of the file, or of another file of
    the run) defines in its own body, bound to the instance; None for anything else."""
    found = None
    if isinstance(expr.func, ast.Name):
        defs = [b.stmt for b in ctx.lookup(expr.func.id, at) if b.kind == "def"]
        if len(defs) == 1 and isinstance(defs[0], ast.ClassDef):
            found = (ctx, defs[0])
    if found is None and ctx.program is not None:
        found = ctx.program.class_of(ctx, expr.func)
    if found is None:
        return None
    calls = [s for s in found[1].body if isinstance(s, _FUNCTIONS) and s.name == "__call__"]
    return [FunctionValue(found[0], calls[0], 1)] if len(calls) == 1 else None


# Calls that run a function in new processes, and the argument that names it: ``mp.spawn(main_worker, ...)``
# (always a fresh interpreter), ``Process(target=run)`` (forked or fresh, as the start method says).
_SPAWNERS = {"torch.multiprocessing.spawn": "fn", "torch.multiprocessing.start_processes": "fn",
             "torch.multiprocessing.spawn.spawn": "fn", "torch.multiprocessing.spawn.start_processes": "fn"}
_PROCESSES = frozenset({"multiprocessing.Process", "multiprocessing.context.Process", "torch.multiprocessing.Process"})


def started_functions(ctx: Context, call: ast.Call) -> tuple[str, list[FunctionValue]] | None:
    """The functions a call starts in new processes, with how (``"spawn"``: ``torch.multiprocessing.spawn`` and
    ``start_processes``, whose processes never inherit the parent's state; ``"process"``: ``Process(target=f)``);
    None when the call starts none or the function cannot be seen (see ``function_values``)."""
    q = ctx.qualname(call.func)
    if q in _SPAWNERS:
        kw = keyword(call, _SPAWNERS[q])
        target = kw.value if kw is not None else (call.args[0] if call.args else None)
        how = "spawn"
    elif q in _PROCESSES:
        kw = keyword(call, "target")
        target = kw.value if kw is not None else None
        how = "process"
    else:
        return None
    if target is None or isinstance(target, ast.Starred):
        return None
    found = function_values(ctx, target, call)
    return (how, found) if found else None
