"""TW105 missing-zero-grad: a training loop that calls ``backward()`` and updates (``step()``, or by hand from
``.grad``) but never zeroes gradients."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from trainwise.doctor.context import Context, dotted, last_name, method_call, position, walk_own
from trainwise.doctor.context.functions import callees, functions, reaches_call, same_or_below
from trainwise.doctor.rule import Related, Rule

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class MissingZeroGrad(Rule):
    """A training loop with `backward()` and an update (`optimizer.step()`, or by hand from `.grad`), no `zero_grad()`.

    ## What it does
    Finds a loop whose body calls `loss.backward()` and `optimizer.step()` (or `scaler.step(optimizer)`)
    while nothing in the loop, nor in a function of the same file that the loop calls, zeroes the
    gradients: no `optimizer.zero_grad()`, no `model.zero_grad()`, no `p.grad = None`.

    Without an optimizer, it finds a loop that calls `backward()` and updates parameters by hand from their own
    gradient (`p.data -= lr * p.grad`, `p.data.add_(p.grad, alpha=-lr)`, `with torch.no_grad(): w -= lr *
    w.grad`), also from a value computed from it (`g = p.grad.clone(); dist.all_reduce(g); p.data -= lr * g /
    world`), in the loop or in a helper of any file of the run that the loop calls (`sgd_step(params, lr)`),
    while nothing there clears the gradient (`p.grad = None`, `p.grad.zero_()`, `model.zero_grad()`).

    When the loop steps several optimizers (a GAN's generator and discriminator), each one's gradients must
    be cleared: by its own `zero_grad()`, by `zero_grad()` on a module it was built from (`netG.zero_grad()`
    for `Adam(netG.parameters())`), or in a same-file function the loop calls with it (`clear(opt_g)`); the
    rule reports the step of an optimizer that nothing clears while another one is zeroed. An optimizer
    stepped in an inner loop that runs its own backward (a WGAN critic) is judged by that loop, the
    generator's step in the outer loop by the outer one.

    ## Why is this bad?
    `backward()` *adds* to `.grad`. Without zeroing, each step applies the sum of the gradients of every
    batch seen so far: the effective learning rate grows with every step, and training diverges or
    oscillates without any error.

    The rule stays silent when the gradients are zeroed anywhere in the loop (every step, or every k steps
    for gradient accumulation, before the backward pass or after the step, with or without `set_to_none`),
    on the model instead of the optimizer, in a closure passed to `step()`, or in a helper function of the
    same file that the loop calls. With several optimizers it also stays silent when what is zeroed cannot
    be named (`p.grad = None`, `for opt in self.optimizers: opt.zero_grad()`, an optimizer the loop does not
    step), when a module is zeroed and the optimizer's parameters are not known (an optimizer passed in as
    an argument), when two optimizers were built from the same module or one holding the other, and for
    an "optimizer" with no backward pass of its own since the previous step or built by a class of the file
    that is not an optimizer (MixMatch's `ema_optimizer.step()` right after `optimizer.step()`: a weight
    average that reads no gradients).

    The updates by hand are judged the same way, and the rule stays silent when the gradient is cleared in the
    loop or in a helper it calls (d2l's `sgd` zeroes what it applied), when the update reads gradients from
    `torch.autograd.grad` (fresh tensors each call, nothing accumulates), when the updated tensor is made anew in
    the loop (`adv = adv.detach().requires_grad_()` in an adversarial attack: a fresh leaf each step), outside
    loops, in a loop with no backward pass (an optimizer's own `step()`), and when the loop also steps an
    optimizer (judged as above).

    ## Example
    ```python
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    w = torch.randn(10, 1, requires_grad=True)
    for t in range(500):
        loss = (x.mm(w) - y).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            w -= 1e-3 * w.grad
    ```

    ## Use instead
    ```python
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    w = torch.randn(10, 1, requires_grad=True)
    for t in range(500):
        (x.mm(w) - y).pow(2).sum().backward()
        with torch.no_grad():
            w -= 1e-3 * w.grad
        w.grad = None  # or w.grad.zero_()
    ```

    ## Fix safety
    There is no automatic fix: zeroing belongs before the backward pass, or after the step when gradients
    are accumulated over several batches, and only the author knows which.
    """

    code = "TW105"
    name = "missing-zero-grad"
    message = "the loop calls backward() and step() but never zeroes the gradients: they add up across steps"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._manual_reported: set[int] = set()
        self._trains: bool | None = None

    def visit_For(self, node: ast.For) -> None:
        """A ``for`` loop."""
        self._check(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        """An ``async for`` loop."""
        self._check(node)

    def visit_While(self, node: ast.While) -> None:
        """A ``while`` loop."""
        self._check(node)

    def _check(self, loop: ast.For | ast.AsyncFor | ast.While) -> None:
        if not self._may_train():
            return
        calls = _own_calls(loop)
        if not any(self._is_backward(c) for c in calls):
            return
        steps = sorted(((c, name) for c in calls if (name := self._optimizer_step(c)) is not None),
                       key=lambda pair: position(pair[0]))
        if not steps:
            if not any(self._optimizer_step(c) is not None or method_call(c, "step") for c in calls):
                self._check_manual(loop, calls)
            return
        # the innermost loop holding a backward and an optimizer's step decides for that optimizer
        inner_decided: set[str] = set()
        for inner in _own_loops(loop):
            inner_calls = _own_calls(inner)
            if any(self._is_backward(c) for c in inner_calls):
                inner_decided |= {name for c, name in steps if c in inner_calls}
        decided = [(c, name) for c, name in steps if name not in inner_decided]
        if not decided:
            return
        stepped = {name for _, name in steps}
        if not self.ctx.reaches_call(loop, _zeroes) and not (
            _assigns_grad(loop) or any(_assigns_grad(fn) for fn in self.ctx.helpers_called(loop))
        ):
            step, optimizer = decided[0]
            if not self._built_in(step, loop):
                self.report(
                    step,
                    f"`{optimizer}` steps after backward() in this loop, but no zero_grad() clears the gradients: "
                    f"each step applies the sum of all earlier batches' gradients; call `{optimizer}.zero_grad()` "
                    f"before the backward pass",
                )
            return
        if len(stepped) < 2:
            return
        # several optimizers (a GAN): each one's gradients must be cleared, by itself or by its modules
        cleared = self._cleared(loop, stepped)
        if cleared is None:
            return
        reported: set[str] = set()
        backwards = [c for c in calls if self._is_backward(c)]
        for step, optimizer in decided:
            if optimizer in reported or self._zeroed(optimizer, step, cleared, steps) or self._built_in(step, loop):
                continue
            if not self._own_backward(step, steps, backwards) or self._not_an_optimizer(step):
                continue
            reported.add(optimizer)
            zeroed = ", ".join(f"`{name}`" for kind, name in cleared if kind == "optimizer") or "other modules"
            self.report(
                step,
                f"`{optimizer}` steps after backward() in this loop, but only {zeroed} is zeroed, never "
                f"`{optimizer}`: each `{optimizer}` step applies the sum of all earlier batches' gradients; "
                f"call `{optimizer}.zero_grad()` before its backward pass",
            )

    def _may_train(self) -> bool:
        """A cheap first test: the file calls ``backward()`` or ``step()`` somewhere (``loss_fn(...).backward()``
        has no dotted receiver, so the receivers' table alone does not tell)."""
        if self._trains is None:
            receivers = self.ctx.method_receivers
            self._trains = "backward" in receivers or "step" in receivers or ("backward" in self.ctx.source and any(
                node.attr in ("backward", "manual_backward") for node in self.ctx.nodes(ast.Attribute)))  # type: ignore[attr-defined]
        return self._trains

    # --------------------------------------------------------------------------- updates without an optimizer
    def _check_manual(self, loop: ast.AST, calls: list[ast.Call]) -> None:
        """A loop that runs ``backward()`` and updates parameters by hand from their ``.grad``
        (``p.data -= lr * p.grad``), in the loop or in a helper it calls, and clears no gradient."""
        inner = [n for n in _own_loops(loop) if any(self._is_backward(c) for c in _own_calls(n))]
        found: list[tuple[ast.AST, str, ast.AST | None, Context]] = []  # (report at, parameter, update, its file)
        for node, base in _manual_updates(self.ctx, walk_own(ast.iter_child_nodes(loop))):
            if any(self.ctx.is_inside(node, n) for n in inner):
                continue  # an inner loop with its own backward decides
            if not self._rebound_in(base, node, loop):
                found.append((node, base, None, self.ctx))
        for call in calls:
            if any(self.ctx.is_inside(call, n) for n in inner):
                continue
            for other, fn in callees(self.ctx, call):
                if isinstance(fn, ast.Lambda) or fn is self.ctx.scope(loop):
                    continue
                updates = _manual_updates(other, walk_own(fn.body))
                if updates:
                    found.append((call, updates[0][1], updates[0][0], other))
                    break
        if not found or self._clears(loop):
            return
        node, base, update, other = min(found, key=lambda f: position(f[0]))
        if id(node) in self._manual_reported:
            return
        self._manual_reported.add(id(node))
        related: tuple[Related, ...] = ()
        who = f"`{base}` is updated by hand from `{base}.grad`"
        if update is not None:
            program = self.ctx.program
            name = getattr(other.scope(update), "name", "a helper")
            where = f" ({program.where(other, update)})" if program is not None else ""
            who = f"`{name}`{where} updates `{base}` by hand from `{base}.grad`"
            if program is not None:
                related = (program.place(other, update, f"updates `{base}` from `{base}.grad`"),)
        self.report(
            node,
            f"{who} after backward() in this loop, but nothing clears the gradient: backward() adds to `.grad`, so "
            f"each update applies the sum of the gradients of every iteration so far; set `.grad = None` (or call "
            f"`.grad.zero_()`) after the update",
            related=related,
        )

    def _rebound_in(self, base: str, at: ast.AST, loop: ast.AST) -> bool:
        """Whether the updated tensor is made anew inside the loop (``x_adv = x_adv.detach()...``): a fresh leaf
        whose ``.grad`` starts empty. A loop over parameters (``for p in model.parameters()``) does not count."""
        bindings = self.ctx.lookup(base, at) if "." not in base else self.ctx.attr_bindings.get(base, [])
        for b in bindings:
            if not self.ctx.is_inside(b.stmt, loop) or b.kind in ("param", "augassign") or b.stmt is at:
                continue
            if b.kind == "for" and b.iter is not None and last_name(
                    b.iter.func if isinstance(b.iter, ast.Call) else b.iter) in _PARAMETER_SOURCES:
                continue
            if b.kind == "for" and isinstance(b.iter, ast.Name):
                continue  # for p in params
            return True
        return False

    def _clears(self, loop: ast.AST) -> bool:
        """Whether the loop (or a helper it calls, in any file of the run) clears gradients."""
        if reaches_call(self.ctx, loop, _zeroes) or _assigns_grad(loop):
            return True
        if any(_assigns_grad(fn) for fn in self.ctx.helpers_called(loop)):
            return True
        for call in self.ctx.calls_within(loop):
            for _, fn in callees(self.ctx, call):
                if _assigns_grad(fn):
                    return True
        return False

    def _cleared(self, loop: ast.AST, stepped: set[str]) -> list[tuple[str, str]] | None:
        """What the loop (and the same-file functions it calls) zeroes: ("optimizer", name) for a stepped
        optimizer, ("module", name) for ``model.zero_grad()``; None when anything zeroed cannot be named
        (``p.grad = None``, ``for opt in self.optimizers``, an optimizer this loop does not step)."""
        summaries = functions(self.ctx)
        sources: list[tuple[ast.AST, dict[str, ast.expr | None] | None]] = [(loop, None)]
        sources += [(r.function, r.params) for r in summaries.reached(loop)]
        cleared: list[tuple[str, str]] = []
        for container, params in sources:
            if _assigns_grad(container):
                return None
            for call in self.ctx.calls_within(container):
                if not _zeroes(call):
                    continue
                func = call.func
                if not (isinstance(func, ast.Attribute) and func.attr == "zero_grad"):
                    return None  # p.grad.zero_(), zero_grad(model): what it clears is not named
                receivers = self._receivers(func.value, call)
                if receivers is None:
                    return None
                for receiver in receivers:
                    node = receiver if params is None else summaries.translate(receiver, params)  # type: ignore[arg-type]
                    name = dotted(node) if node is not None else None
                    if node is None or name is None:
                        return None
                    if name in stepped:
                        cleared.append(("optimizer", name))
                    elif not self.ctx.is_optimizer(node) and self.ctx.is_module(node):
                        cleared.append(("module", name))
                    else:
                        return None
        return cleared

    def _receivers(self, receiver: ast.AST, at: ast.AST) -> list[ast.AST] | None:
        """``opt`` of ``for opt in (opt_g, opt_d): opt.zero_grad()`` -> both; a plain receiver -> itself."""
        if dotted(receiver) is None:
            return None
        if isinstance(receiver, ast.Name):
            loops = [b for b in self.ctx.bindings_of(receiver, at) if b.kind == "for"]
            if loops:
                holding = [b for b in loops if self.ctx.is_inside(at, b.stmt)]
                if (len(holding) != 1 or holding[0].unpacked
                        or not isinstance(holding[0].iter, (ast.Tuple, ast.List))):
                    return None
                return list(holding[0].iter.elts)
        return [receiver]

    def _zeroed(self, optimizer: str, step: ast.Call, cleared: list[tuple[str, str]],
                steps: list[tuple[ast.Call, str]]) -> bool:
        """Whether ``cleared`` clears ``optimizer``'s gradients: it is zeroed itself, or a module it was built
        from (or one holding it) is, or an optimizer built from an overlapping module is; an optimizer whose
        modules are unknown counts as cleared by any ``module.zero_grad()``."""
        summaries = functions(self.ctx)
        mine = summaries.optimizer_modules(self._optimizer_node(step))
        for kind, name in cleared:
            if kind == "optimizer" and name == optimizer:
                return True
            if kind == "module" and (mine is None or any(_overlap(name, m) for m in mine)):
                return True
            if kind == "optimizer" and mine is not None:
                other_step = next(c for c, n in steps if n == name)
                theirs = summaries.optimizer_modules(self._optimizer_node(other_step))
                if theirs is not None and any(_overlap(a, b) for a in mine for b in theirs):
                    return True
        return False

    def _own_backward(self, step: ast.Call, steps: list[tuple[ast.Call, str]], backwards: list[ast.Call]) -> bool:
        """A backward pass between the previous step (of any optimizer) and this one: the optimizer has a loss
        of its own. ``optimizer.step(); ema_optimizer.step()`` (a weight average stepped after the real
        optimizer, which reads no gradients) has none."""
        here = position(step)
        previous = max((position(c) for c, _ in steps if position(c) < here), default=(0, 0))
        return any(previous < position(b) < here for b in backwards)

    def _not_an_optimizer(self, step: ast.Call) -> bool:
        """Built by a class of this file that is not an optimizer (``WeightEMA(model, ema_model)``)."""
        for b in self.ctx.bindings_of(self._optimizer_node(step)):
            if b.kind == "assign" and isinstance(b.value, ast.Call) and isinstance(b.value.func, ast.Name):
                for cls in self.ctx.nodes(ast.ClassDef):
                    if cls.name == b.value.func.id and not any(  # type: ignore[attr-defined]
                        "optim" in (self.ctx.qualname(base) or dotted(base) or "").lower()
                        for base in cls.bases  # type: ignore[attr-defined]
                    ):
                        return True
        return False

    def _optimizer_node(self, step: ast.Call) -> ast.AST:
        return step.args[0] if step.args else step.func.value  # type: ignore[attr-defined]

    def _built_in(self, step: ast.Call, loop: ast.AST) -> bool:
        """A fresh optimizer every iteration: a numerical check, not a training loop."""
        receiver = self._optimizer_node(step)
        return any(self.ctx.is_inside(b.stmt, loop) for b in self.ctx.bindings_of(receiver, step))

    def _is_backward(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Attribute):
            return func.attr in ("backward", "manual_backward")
        return self.ctx.qualname(func) == "torch.autograd.backward"

    def _optimizer_step(self, call: ast.Call) -> str | None:
        """The optimizer a ``opt.step()`` / ``scaler.step(opt)`` call steps, else None."""
        if not method_call(call, "step"):
            return None
        receiver = call.func.value  # type: ignore[attr-defined]
        name = dotted(receiver)
        if name is None or "sched" in name.lower():
            return None
        if not call.args and not call.keywords:
            return name if self.ctx.is_optimizer(receiver) else None
        if call.args and not self.ctx.is_optimizer(receiver) and "scaler" in name.lower():
            target = dotted(call.args[0])
            return target if target is not None and self.ctx.is_optimizer(call.args[0]) else None
        return None  # step(closure): the closure does the work


_PARAMETER_SOURCES = frozenset({"parameters", "named_parameters", "params", "weights", "values"})


def _base(expr: ast.AST) -> str | None:
    """``p.data`` -> ``p``, ``p.grad.data`` -> ``p.grad``: the tensor behind ``.data``."""
    while isinstance(expr, ast.Attribute) and expr.attr == "data":
        expr = expr.value
    return dotted(expr)


def _reads_grad_of(ctx: Context, expr: ast.AST, base: str, at: ast.AST, depth: int = 0) -> bool:
    """Whether ``expr`` reads ``<base>.grad`` (``lr * p.grad``, ``p.grad.data``, ``p.grad / n``), also through
    names bound to a value computed from it before ``at`` (``g = all_reduce(p.grad) / world; p.data -= lr *
    g``). A loop target (``for p, g in zip(params, grads)``) is not followed: ``torch.autograd.grad`` results
    do not accumulate."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Attribute) and node.attr == "grad" and _base(node.value) == base:
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id != base and depth < 4:
            for b in ctx.reaching(node, at):
                if (b.kind in ("assign", "augassign", "walrus") and b.value is not None
                        and _reads_grad_of(ctx, b.value, base, b.stmt, depth + 1)):
                    return True
    return False


def _manual_updates(ctx: Context, nodes: Iterable[ast.AST]) -> list[tuple[ast.AST, str]]:
    """Parameter updates by hand from their own gradient: ``p -= lr * p.grad``, ``p.data = p.data - lr *
    p.grad``, ``p.data.add_(p.grad, alpha=-lr)``, ``p.sub_(lr * p.grad)``, also from a name computed from the
    gradient (``p.data -= lr * grad_mean``); each with the parameter's name."""
    found = []
    for node in nodes:
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Sub, ast.Add)):
            base = _base(node.target)
            if base is not None and _reads_grad_of(ctx, node.value, base, node):
                found.append((node, base))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.BinOp):
            target = node.targets[0]
            base = _base(target) if isinstance(target, ast.Attribute) and target.attr == "data" else None
            if base is not None and _reads_grad_of(ctx, node.value, base, node) and any(
                    _base(n) == base for n in (node.value.left, node.value.right)):
                found.append((node, base))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("add_", "sub_")):
            base = _base(node.func.value)
            given = (*node.args, *(k.value for k in node.keywords))
            if base is not None and any(_reads_grad_of(ctx, a, base, node) for a in given):
                found.append((node, base))
    return sorted(found, key=lambda f: position(f[0]))


def _zeroes(call: ast.Call) -> bool:
    """``x.zero_grad(...)``, ``p.grad.zero_()``, ``p.grad.detach_()``, ``torch.nn.utils...zero_grad``."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return isinstance(func, ast.Name) and "zero_grad" in func.id
    if "zero_grad" in func.attr:
        return True
    if func.attr in ("zero_", "detach_", "fill_"):
        text = dotted(func.value) or ""
        return "grad" in text.split(".")
    return False


def _assigns_grad(container: ast.AST) -> bool:
    """``p.grad = None`` (or any assignment to a ``.grad`` attribute)."""
    for node in ast.walk(container):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr == "grad":
                    return True
    return False


def _own_calls(loop: ast.AST) -> list[ast.Call]:
    """Calls inside a loop, nested function and class definitions excluded."""
    return [n for n in walk_own(ast.iter_child_nodes(loop)) if isinstance(n, ast.Call)]


def _own_loops(loop: ast.AST) -> list[ast.AST]:
    return [n for n in walk_own(ast.iter_child_nodes(loop)) if isinstance(n, _LOOPS)]


def _overlap(a: str, b: str) -> bool:
    """``netG`` and ``netG.main``: one module holds the other."""
    return same_or_below(a, b) or same_or_below(b, a)
