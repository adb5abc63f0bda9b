"""TW115 torch-compile-recompiles: ``torch.compile`` run on every iteration, or a ``dynamic=False`` model fed
batch shapes that change."""

from __future__ import annotations

import ast

from trainwise.doctor.context import Context, dotted, is_const, keyword, last_name, position, walk_own
from trainwise.doctor.context.functions import function_values, functions
from trainwise.doctor.rule import Rule

_COMPILE = frozenset({"torch.compile"})
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Methods a framework calls once per batch: a compile inside one runs every step.
_PER_BATCH_METHODS = frozenset({"forward", "training_step", "validation_step", "test_step", "predict_step"})
# Decorators that make a function run its body once (then return the cached result).
_CACHED = frozenset({"cache", "lru_cache", "cached_property", "cached"})
_PER_LENGTH = ("every distinct length is a full recompilation, and after torch._dynamo.config.recompile_limit (8) "
               "graphs the other lengths run eagerly")
_UNWRAP = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "track", "progress_bar"})
# Collators that pad each batch to its own longest sequence unless told a fixed length.
_PADDING_COLLATORS = frozenset({"DataCollatorWithPadding", "DataCollatorForSeq2Seq",
                                "DataCollatorForTokenClassification", "DataCollatorForLanguageModeling"})


