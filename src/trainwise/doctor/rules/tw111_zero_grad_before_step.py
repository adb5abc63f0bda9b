"""TW111 zero-grad-before-step: ``backward(); opt.zero_grad(); opt.step()`` applies zero gradients."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from trainwise.doctor.context import DEFINITIONS, dotted, position
from trainwise.doctor.context.syntax import iter_children
from trainwise.doctor.rule import Rule

_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)
if hasattr(ast, "TryStar"):  # Python 3.11+
    _COMPOUND = (*_COMPOUND, ast.TryStar)


class ZeroGradBeforeStep(Rule):
    """`zero_grad()` called between `backward()` and `step()` of the same optimizer.

    ## What it does
    Finds `optimizer.zero_grad()` after a `backward()` and before `optimizer.step()` (or
    `scaler.step(optimizer)`), with no `backward()` in between. Finds the same across iterations: gradient
    accumulation whose loop calls `optimizer.zero_grad()` and `backward()` on every iteration but steps
    only under a periodic test (`if (i + 1) % k == 0:`), so every micro-batch's gradient but the last is
    erased before the step.

    ## Why is this bad?
    `backward()` writes the gradients, `zero_grad()` erases them, and `step()` then applies nothing (or,
    with momentum and weight decay, only those): the model does not learn from the batch, and the loss
    curve just stays flat without any error. Zero the gradients before the backward pass or after the step.

    The rule stays silent when the gradients are zeroed before `backward()` or after `step()`, and when
    another `backward()` comes between `zero_grad()` and `step()`: also when the periodic block runs a
    backward of its own (a GAN's generator trained every `n_critic` batches), and when the step's test is
    not periodic (`if torch.isfinite(loss):` skips a bad step, it accumulates nothing).

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.zero_grad()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    There is no automatic fix: where the call belongs (before the forward pass, or after the step) is a
    choice about the loop's structure.
    """

    code = "TW111"
    name = "zero-grad-before-step"
    message = "zero_grad() between backward() and step() erases the gradients the step should apply"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._reported: set[ast.AST] = set()
        self._statement_calls: dict[int, list[ast.Call]] = {}  # id(statement) -> _calls(statement)

    def visit_Module(self, node: ast.Module) -> None:
        """Scan the module's statements."""
        self._run(node.body, False)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        """Scan a function's statements."""
        self._run(node.body, False)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        """Scan a coroutine's statements."""
        self._run(node.body, False)

    def visit_For(self, node: ast.For) -> None:
        """A loop whose every iteration zeroes what only some iterations step (see ``_erased_accumulation``)."""
        self._erased_accumulation(node)

    def visit_While(self, node: ast.While) -> None:
        """The same for a ``while`` loop."""
        self._erased_accumulation(node)

    def _erased_accumulation(self, loop: ast.For | ast.While) -> None:
        """``opt.zero_grad()`` and ``backward()`` on every iteration, ``opt.step()`` only under ``if i % k ==
        0:``: gradient accumulation whose every micro-batch but the last is erased before the step."""
        if "zero_grad" not in self.ctx.method_receivers:
            return
        every: list[tuple[str, str | None, ast.AST]] = []
        periodic: list[tuple[str, str | None, ast.AST]] = []
        backward_always = False
        for stmt in _unconditional(loop.body):
            if isinstance(stmt, ast.If) and _periodic(stmt.test):
                periodic += [e for block in _blocks(stmt) for e in self._flat(block)]
            elif not isinstance(stmt, _COMPOUND):
                every += self._flat([stmt])
            elif isinstance(stmt, ast.If) and stmt.orelse and all(
                    any(kind == "backward" for kind, _, _ in self._flat(block)) for block in (stmt.body, stmt.orelse)):
                backward_always = True  # `if scaler: scaler.scale(loss).backward() else: loss.backward()`
        if not backward_always and not any(kind == "backward" for kind, _, _ in every):
            return
        if any(kind == "backward" for kind, _, _ in periodic):
            return  # the periodic step has a backward of its own (a GAN's generator every n_critic batches)
        stepped = ({key for kind, key, _ in periodic if kind == "step"}
                   - {key for kind, key, _ in every if kind in ("step", "closure_step")})
        for kind, key, node in every:
            if kind == "zero" and key in stepped and node not in self._reported:
                self._reported.add(node)
                self.report(node, f"`{key}.zero_grad()` runs every iteration, but `{key}` steps only every few "
                                  f"(under a `%` test): each step applies the last micro-batch's gradient alone, the "
                                  f"accumulated ones are erased; zero the gradients right after the step instead")
                return

    def _run(self, statements: list[ast.stmt], backward_open: bool) -> None:
        """Follow backward / zero_grad / step events in order; nested blocks start with the state before them."""
        if "zero_grad" not in self.ctx.method_receivers:
            return  # nothing to find: most files never call zero_grad()
        pending: dict[str, ast.Call] = {}  # optimizer -> its zero_grad() seen since the last backward
        for kind, key, node in self._items(statements):
            if kind == "block":
                blocks: list[list[ast.stmt]] = node  # type: ignore[assignment]
                inner: list[tuple[str, str | None, ast.AST]] = []
                for block in blocks:
                    self._run(block, backward_open)
                    inner.extend(self._flat(block))
                if any(k == "backward" for k, _, _ in inner):
                    pending.clear()
                for k, opt, _ in inner:
                    if k == "step" and opt is not None:
                        pending.pop(opt, None)
                continue
            if kind == "backward":
                pending.clear()
                backward_open = True
            elif kind == "zero" and backward_open and key is not None:
                pending.setdefault(key, node)  # type: ignore[arg-type]
            elif kind == "step" and key is not None:
                zero = pending.pop(key, None)
                if zero is not None and zero not in self._reported:
                    self._reported.add(zero)
                    self.report(
                        zero,
                        f"`{key}.zero_grad()` comes after backward() and before `{key}` steps: the step applies "
                        f"zeroed gradients; zero them before the backward pass or after the step",
                    )
                backward_open = False
            elif kind == "closure_step":
                pending.clear()
                backward_open = False

    def _items(self, statements: list[ast.stmt]) -> Iterator[tuple[str, object, object]]:
        for stmt in statements:
            if isinstance(stmt, DEFINITIONS):
                continue
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                yield from self._items(stmt.body)
            elif isinstance(stmt, _COMPOUND):
                yield "block", None, _blocks(stmt)
            else:
                for call in self._calls(stmt):
                    event = self._event(call)
                    if event is not None:
                        yield event[0], event[1], call

    def _flat(self, statements: list[ast.stmt]) -> list[tuple[str, str | None, ast.AST]]:
        out = []
        for stmt in statements:
            if isinstance(stmt, DEFINITIONS):
                continue
            for call in self._calls(stmt):
                event = self._event(call)
                if event is not None:
                    out.append((event[0], event[1], call))
        return out

    def _event(self, call: ast.Call) -> tuple[str, str | None] | None:
        func = call.func
        if not isinstance(func, ast.Attribute):
            if self.ctx.qualname(func) == "torch.autograd.backward":
                return "backward", None
            return None
        if func.attr in ("backward", "manual_backward"):
            return "backward", None
        receiver = dotted(func.value)
        if func.attr == "zero_grad" and receiver is not None and not call.args:
            return "zero", receiver
        if func.attr == "step" and not (receiver and "sched" in receiver.lower()):
            if not call.args and not call.keywords:
                return ("step", receiver) if receiver is not None else None
            if call.args and not self.ctx.is_optimizer(func.value):
                first = dotted(call.args[0])  # scaler.step(optimizer)
                return ("step", first) if first is not None else None
            return "closure_step", receiver  # optimizer.step(closure): the closure recomputes gradients
        return None


    def _calls(self, stmt: ast.stmt) -> list[ast.Call]:
        """``_calls(stmt)``, once per statement: a block is read at each level of nesting around it, so each
        statement's calls are found once and those of a compound statement are made from its inner ones."""
        known = self._statement_calls.get(id(stmt))
        if known is None:
            known = self._statement_calls[id(stmt)] = _calls(stmt, self._calls)
        return known


def _unconditional(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a loop body that run on every iteration (the bodies of ``with`` blocks included)."""
    for stmt in statements:
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from _unconditional(stmt.body)
        elif not isinstance(stmt, DEFINITIONS):
            yield stmt


def _periodic(test: ast.expr) -> bool:
    """``(i + 1) % k == 0`` and the like: a test that holds on every k-th iteration."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks = []
    for field in ("body", "orelse", "finalbody"):
        value = getattr(stmt, field, None)
        if value:
            blocks.append(value)
    for handler in getattr(stmt, "handlers", ()):
        blocks.append(handler.body)
    for case in getattr(stmt, "cases", ()):
        blocks.append(case.body)
    return blocks


_NOT_DESCENDED = (*DEFINITIONS, ast.stmt)


def _calls(stmt: ast.AST, inner: Callable[[ast.stmt], list[ast.Call]] | None = None) -> list[ast.Call]:
    """Calls inside a statement, nested blocks and functions excluded, in source order. ``inner`` gives those
    of a statement nested in it (by default, found the same way)."""
    found = []
    nested: list[ast.stmt] = []
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            found.append(node)
        for child in iter_children(node):
            if isinstance(child, _NOT_DESCENDED) and child is not stmt:
                if isinstance(child, ast.stmt):
                    nested.append(child)
                continue
            stack.append(child)
    for child in nested:
        found.extend(inner(child) if inner is not None else _calls(child))
    found.sort(key=position)  # stable: a call and the call it calls (same position) stay outer first
    return found
