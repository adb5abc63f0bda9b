"""Interprocedural evaluation questions (TW103, TW104): code that runs a model its callers, or its class, put
in eval mode.

``Functions`` reads one block at a time (the loops after ``model.eval()``); this module follows calls across
functions and files:

- ``Evaluation.in_eval_mode(at, model)``: whether ``model`` was put in eval mode before ``at``, in its block or
  one around it, with no ``.train()`` in between;
- ``Evaluation.loops_entered_in_eval()``: the loops of a module-level function that run a module it takes as
  a parameter, when every call of the function (from any file of the run) passes a module already in eval mode;
- ``Evaluation.inference_methods()``: methods of a class that is no module which run a model the class keeps in
  eval mode, in a file that trains nothing, when no file of the project that trains calls a method of that name.

One ``Evaluation`` per file, built lazily by :func:`evaluation` and kept with the ``Context``
(``ctx.analysis``); it owns its cache (the two lists above, computed once per file) and asks the file's
``Functions`` for the block-level facts (eval markers, model calls, whether code trains).
"""

from __future__ import annotations

import ast

from trainwise.doctor.context import DEFINITIONS, Context, argument, dotted, is_param, method_call, walk_own
from trainwise.doctor.context.functions import (
    blocks_of,
    functions,
    is_eval_call,
    outer_loops,
    same_or_below,
    unchain,
)


class Evaluation:
    """The evaluation questions of one file that follow calls into other functions or files; its two lists
    are computed on first use and cached here (``in_eval_mode`` is cheap and not cached)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.functions = functions(ctx)
        self._entered_in_eval: list[tuple[ast.AST, tuple[ast.Call, ...]]] | None = None
        self._inference_methods: list[tuple[ast.AST, tuple[ast.Call, ...]]] | None = None

    def loops_entered_in_eval(self) -> list[tuple[ast.AST, tuple[ast.Call, ...]]]:
        """The outer loops of a module-level function that run a module it takes as a parameter, when every
        call of the function (from this file or another of the run) passes a module its caller put in eval mode
        before, in the same block or one around it (``model.eval()``, then ``evaluate_valid(model, data)``): an
        evaluation whatever the function's name."""
        if self._entered_in_eval is not None:
            return self._entered_in_eval
        found: list[tuple[ast.AST, tuple[ast.Call, ...]]] = []
        self._entered_in_eval = found
        for fn in self.ctx.tree.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            loops = [(loop, calls) for stmt in fn.body for loop in outer_loops(stmt)
                     if (calls := self._forwards_of_parameters(fn, loop))]
            if loops and self._entered_in_eval_mode(fn, {dotted(c.func).split(".")[0]  # type: ignore[union-attr]
                                                         for _, calls in loops for c in calls}):
                found += loops
        return found

    def _forwards_of_parameters(self, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                               loop: ast.AST) -> tuple[ast.Call, ...]:
        """The model calls of ``loop`` whose module is a parameter of ``fn`` or a part of one."""
        return tuple(c for c in self.functions.model_calls(loop)
                     if is_param(fn, (dotted(c.func) or ".").split(".")[0]))  # type: ignore[attr-defined]

    def _entered_in_eval_mode(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, params: set[str]) -> bool:
        """Whether ``fn`` has calls and each passes, for every parameter in ``params``, a module its caller put
        in eval mode before the call (see :meth:`in_eval_mode`)."""
        sites: list[tuple[Context, ast.Call]] = [(self.ctx, c) for c in self.ctx.call_sites(fn)
                                                 if isinstance(c.func, ast.Name)]
        program = self.ctx.program
        if program is not None:
            sites += program.callers(self.ctx, fn)
        if not sites:
            return False
        for ctx, site in sites:
            for param in params:
                value = argument(fn, param, site)
                name = dotted(value) if value is not None else None
                if name is None or not evaluation(ctx).in_eval_mode(site, name):
                    return False
        return True

    def in_eval_mode(self, at: ast.AST, model: str) -> bool:
        """Whether ``model`` was put in eval mode before the statement holding ``at``: a ``model.eval()`` of
        the same block or of a block around it (within the function), with no ``.train()`` of it in between."""
        child: ast.AST = at
        for parent in self.ctx.ancestors(at):
            if isinstance(child, ast.stmt):
                for statements in blocks_of(parent):
                    if not any(s is child for s in statements):
                        continue
                    for earlier in reversed(statements[:next(i for i, s in enumerate(statements) if s is child)]):
                        if self.functions.eval_marker(earlier) == model:
                            return True
                        if self.functions.sets_train_mode(earlier, model):
                            return False
            if isinstance(parent, (*DEFINITIONS, ast.Lambda)):
                return False
            child = parent
        return False

    def inference_methods(self) -> list[tuple[ast.AST, tuple[ast.Call, ...]]]:
        """Methods of a class that is no module (a planner, a predictor, an agent wrapper) that run a model the
        class puts in eval mode and never back in train mode, in a file that trains nothing, when no file of the
        project that trains calls a method of that name: each call records a graph nothing uses."""
        if self._inference_methods is not None:
            return self._inference_methods
        found: list[tuple[ast.AST, tuple[ast.Call, ...]]] = []
        self._inference_methods = found
        if self.functions.trains_here(self.ctx.tree):
            return found
        for cls in self.ctx.nodes(ast.ClassDef):
            if self.ctx.is_module_class(cls):  # type: ignore[arg-type]
                continue
            methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]  # type: ignore[attr-defined]
            switched = [(dotted(unchain(c.func.value)), is_eval_call(c)) for m in methods for c in walk_own(m.body)
                        if isinstance(c, ast.Call) and method_call(c, "eval", "train")]
            models = {name for name, to_eval in switched if to_eval and name and name.startswith("self.")}
            models -= {name for name, to_eval in switched if not to_eval}
            if not models:
                continue
            for method in methods:
                if method.name.startswith("__"):
                    continue
                calls = tuple(c for c in self.functions.model_calls(method)
                              if any(same_or_below(dotted(c.func), m) for m in models))
                if calls and not self._trained_through(method.name):
                    found.append((method, calls))
        return found

    def _trained_through(self, name: str) -> bool:
        """Whether a file of the project that trains (or this one) calls a method called ``name``: its result
        may be differentiated there (a frozen critic's score in a loss, CLIP guidance)."""
        program = self.ctx.program
        if program is None:
            return False
        here = self.ctx.path

        def training_callers(ctx: Context) -> list[str]:
            trains = functions(ctx).trains_here(ctx.tree)
            return [ctx.path] if trains and ctx.calls_named(name) else []

        return any(program.same_project(path, here)
                   for path in program.gather(f"trains, calls {name}", training_callers, needles=(name,)))


def evaluation(ctx: Context) -> Evaluation:
    """The (cached) evaluation questions of one file."""
    return ctx.analysis(Evaluation)