class TorchCompileRecompiles(Rule):
    """`torch.compile` run on every training iteration, or a `dynamic=False` model fed batches that change shape.

    ## What it does
    Finds `torch.compile(...)` (of a model or a function) called inside a loop over batches (a DataLoader,
    batches, steps, a `while` loop), or inside a function that such a loop calls, or inside a module's
    `forward` or a LightningModule's `training_step` (which run once per batch); `model =
    torch.compile(model)` inside a loop over epochs (it compiles the compiled model again); and a model
    compiled with `dynamic=False` that a loop calls on the batches of a DataLoader of the file whose shapes
    change every step: a loader whose `collate_fn` pads each batch to its own longest sequence
    (`pad_sequence`, `DataCollatorWithPadding`), or a tokenizer called in the loop with `padding=True`.

    ## Why is this bad?
    `torch.compile` wraps the model anew at each call: on torch 2.13 on a CPU, compiling a small MLP on
    every iteration cost about ten times the compiled call (1.1 to 2 ms against 0.11 to 0.16 ms per step)
    even though dynamo found its cache, and compiling a new lambda over a value that changes each step cost
    50 to 65 ms per step (the script is in docs/doctor.md). With
    `dynamic=False` every new input shape is a full new compilation: batches padded to their own length add
    one per distinct length until
    `torch._dynamo.config.recompile_limit` (8), after which the calls that match no graph run eagerly,
    uncompiled, with only a log warning. `trainwise lab recompiles` measures the recompilations, and the
    run-time guard (`trainwise.guard`, the Trainer with `compile=True`) reports the same code when a
    compiled forward recompiles again and again.

    The rule stays silent on `torch.compile` at module level, before the loop, in a function called once,
    under an `if` (a cache such as `if self._compiled is None:`) or in a cached function; on a compilation
    of the same model once per epoch (a wrapper per epoch, dynamo's cache found); on `dynamic=True`
    and the default `dynamic=None` (dynamo makes a changing dimension dynamic after one recompile); on a
    loader whose only other shape is its short last batch (one more graph, once: not worth a finding); on
    inputs marked with `torch._dynamo.mark_dynamic`; and on a compiled model it cannot tie to the loop that calls it.

    ## Example
    ```python
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for x, y in loader:
        compiled = torch.compile(model)
        loss = criterion(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    compiled = torch.compile(model)
    for x, y in loader:
        loss = criterion(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    ## Fix safety
    There is no automatic fix: moving the compilation out of the loop, or choosing `dynamic=None`,
    `drop_last=True` or fixed-length padding, is a change to the program the author has to make.
    """

    code = "TW115"
    name = "torch-compile-recompiles"
    message = "torch.compile runs on every iteration, or a dynamic=False compiled model gets changing shapes"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._per_iteration: dict[int, tuple[ast.AST, ast.Call]] | None = None

    def visit_Call(self, node: ast.Call) -> None:
        """``torch.compile(...)``: where it runs, and, with ``dynamic=False``, what it is fed."""
        if (self.ctx.qualname(node.func) or "") not in _COMPILE:
            return
        what = _what(node)
        loop = self._data_loop_around(node)
        if loop is not None and self._over_epochs(loop):
            self.report(node, f"`{what} = torch.compile({what})` in the loop at line {loop.lineno} compiles the "
                              f"compiled object again on every iteration: each round wraps the last wrapper and "
                              f"traces it anew, and from the second on `{what}` is no longer an nn.Module (on torch "
                              f"2.13 torch.compile of a compiled module returns a function); compile once before "
                              f"the loop")
            return
        if loop is not None:
            self.report(node, f"`torch.compile({what})` runs on every iteration of the loop at line {loop.lineno}: "
                              f"each call wraps and guards it anew, and compiles it again wherever what it "
                              f"compiles changes; compile once before the loop and call the compiled object "
                              f"inside it")
            return
        step = self._per_iteration_function(node)
        if step is not None:
            self.report(node, f"`torch.compile({what})` runs each time {step}: compile once (in __init__, before "
                              f"the loop, or behind `if self._compiled is None:`) and call the compiled object "
                              f"there")
            return
        dynamic = keyword(node, "dynamic")
        if dynamic is not None and is_const(dynamic.value, False) and not any(
                name.endswith("mark_dynamic") for name in self.ctx.called):
            self._changing_shapes(node)

    # ------------------------------------------------------------------------------- compiled per iteration
    def _data_loop_around(self, node: ast.Call) -> ast.AST | None:
        """The innermost loop over batches, in the same function, whose every iteration runs ``node``: none when
        an ``if`` between them may skip it. A loop over epochs counts only where the compilation rebinds what it
        compiles (``model = torch.compile(model)``, which wraps the wrapper again each epoch); otherwise it
        wraps once per epoch, which costs little."""
        child: ast.AST = node
        for parent in self.ctx.ancestors(node):
            if isinstance(parent, (*_FUNCTIONS, ast.Lambda, ast.ClassDef)):
                return None
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                return None
            if isinstance(parent, _LOOPS) and child in parent.body and self.ctx.iterates_over_data(parent):
                return parent if not self._over_epochs(parent) or _rewraps(self.ctx, node) else None
            child = parent
        return None

    def _over_epochs(self, loop: ast.AST) -> bool:
        """A loop over epochs: its target is named for epochs, or it holds a loop over batches."""
        if isinstance(loop, (ast.For, ast.AsyncFor)) and any(
                isinstance(n, ast.Name) and "epoch" in n.id.lower() for n in ast.walk(loop.target)):
            return True
        return any(isinstance(n, _LOOPS) and n is not loop and self.ctx.iterates_over_data(n)
                   for n in walk_own(loop.body))  # type: ignore[attr-defined]

    def _per_iteration_function(self, node: ast.Call) -> str | None:
        """The function holding ``node`` when it runs once per batch: called from a data loop of the file (or
        a helper of one), or a module's ``forward``/``training_step``; none under an ``if`` or a cache."""
        fn = self.ctx.scope(node)
        if not isinstance(fn, _FUNCTIONS) or any(last_name(d.func if isinstance(d, ast.Call) else d) in _CACHED
                                                 for d in fn.decorator_list):
            return None
        child: ast.AST = node
        for parent in self.ctx.ancestors(node):
            if parent is fn:
                break
            if isinstance(parent, (ast.If, ast.IfExp, *_LOOPS)) and child is not getattr(parent, "test", None):
                return None  # under a condition (a cache), or in the function's own loop (see _data_loop_around)
            child = parent
        cls = self.ctx.enclosing_class(fn)
        if fn.name in _PER_BATCH_METHODS and cls is not None and self.ctx.scope(fn) is cls \
                and cls.name in self.ctx.module_classes:
            return f"`{cls.name}.{fn.name}` runs, once per batch"
        found = self._functions_per_iteration().get(id(fn))
        if found is None:
            return None
        loop, call = found
        return f"`{fn.name}` is called, on every iteration of the loop at line {loop.lineno} (line {call.lineno})"

    def _functions_per_iteration(self) -> dict[int, tuple[ast.AST, ast.Call]]:
        """id of each same-file function that a loop over data calls (itself or through helpers), with that
        loop and the call in it."""
        if self._per_iteration is None:
            found: dict[int, tuple[ast.AST, ast.Call]] = {}
            summaries = functions(self.ctx)
            for loop_type in _LOOPS:
                for loop in self.ctx.nodes(loop_type):
                    if not self.ctx.iterates_over_data(loop) or self._over_epochs(loop):
                        continue
                    for statement in loop.body:  # type: ignore[attr-defined]
                        for reached in summaries.reached(statement, depth=2):
                            if _runs_every_time(self.ctx, reached.call, statement):
                                found.setdefault(id(reached.function), (loop, reached.call))
            self._per_iteration = found
        return self._per_iteration

    # ------------------------------------------------------------------------------------- changing shapes
    def _changing_shapes(self, node: ast.Call) -> None:
        """A ``dynamic=False`` compiled model called in a loop over a DataLoader whose batches change shape."""
        assign = self.ctx.parent(node)
        if not isinstance(assign, ast.Assign) or len(assign.targets) != 1:
            return
        name = dotted(assign.targets[0])
        if name is None:
            return
        for call in self.ctx.nodes(ast.Call):
            if dotted(call.func) != name or position(call) <= position(node):  # type: ignore[attr-defined]
                continue
            if isinstance(assign.targets[0], ast.Name) and not any(
                    b.stmt is assign for b in self.ctx.reaching(call.func, call)):  # type: ignore[attr-defined]
                continue
            loop = self.ctx.enclosing_loop(call)
            if loop is None or not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            reason = self._shape_change(loop)
            if reason is not None:
                self.report(node, f"`{name}` is compiled with dynamic=False and called (line {call.lineno}) on "
                                  f"{reason}; leave dynamic unset (dynamo then makes the changing dimension "
                                  f"dynamic), or give the batches one shape (padding to a fixed "
                                  f"length)")
                return

    def _shape_change(self, loop: ast.For | ast.AsyncFor) -> str | None:
        """Why the batches of the loop's DataLoader change shape, or None when it cannot tell."""
        source = _unwrap(loop.iter)
        info = self.ctx.loader(source) if source is not None else None
        if info is None or info.call is None:
            return None
        loader, text = info.call, self.ctx.segment(source)
        collate = keyword(loader, "collate_fn")
        if collate is not None and self._pads_per_batch(collate.value, loader):
            return f"the batches of `{text}`, padded each to its own longest sequence by its collate_fn: {_PER_LENGTH}"
        for sub in walk_own(loop.body):
            if isinstance(sub, ast.Call) and _pads_to_longest(sub) and last_name(sub.func) in (
                    "tokenizer", "tokenize", "encode_plus", "batch_encode_plus", "__call__", "processor"):
                return (f"batches tokenized with padding to their own longest sequence (line {sub.lineno}): "
                        f"{_PER_LENGTH}")
        return None

    def _pads_per_batch(self, value: ast.AST, at: ast.AST) -> bool:
        """A collate_fn that pads each batch to its own length: a function of the file calling
        ``pad_sequence`` (or a tokenizer with padding to the longest), or a padding collator."""
        if isinstance(value, ast.Call) and last_name(value.func) in _PADDING_COLLATORS:
            padding = keyword(value, "padding")
            return padding is None or _longest(padding.value)
        found = function_values(self.ctx, value, at)
        for fv in found or ():
            for sub in ast.walk(fv.function):
                if isinstance(sub, ast.Call) and (last_name(sub.func) == "pad_sequence" or _pads_to_longest(sub)):
                    return True
        return False


