"""The same-file call graph: helpers a region calls, their call sites, and the file's evaluation regions."""

from __future__ import annotations

import ast
import bisect
import re
import types
from collections.abc import Callable

from trainwise.doctor.context.syntax import (
    DEFINITIONS,
    dotted,
    is_bound_method,
    last_name,
    position,
    walk_calls,
    walk_own,
)

_TORCH_LIBRARIES = frozenset(
    {"torch", "torchvision", "torchaudio", "torchtext", "lightning", "pytorch_lightning", "transformers", "timm",
     "accelerate", "trainwise", "torchmetrics", "diffusers", "peft"}
)

_EVAL_WORD = re.compile(r"val|valid|validation|test|testing|eval|evaluation|dev", re.IGNORECASE)

_EVAL_LOADER = re.compile(
    r"(?:\w*_)?(?:val|valid|validation|test|testing|eval|evaluation|dev)(?:_?\w*)?(?:loader|dl|dataloader|iter)s?"
    r"|(?:val|valid|validation|test|eval|dev)_?(?:dl|loader|dataloader)",
    re.IGNORECASE,
)

# Evaluation data that is not named as a loader (`val_data`, `valid_ds`, `test_set`, `val_batches`): an
# evaluation region when its loop runs the model in a function that trains (the second half of `train()`).
_EVAL_DATA = re.compile(
    r"(?:\w*_)?(?:val|valid|validation|test|testing|dev)_?(?:data|dataset|ds|set|batches|samples|generator|gen)s?"
    r"|(?:x|inputs?)_(?:val|valid|test)",
    re.IGNORECASE,
)

_EVAL_FUNCTION = re.compile(
    r"_*(?:run_|do_|model_|compute_)?(?:evaluate|evaluation|eval|validate|validation|valid|val|test)"
    r"(?:_(?:epoch|loop|model|one_epoch|once|all|net|network|accuracy|loss|metrics))?"
    r"|_*\w+_(?:evaluate|evaluation|validate|validation|eval)",
)

# Names that say a value is a metric: train_acc, correct, f1_score, val_metrics, miou, mae.
_METRIC_WORD = re.compile(
    r"(?:^|_|m)(?:acc|accs|accuracy|correct|metric|metrics|f1|auc|auroc|score|scores|precision|recall|iou|mae|"
    r"rmse|mse|ppl|perplexity)(?:$|_|\d)",
    re.IGNORECASE,
)

_LOOP_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "progress_bar", "track", "zip"})

def _trains(call: ast.Call) -> bool:
    """``loss.backward()``, ``optimizer.step()``: a call that trains (not ``env.step(action)`` nor a
    scheduler's step)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr in ("backward", "manual_backward"):
        return True
    receiver = (last_name(func.value) or "").lower()
    return func.attr == "step" and "opt" in receiver and "sched" not in receiver


def _loops_of(fn: ast.AST) -> list[ast.AST]:
    """Loops of a function's own body (nested functions excluded)."""
    found = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def cacheable_predicate(predicate: Callable[[ast.Call], bool]) -> bool:
    """Whether answers about a predicate may be kept with the file: a module-level function (a lambda made per
    question would never be asked again, and a rule's bound method would tie the rule to the file's context)."""
    return (isinstance(predicate, types.FunctionType) and predicate.__closure__ is None
            and predicate.__name__ != "<lambda>")


class _OwnCalls:
    """The calls of one scope's own body in ``walk_own`` order, the positions of the first and last that train,
    and, for each dotted callee, its calls as (position, rank in that order) sorted by position."""

    def __init__(self, scope: ast.FunctionDef | ast.AsyncFunctionDef | ast.Module) -> None:
        self.calls = [c for c in walk_own(scope.body) if isinstance(c, ast.Call)]
        trained = [position(c) for c in self.calls if _trains(c)]
        self.first_trained = min(trained) if trained else None
        self.last_trained = max(trained) if trained else None
        self.by_callee: dict[str, list[tuple[tuple[int, int], int]]] = {}
        for rank, call in enumerate(self.calls):
            name = dotted(call.func)
            if name is not None:
                self.by_callee.setdefault(name, []).append((position(call), rank))
        for found in self.by_callee.values():
            found.sort()


