"""TW102 graph-kept-across-iterations: ``total += loss`` or ``losses.append(loss)`` keeps every step's graph."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainwise.doctor.context import dotted, is_const, last_name, method_call, names_in, position
from trainwise.doctor.context.functions import functions
from trainwise.doctor.rule import Rule

if TYPE_CHECKING:
    from trainwise.doctor.context import Context
    from trainwise.doctor.rule import Finding


class GraphKeptAcrossIterations(Rule):
    """A tensor that carries an autograd graph is added to a running total or a list that outlives the step.

    ## What it does
    Finds a loss, or an output of a model call, that is added to a running total (`total += loss`,
    `total = total + loss`), to an entry of a dict of statistics (`stats["loss"] += loss`,
    `metrics["loss"] = metrics["loss"] + loss`), or appended to a list (`losses.append(loss)`,
    `history["loss"].append(loss)`, `log.append({"step": step, "loss": loss})`) that is defined outside the
    loop, while autograd is on. A running total or list that a function returns counts too when that
    function runs `backward()` itself (`loss.backward()`, `scaler.scale(loss).backward()`,
    `accelerator.backward(loss)`): it returns `running / len(loader)` or the list of losses for logging or
    plotting, not for its caller to backpropagate. A loss handed to a method that adds it to its object's
    state counts too (`meter.update(loss, n)` where every class of the project defining `update` does
    `self.sum += val * n` or appends its argument), unless the object comes from a library
    (`torchmetrics.MeanMetric()`) or a class of the project defines the method without keeping it.

    ## Why is this bad?
    A tensor computed with autograd on holds its whole computation graph, activations included. A running
    total of such tensors is itself part of one growing graph: no step's graph can be freed, memory grows
    every step until the run dies out of memory, and each step gets slower. What the total needs is the
    number: `loss.item()` (or `loss.detach()` to keep a tensor on the device and avoid a host sync).

    The rule stays silent when the accumulation runs under `torch.no_grad()` or `torch.inference_mode()`
    (or in a function decorated with them, or a Lightning `validation_step`), when the total or list is
    itself differentiated (`total.backward()`, or `sum(losses).backward()` within the step), when it is
    returned by a function that leaves the backward to its caller (a function that runs no `backward()` of
    its own, or only with `retain_graph=True`: a loss summed over micro-batches or heads), when the list is
    re-created every iteration (or every epoch, while the loop that fills it takes no training step: a few
    evaluation outputs kept for a plot do not grow with the run), and on values that are not tensors with a
    graph (`loss.item()`, `loss.detach()`, `float(loss)`, `len(batch)`, `OutputModel(...)`: a class being
    constructed). A list of model outputs returned by a function without a `backward()` stays silent too: the
    caller may well compute a loss from it. So does a list that lives within one call of a function (a
    `forward` building the levels of a feature pyramid in one loop and reading them in the next): made anew
    by the call (`[]`, `0`, or what a forward it calls returns), filled by loops that take no training step
    (no `backward()`, optimizer `step()` or `zero_grad()`, here or in a helper of the file) and go over the
    model's structure (`enumerate(feature_maps)`, `range(self.num_levels)`), not over data (a loader,
    `batches`, `range(len(dataset))`, `next(it)`, a `while` loop); that holds one step's graph, which is
    wanted. A list over data stays reported even without a training step: an evaluation run with autograd on
    keeps every batch's graph.

    `trainwise lab kept-graph` measures it: a running total of loss tensors vs loss.item().

    ## Example
    ```python
    import torch.nn.functional as F

    running_loss = 0.0
    for inputs, targets in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        running_loss += loss
    ```

    ## Use instead
    ```python
    import torch.nn.functional as F

    running_loss = 0.0
    for inputs, targets in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
    ```

    ## Fix safety
    There is no automatic fix: whether `.item()` (a number, one host sync per step) or `.detach()` (a
    tensor on the device) is right depends on what the total is used for.
    """

    code = "TW102"
    name = "graph-kept-across-iterations"
    message = "a tensor with an autograd graph is accumulated across iterations; use .item() or .detach()"

    def __init__(self, ctx: Context, sink: list[Finding]) -> None:
        super().__init__(ctx, sink)
        self._kept: dict[int, set[str]] | None = None
        self._kept_anywhere: set[str] = set()

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        """``total += loss``, ``stats["loss"] += loss`` and ``outputs += [model(x)]``."""
        if not isinstance(node.op, (ast.Add, ast.Sub)):
            return
        value = node.value
        if isinstance(value, (ast.List, ast.Tuple)):
            for element in value.elts:
                if self._check(node, node.target, element, "added to the list"):
                    return
            return
        self._check(node, node.target, value, "added to the running total")

    def visit_Assign(self, node: ast.Assign) -> None:
        """``total = total + loss``, ``stats["loss"] = stats["loss"] + loss``."""
        if len(node.targets) != 1 or not isinstance(node.value, ast.BinOp) or not isinstance(node.value.op, ast.Add):
            return
        target = node.targets[0]
        if _reference(target) is None:
            return
        if _same_reference(node.value.left, target):
            self._check(node, target, node.value.right, "added to the running total")
        elif _same_reference(node.value.right, target):
            self._check(node, target, node.value.left, "added to the running total")

    def visit_Call(self, node: ast.Call) -> None:
        """``losses.append(loss)``, ``history["loss"].append(loss)``, ``log.append((epoch, loss))``."""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and len(node.args) == 1 and not node.keywords:
            value = node.args[0]
            if isinstance(value, (ast.Tuple, ast.List)):
                elements = list(value.elts)
            elif isinstance(value, ast.Dict):
                elements = [v for k, v in zip(value.keys, value.values) if k is not None]
            else:
                elements = [value]
            for element in elements:
                if self._check(node, func.value, element, "appended to a list"):
                    return
        elif isinstance(func, ast.Attribute) and node.args:
            for index in self._kept_by_method(node, func):
                if self._check(node, func.value, node.args[index], f"kept by `{func.attr}()` in the state of"):
                    return

    def _kept_by_method(self, call: ast.Call, func: ast.Attribute) -> list[int]:
        """The positions of ``call``'s arguments that every method of the project called ``func.attr`` adds to
        its object's state (``meter.update(loss, n)`` with ``def update(self, val, n): self.sum += val * n``);
        empty for an object a library built (``torchmetrics.MeanMetric()``), for a module or an optimizer, and
        for a method of ``self`` that its own class does not define (inherited from a library)."""
        ctx = self.ctx
        program = ctx.program
        kept = program.kept_arguments(ctx, func.attr) if program is not None else ctx.kept_arguments_here(func.attr)
        if not kept or "-" in kept:
            return []  # asked first: no method of that name keeps an argument, the common case
        receiver = func.value
        if ctx.is_module(receiver) or ctx.is_optimizer(receiver) or ctx.qualname(func) is not None:
            return []
        if isinstance(receiver, ast.Name) and receiver.id == "self":
            cls = ctx.enclosing_class(call)
            if cls is None or not any(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == func.attr
                                      for f in cls.body):
                return []
        bindings = ctx.bindings_of(receiver, call) if isinstance(receiver, (ast.Name, ast.Attribute)) else []
        if any(b.kind == "assign" and isinstance(b.value, ast.Call) and ctx.qualname(b.value.func) is not None
               and (program is None or program.resolve(ctx, b.value.func) is None) for b in bindings):
            return []  # built by a library
        every = set.intersection(*(set(k.split(",")) for k in kept))
        return sorted(int(i) for i in every if int(i) < len(call.args))

    def _check(self, node: ast.AST, target: ast.AST, value: ast.AST, verb: str) -> bool:
        ctx = self.ctx
        container = target
        for _ in range(8):  # stats["loss"] += ..., history[phase]["loss"].append(...): the dict outlives the step
            if not isinstance(container, ast.Subscript):
                break
            container = container.value
        key = dotted(container)
        if key is None:
            return False
        loop = ctx.enclosing_loop(node)
        if loop is None and not key.startswith("self."):
            return False
        if isinstance(value, ast.Starred) or ctx.grad_disabled(node) or not ctx.carries_graph(value, node):
            return False
        if loop is not None and (self._reset_in(container, loop, node)
                                 or self._lives_within_one_call(container, loop, node)):
            return False
        root = key.split(".")[0]
        scope = ctx.scope(node)
        kept = self._kept_for_autograd(scope)
        if key in kept or (root != "self" and root in kept):
            return False
        if key.startswith("self.") and any(
            key in self._kept_for_autograd(fn) for fn in (*ctx.nodes(ast.FunctionDef), *ctx.nodes(ast.AsyncFunctionDef))
        ):
            return False
        value_text = " ".join(ctx.segment(value).split())[:40] or "the value"
        where = " ".join(ctx.segment(target).split()) if isinstance(target, ast.Subscript) else key
        where = where if 0 < len(where) <= 40 else key
        self.report(
            node,
            f"`{value_text}` carries an autograd graph and is {verb} `{where}`, which outlives the iteration: "
            f"every step's graph stays in memory; use `{value_text}.item()` (or `.detach()`)"
            if isinstance(value, ast.Name)
            else f"`{value_text}` carries an autograd graph and is {verb} `{where}`, which outlives the "
            f"iteration: every step's graph stays in memory; use .item() (or .detach())",
        )
        return True

    def _reset_in(self, container: ast.AST, loop: ast.AST, node: ast.AST) -> bool:
        """Whether the total or list is re-created inside the loop (then it lives one iteration only), or inside
        an outer loop while no loop between that one and the addition takes a training step (a list of two
        evaluation outputs rebuilt every epoch holds two graphs, however long the epoch: nothing grows)."""
        ctx = self.ctx
        resets = [b.stmt for b in ctx.bindings_of(container, node)
                  if b.stmt is not node and b.kind in ("assign", "for", "with", "walrus")]
        between: list[ast.AST] = []  # the loops inside the resetting one that hold the addition
        current: ast.AST | None = loop
        while current is not None:
            if any(ctx.is_inside(stmt, current) for stmt in resets):
                return not between or not any(
                    method_call(call, "backward", "step") for inner in between for call in ctx.calls_within(inner)
                )
            between.append(current)
            current = ctx.enclosing_loop(current)
        return False

    def _lives_within_one_call(self, container: ast.AST, loop: ast.AST, node: ast.AST) -> bool:
        """Whether the total or list is the function's own, made anew by each call before the loops that fill
        it, while none of those loops takes a training step (here or in a helper of the file) or goes over
        data: a forward's list of feature maps, filled in one loop and read in the next, holds one call's
        tensors (this step's graph, which is wanted), however many steps the run takes."""
        ctx = self.ctx
        scope = ctx.scope(node)
        if not isinstance(container, ast.Name) or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        name = container.id
        if any(name in declared.names and ctx.scope(declared) is scope  # type: ignore[attr-defined]
               for kind in (ast.Global, ast.Nonlocal) for declared in ctx.nodes(kind)):
            return False
        loops = [loop]
        while (outer := ctx.enclosing_loop(loops[-1])) is not None:
            loops.append(outer)
        made_before = False
        for b in ctx.bindings.get((scope, name), ()):
            if b.stmt is node or b.kind == "augassign":
                continue
            value = b.value
            if b.unpacked and isinstance(value, (ast.Tuple, ast.List)):  # a, b = [], []
                value = value.elts[b.index] if b.index is not None and b.index < len(value.elts) else None
            elif b.unpacked and not ctx.is_model_call(value):  # feats, pos = self.backbone(x): that forward's
                value = None
            if b.kind in ("assign", "walrus") and value is not None:
                if name in names_in(value):  # total = total + x, feats = feats[::-1]: still this call's
                    continue
                if self._fresh(value):
                    made_before = made_before or (position(b.stmt) < position(loops[-1])
                                                  and not ctx.is_inside(b.stmt, loops[-1]))
                    continue
            return False  # a parameter, a loop variable, or another name's list (kept = self.features)
        if not made_before:
            return False
        fns = functions(ctx)
        return not any(ctx.iterates_over_data(lp) or fns.trains(lp) for lp in loops)

    def _fresh(self, value: ast.AST) -> bool:
        """A new container or number: ``[]``, ``{}``, ``0``, ``[None] * n``, ``list()``, ``torch.zeros(...)``, or
        what a forward call returns (``self.backbone(x)``: each call builds its outputs anew)."""
        if self.ctx.is_model_call(value):
            return True
        if isinstance(value, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.SetComp,
                              ast.DictComp)):
            return True
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):  # [None] * num_levels
            return isinstance(value.left, ast.List) or isinstance(value.right, ast.List)
        if isinstance(value, ast.Call):
            if last_name(value.func) in _CONTAINER_TYPES:
                return True
            qualname = self.ctx.qualname(value.func) or ""
            return qualname.startswith("torch.") and qualname.rsplit(".", 1)[1][:1].islower()
        return False

    # ----------------------------------------------------------------------------- totals meant for autograd
    def _kept_for_autograd(self, scope: ast.AST) -> set[str]:
        """Dotted names of ``scope`` whose graph is wanted: they flow into a ``backward()`` of the scope (or
        any ``torch.autograd.backward``/``grad``), or into its ``return`` when the function leaves the
        backward to its caller (it calls no ``backward()`` itself, or only with ``retain_graph=True``). A
        function that runs ``loss.backward()`` and returns the running total returns it for logging."""
        if self._kept is None:
            self._kept = self._scan()
        found = self._kept.get(id(scope))
        return found if found is not None else self._kept_anywhere

    def _scan(self) -> dict[int, set[str]]:
        ctx = self.ctx
        seeds: dict[int, list[ast.AST]] = {}
        own_backward: set[int] = set()
        anywhere: list[ast.AST] = []
        for call in ctx.nodes(ast.Call):
            func = call.func  # type: ignore[attr-defined]
            if not isinstance(func, ast.Attribute):
                if ctx.qualname(func) in ("torch.autograd.backward", "torch.autograd.grad"):
                    anywhere.extend(call.args)  # type: ignore[attr-defined]
                continue
            if func.attr in ("backward", "manual_backward"):
                scope = ctx.scope(call)
                seeds.setdefault(id(scope), []).extend((func.value, *call.args))  # type: ignore[attr-defined]
                retain = next((k.value for k in call.keywords if k.arg == "retain_graph"), None)  # type: ignore[attr-defined]
                if retain is None or is_const(retain, False):
                    own_backward.add(id(scope))
        returns: dict[int, list[ast.AST]] = {}
        for ret in ctx.nodes(ast.Return):
            if ret.value is not None:  # type: ignore[attr-defined]
                returns.setdefault(id(ctx.scope(ret)), []).append(ret.value)  # type: ignore[attr-defined]
        bound: dict[int, dict[str, list[ast.AST]]] = {}
        for (bscope, name), found in ctx.bindings.items():
            values = [b.value for b in found if b.value is not None]
            if values:
                bound.setdefault(id(bscope), {})[name] = values
        base: set[str] = set()
        for seed in anywhere:
            base |= names_in(seed)
        self._kept_anywhere = base
        out: dict[int, set[str]] = {}
        for scope_id in set(seeds) | set(returns):
            names = set(base)
            for seed in seeds.get(scope_id, ()):
                names |= names_in(seed)
            if scope_id not in own_backward:
                for value in returns.get(scope_id, ()):
                    names |= names_in(value, returned=True)
            local = bound.get(scope_id, {})
            frontier = list(names)
            while frontier:  # y = f(x); y.backward()  ->  x flows into the backward too
                name = frontier.pop()
                for value in local.get(name, ()):
                    for new in names_in(value) - names:
                        names.add(new)
                        frontier.append(new)
            out[scope_id] = names
        return out


_CONTAINER_TYPES = frozenset({"list", "dict", "set", "tuple", "defaultdict", "OrderedDict", "deque", "Counter"})


def _reference(node: ast.AST) -> str | None:
    """``total``, ``self.total``, ``stats["loss"]``: a name, attribute, or one with constant subscripts."""
    keys = []
    for _ in range(8):
        if not isinstance(node, ast.Subscript):
            break
        if not isinstance(node.slice, ast.Constant):
            return None
        keys.append(f"[{node.slice.value!r}]")
        node = node.value
    base = dotted(node)
    if base is None or isinstance(node, ast.Subscript):
        return None
    return base + "".join(reversed(keys))


def _same_reference(a: ast.AST, b: ast.AST) -> bool:
    ref = _reference(a)
    return ref is not None and ref == _reference(b)