def _what(call: ast.Call) -> str:
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Lambda):
        return "lambda ..."
    name = dotted(first) if first is not None else None
    return name or "..."


def _rewraps(ctx: Context, call: ast.Call) -> bool:
    """``model = torch.compile(model)``: the compiled object replaces what was compiled."""
    assign = ctx.parent(call)
    return isinstance(assign, ast.Assign) and bool(call.args) and dotted(call.args[0]) is not None and any(
        dotted(t) == dotted(call.args[0]) for t in assign.targets)


def _unwrap(expr: ast.AST) -> ast.AST | None:
    """``enumerate(tqdm(loader))`` -> ``loader``."""
    for _ in range(4):
        if isinstance(expr, ast.Call) and last_name(expr.func) in _UNWRAP and expr.args:
            expr = expr.args[0]
    return expr if isinstance(expr, (ast.Name, ast.Attribute)) else None


def _longest(value: ast.AST) -> bool:
    return is_const(value, True) or is_const(value, "longest")


def _pads_to_longest(call: ast.Call) -> bool:
    """A tokenizer-style call with ``padding=True`` or ``padding="longest"``."""
    padding = keyword(call, "padding")
    return padding is not None and _longest(padding.value)


def _runs_every_time(ctx: Context, call: ast.Call, statement: ast.AST) -> bool:
    """Whether ``call`` (inside ``statement``, a statement of a loop's body, or in a function it reaches) runs
    every time its statement or function does: not under an ``if`` or in a loop of its own there."""
    child: ast.AST = call
    for parent in ctx.ancestors(call):
        if parent is statement:
            return not isinstance(statement, (ast.If, *_LOOPS))
        if isinstance(parent, _FUNCTIONS):
            return True
        if isinstance(parent, (ast.If, ast.IfExp, *_LOOPS, ast.Lambda)) and child is not getattr(parent, "test", None):
            return False
        child = parent
    return True