class CallGraph:
    """The same-file call graph and the evaluation regions (a part of :class:`Context`)."""

    def uses_torch(self) -> bool:
        """Whether the file imports torch or a library built on it (lightning, torchvision, transformers ...).
        Rules that recognise models by their names use it to stay silent on Keras, JAX or scikit-learn code."""
        cached = self._cache.get(("uses_torch", 0))  # type: ignore[arg-type]
        if cached is None:
            roots = {q.split(".", 1)[0] for q in self.aliases.values()}
            cached = bool(roots & _TORCH_LIBRARIES)
            self._cache[("uses_torch", 0)] = cached  # type: ignore[index]
        return cached  # type: ignore[return-value]

    def functions_named(self, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """Every function or method of the file with this name (any class, any nesting)."""
        table = self._cache.get(("functions", 0))  # type: ignore[arg-type]
        if table is None:
            table = {}
            for tp in (ast.FunctionDef, ast.AsyncFunctionDef):
                for fn in self.nodes(tp):
                    table.setdefault(fn.name, []).append(fn)  # type: ignore[attr-defined]
            self._cache[("functions", 0)] = table  # type: ignore[index]
        return table.get(name, [])  # type: ignore[union-attr]

    def under_unknown_with(self, node: ast.AST, known: frozenset[str]) -> bool:
        """True when a ``with`` around ``node`` (in its own function) names a context outside ``known``: it
        may switch modes or autograd, so a rule that cannot tell stays silent."""
        for parent in self.ancestors(node):
            if isinstance(parent, DEFINITIONS):
                return False
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                for item in parent.items:
                    expr = item.context_expr
                    func = expr.func if isinstance(expr, ast.Call) else expr
                    if last_name(func) not in known:
                        return True
        return False

    def calls_within(self, container: ast.AST) -> list[ast.Call]:
        """Every call inside ``container`` (nested functions, lambdas and comprehensions included), in the
        order of ``ast.walk``; found once per container (the list is shared: do not change it)."""
        key = ("calls_within", id(container))
        known = self._cache.get(key)  # type: ignore[arg-type]
        if known is not None and known[0] is container:  # type: ignore[index]
            return known[1]  # type: ignore[index, return-value]
        found = walk_calls(container)
        self._cache[key] = (container, found)  # type: ignore[index]
        return found

    def helpers_called(self, container: ast.AST, depth: int = 3) -> list[ast.AST]:
        """Same-file functions that code in ``container`` calls, followed transitively up to ``depth`` levels:
        ``f(...)``, ``self.f(...)``, ``obj.f(...)`` (any function or method of the file named ``f``). Found once
        per container and depth (the list is shared: do not change it)."""
        key = ("helpers_called", id(container), depth)
        known = self._cache.get(key)  # type: ignore[arg-type]
        if known is not None and known[0] is container:  # type: ignore[index]
            return known[1]  # type: ignore[index, return-value]
        found = self._helpers_called(container, depth)
        self._cache[key] = (container, found)  # type: ignore[index]
        return found

    def _helpers_called(self, container: ast.AST, depth: int) -> list[ast.AST]:
        seen: dict[int, ast.AST] = {}
        frontier = [container]
        for _ in range(depth):
            next_frontier = []
            for node in frontier:
                for call in self.calls_within(node):
                    name = last_name(call.func)
                    if name is None:
                        continue
                    for fn in self._callable_as(call, name):
                        if id(fn) not in seen and fn is not container:
                            seen[id(fn)] = fn
                            next_frontier.append(fn)
            frontier = next_frontier
            if not frontier:
                break
        return list(seen.values())

    def _callable_as(self, call: ast.Call, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The functions of the file a call may run by its name; ``model.train()`` / ``model.eval()`` on a
        module runs only a ``train``/``eval`` that a module class of the file overrides, not a ``def train(...)``
        training loop beside it."""
        found = self.functions_named(name)
        if name in ("train", "eval") and isinstance(call.func, ast.Attribute) and self.is_module(call.func.value):
            found = [fn for fn in found if (cls := self.enclosing_class(fn)) is not None
                     and cls.name in self.module_classes]
        return found

    def reaches_call(self, container: ast.AST, predicate: Callable[[ast.Call], bool], depth: int = 3) -> bool:
        """Whether a call satisfying ``predicate`` happens in ``container`` or in a same-file helper it calls
        (transitively, ``depth`` levels): "zeroes its gradients in a helper" counts as zeroing them. Answered
        once per container, predicate and depth (every evaluation loop of a script asks it of the module)."""
        key = ("reaches_call", id(container), predicate, depth)
        known = self._cache.get(key) if cacheable_predicate(predicate) else None  # type: ignore[arg-type]
        if known is not None and known[0] is container:  # type: ignore[index]
            return known[1]  # type: ignore[index, return-value]
        found = any(any(predicate(call) for call in self.calls_within(node))
                    for node in (container, *self.helpers_called(container, depth)))
        if cacheable_predicate(predicate):
            self._cache[key] = (container, found)  # type: ignore[index]
        return found

    def evaluation_regions(self) -> list[tuple[ast.AST, list[ast.Call]]]:
        """Evaluation loops of the file, each with the model calls it runs: a loop over a validation or test
        loader (``for x, y in val_loader``), or a function named like ``evaluate``/``validate``/``test``
        whose loop runs the model. Methods of ``nn.Module``/Lightning classes, ``*_step`` hooks, and
        ``test_*`` functions of test files are left out. Empty unless the file uses torch."""
        cached = self._cache.get(("evaluations", 0))  # type: ignore[arg-type]
        if cached is not None:
            return cached  # type: ignore[return-value]
        regions: list[tuple[ast.AST, list[ast.Call]]] = []
        if self.uses_torch():
            seen: set[int] = set()
            for tp in (ast.FunctionDef, ast.AsyncFunctionDef):
                for fn in self.nodes(tp):
                    if self._is_evaluation_function(fn):  # type: ignore[arg-type]
                        loops = [self.parent(lp) if isinstance(lp, ast.comprehension) else lp for lp in _loops_of(fn)]
                        calls = [c for loop in loops if loop is not None for c in self._model_calls(loop)]
                        calls = list({id(c): c for c in calls}.values())
                        if not calls:
                            calls = self._single_forward_evaluation(fn)  # type: ignore[arg-type]
                        if calls:
                            regions.append((fn, sorted(calls, key=position)))
                            seen.update(id(c) for c in calls)
            for tp in (ast.For, ast.AsyncFor, ast.comprehension):
                for loop in self.nodes(tp):
                    if self._is_evaluation_loader(loop.iter) or self._evaluation_half(loop):  # type: ignore[arg-type]
                        if isinstance(loop, ast.comprehension):
                            loop = self.parent(loop)  # the comprehension expression
                        calls = [c for c in self._model_calls(loop) if id(c) not in seen]
                        if calls:
                            regions.append((loop, sorted(calls, key=position)))
                            seen.update(id(c) for c in calls)
            regions += self._validation_forwards(seen)
        self._cache[("evaluations", 0)] = regions  # type: ignore[index]
        return regions

    def _single_forward_evaluation(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """The model calls of an evaluation function that runs the model without a loop (one full-graph or
        full-batch forward: ``out = model(data.x, data.edge_index)``, then accuracies): the function returns
        what it computes, reads like a metric (``acc``, ``correct``, ``f1``, ``.eq(...)``), and is called
        from a loop of the file that trains (``for epoch ...: train(); test()``) or once after one. It returns
        or prints what it computes; a shape check ``def test(): print(net(torch.randn(1, 3, 32, 32)).size())``
        names no metric."""
        calls = self._model_calls(fn)
        if not calls or not any((isinstance(n, ast.Return) and n.value is not None) or (
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print" and n.args)
                for n in walk_own(fn.body)):
            return []
        metric = False
        for n in walk_own(fn.body):
            word = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
            if word is not None and (_METRIC_WORD.search(word) or word == "eq"):
                metric = True
                break
        if not metric:
            return []
        for site in self.call_sites(fn):
            loop = self.enclosing_loop(site)
            if loop is not None and self.reaches_call(loop, _trains):
                return calls
            if loop is None and self._after_training(site):
                return calls  # `for epoch ...: train(epoch)`, then `test()` once
        program = self.program
        if program is not None:
            for other, site in program.callers(self, fn):  # type: ignore[arg-type]
                loop = other.enclosing_loop(site)
                if loop is None:
                    continue
                if other.reaches_call(loop, _trains):
                    return calls
                for call in other.calls_within(loop):
                    found = program.callee(other, call)
                    if found is not None and found[0].reaches_call(found[1], _trains):
                        return calls
        return []

    def _after_training(self, site: ast.AST) -> bool:
        """Whether a loop that trains runs before ``site`` in the same scope."""
        first = self._first_training_loop(self.scope(site))
        return first is not None and first < position(site)

    def _first_training_loop(self, scope: ast.AST) -> tuple[int, int] | None:
        """The position of the first ``for``/``while`` loop of a scope that trains, found once per scope."""
        loops = self._cache.get(("loops_by_scope", 0))  # type: ignore[arg-type]
        if loops is None:
            loops = {}
            for tp in (ast.For, ast.While):
                for loop in self.nodes(tp):
                    loops.setdefault(id(self.scope(loop)), []).append(loop)
            for found in loops.values():
                found.sort(key=position)
            self._cache[("loops_by_scope", 0)] = loops  # type: ignore[index]
        key = ("first_training_loop", id(scope))
        if key not in self._cache:  # type: ignore[operator]
            self._cache[key] = next((position(loop) for loop in loops.get(id(scope), ())  # type: ignore[union-attr]
                                     if self.reaches_call(loop, _trains)), None)  # type: ignore[index]
        return self._cache[key]  # type: ignore[index, return-value]

    def _validation_forwards(self, seen: set[int]) -> list[tuple[ast.AST, list[ast.Call]]]:
        """The validation half of a function (or script) that trains without a loop over validation data: a
        forward of ``model`` after ``model.eval()``, which comes after the function's last ``backward()`` or
        optimizer step (``model.eval(); output = model(features, adj)`` after the training step of a graph
        network's ``train()``). Each with the statement that holds it as its region."""
        found: list[tuple[ast.AST, list[ast.Call]]] = []
        for call in self.nodes(ast.Call):
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "eval" and not call.args  # type: ignore[attr-defined]
                    and not call.keywords and isinstance(self.parent(call), ast.Expr)):  # type: ignore[attr-defined]
                continue
            model = dotted(call.func.value)  # type: ignore[attr-defined]
            scope = self.scope(call)
            if model is None or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                continue
            own = self._own_calls(scope)
            if own.first_trained is None or not own.first_trained < position(call):
                continue
            last = own.last_trained
            loop = self.enclosing_loop(call)
            named = own.by_callee.get(model, [])
            start = max(bisect.bisect_right(named, (position(call), len(own.calls))),
                        bisect.bisect_left(named, (last, -1)))
            matches = []
            for _, rank in named[start:]:
                forward = own.calls[rank]
                if id(forward) in seen or not self.is_model_call(forward) or self.enclosing_loop(forward) is not loop:
                    continue
                matches.append(rank)
            for rank in sorted(matches):  # in the order of the scope's own walk, as found one by one
                forward = own.calls[rank]
                statement = next(a for a in (forward, *self.ancestors(forward)) if isinstance(a, ast.stmt))
                found.append((statement, [forward]))
                seen.add(id(forward))
        return found

    def _own_calls(self, scope: ast.FunctionDef | ast.AsyncFunctionDef | ast.Module) -> _OwnCalls:
        """The calls of a scope's own body (nested definitions left out), indexed once per scope."""
        key = ("own_calls", id(scope))
        known = self._cache.get(key)  # type: ignore[arg-type]
        if known is None:
            known = self._cache[key] = _OwnCalls(scope)  # type: ignore[index]
        return known  # type: ignore[return-value]

    def _is_evaluation_function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        name = fn.name
        if not _EVAL_FUNCTION.fullmatch(name) or name.endswith("_step"):
            return False
        cls = self.enclosing_class(fn)
        if cls is not None and cls.name in self.module_classes:
            return False
        if name.startswith("test"):
            base = self.path.replace("\\", "/").rsplit("/", 1)[-1]
            if base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py":
                return False
            if any(q.split(".", 1)[0] in ("pytest", "unittest") for q in self.aliases.values()):
                return False
        return True

    def _is_evaluation_loader(self, expr: ast.AST) -> bool:
        for _ in range(3):  # enumerate(val_loader), tqdm(val_loader, ...), iter(...)
            if isinstance(expr, ast.Call) and expr.args and last_name(expr.func) in _LOOP_WRAPPERS:
                expr = expr.args[0]
        if isinstance(expr, ast.Subscript):
            key = expr.slice
            return (isinstance(key, ast.Constant) and isinstance(key.value, str)
                    and bool(_EVAL_WORD.fullmatch(key.value)) and self.loader(expr) is not None)
        name = last_name(expr)
        return name is not None and bool(_EVAL_LOADER.fullmatch(name)) and self.loader(expr) is not None

    def _evaluation_half(self, loop: ast.For | ast.AsyncFor | ast.comprehension) -> bool:
        """A loop over evaluation data not named as a loader (``for x, y in val_data``) that runs no training
        call, in a function whose other loops train: the validation half of a ``train()`` function."""
        expr = loop.iter
        for _ in range(3):  # enumerate(val_data), tqdm(...), batches(val_data, batch_size)
            if isinstance(expr, ast.Call) and expr.args:
                expr = expr.args[0]
        name = last_name(expr)
        if name is None or not _EVAL_DATA.fullmatch(name) or isinstance(loop, ast.comprehension):
            return False
        fn = self.scope(loop)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.reaches_call(loop, _trains):
            return False
        return any(other is not loop and self.reaches_call(other, _trains) for other in _loops_of(fn))

    def _model_calls(self, region: ast.AST) -> list[ast.Call]:
        """Forward calls ``model(x)`` in a region (nested functions excluded)."""
        found = []
        stack = list(ast.iter_child_nodes(region))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Call) and self.is_model_call(node) and not self.is_loss_call(node):
                found.append(node)
            stack.extend(ast.iter_child_nodes(node))
        return found

    def call_sites(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """Calls of a same-file function by its name: ``f(...)``, ``self.f(...)``, ``obj.f(...)``."""
        return list(self.calls_named(fn.name))

    def calls_named(self, name: str) -> list[ast.Call]:
        """Every call of the file whose callee's last name is ``name`` (``f(...)``, ``x.f(...)``), indexed once."""
        table = self._cache.get(("calls_named", 0))  # type: ignore[arg-type]
        if table is None:
            table = {}
            for call in self.nodes(ast.Call):
                key = last_name(call.func)  # type: ignore[attr-defined]
                if key is not None:
                    table.setdefault(key, []).append(call)
            self._cache[("calls_named", 0)] = table  # type: ignore[index]
        return table.get(name, [])  # type: ignore[union-attr]

    def calls_of(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """The calls of a same-file function by its name, where that name is unambiguous: ``f(...)`` (or
        ``utils.f(...)``) for a function, ``self.f(...)`` / ``obj.f(...)`` for a method; none when another
        function or method of the same kind has that name (stricter than ``call_sites``)."""
        method = is_bound_method(fn, self.parent(fn))
        named = self.functions_named(fn.name)
        if sum(1 for f in named if is_bound_method(f, self.parent(f)) == method) != 1:
            return []
        calls = self.calls_named(fn.name)
        if method:
            return [c for c in calls if isinstance(c.func, ast.Attribute)]
        if any(is_bound_method(f, self.parent(f)) for f in named):
            return [c for c in calls if isinstance(c.func, ast.Name)]
        return calls

    def constructions(self, cls: ast.ClassDef) -> list[ast.Call]:
        """The calls ``Cls(...)`` of a class of the file by its plain name."""
        return [c for c in self.calls_named(cls.name) if isinstance(c.func, ast.Name)]
