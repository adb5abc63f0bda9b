"""TW301 torch-load-without-weights-only: ``torch.load`` may unpickle arbitrary code."""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context import Context, dotted, has_star_kwargs, is_const, is_param, keyword, last_name
from trainwise.doctor.project import TorchRequirement, torch_requirements
from trainwise.doctor.rule import FixAvailability, Rule

_LOADS = frozenset({"torch.load", "torch.serialization.load"})

_SAFE_DEFAULT_SINCE = (0, 2, 6)  # torch.load defaults to weights_only=True from torch 2.6
# A caller's switch for an unsafe load: true asks for it (`allow_pickle`, `unsafe_load`, `trust_checkpoint`).
_UNSAFE_SWITCH = re.compile(r"(allow_pickle|unsafe|trust)", re.IGNORECASE)


class TorchLoadWithoutWeightsOnly(Rule):
    """`torch.load` without `weights_only=True`, or with `weights_only=False`.

    ## What it does
    Finds calls of `torch.load` that do not pass `weights_only=True`, unless the project declares a torch of
    at least 2.6, where that is the default.

    ## Why is this bad?
    A checkpoint is a pickle. Without `weights_only=True`, loading it may run any code the file's author
    put in it: a checkpoint downloaded from the internet, or shared in a team folder, becomes a program
    you execute. `weights_only=True` restricts unpickling to tensors, primitive types and dictionaries
    (the default only since torch 2.6, and code often runs on older versions or passes `False` to silence
    an error). Loading through trainwise (`trainwise.checkpoint`) is safe and is not reported.

    The rule reads the torch requirement the file's project declares: the nearest folder, from the file's
    own upwards, that holds a `pyproject.toml` (`[project]` `dependencies` and `optional-dependencies`),
    `setup.cfg` (`install_requires`, `extras_require`), `setup.py` (never read nor run) or
    `requirements*.txt` (the search stops at a folder holding `.git`). When every versioned declaration of
    torch there has a lower bound of at least 2.6 (`torch>=2.6`, `torch==2.7.1`, `torch~=2.6`), a call
    without `weights_only` is safe and is not reported. Otherwise it is, and when a declaration admits an
    older torch the message names it. `weights_only=False` is reported whatever the version, and so is a
    call that passes a `pickle_module`: with one, torch 2.6 and later default to `weights_only=False` again.
    A load that runs only when the caller asked for it is not reported: on the branch where the function's own
    `weights_only` parameter (or `self.weights_only`) is false, or an `allow_pickle` / `unsafe` switch is true.
    A load that forwards its function's own `**kwargs` (`torch.load(io.BytesIO(data), **kwargs)` in a
    distributed-loading helper) is reported when the function has callers in the run and none of them passes
    `weights_only` (nor a `**` of its own): the message names them. With no caller, what it gets is unknown.

    `trainwise lab strict-false` measures it: wrapped checkpoints: strict=False vs load_weights.

    ## Example
    ```python
    import torch

    state = torch.load("checkpoint.pt", map_location="cpu")
    ```

    ## Use instead
    ```python
    import torch

    state = torch.load("checkpoint.pt", map_location="cpu", weights_only=True)
    ```

    ## Fix safety
    The fix adds `weights_only=True` (or turns `weights_only=False` into `True`). It is unsafe: a file that
    holds custom Python objects (a whole pickled model, an optimizer with a custom class, `argparse`
    namespaces) stops loading and needs `torch.serialization.add_safe_globals`. No fix is offered when a
    `pickle_module` is passed.
    """

    code = "TW301"
    name = "torch-load-without-weights-only"
    message = "torch.load without weights_only=True can run arbitrary code from the file"
    fix_availability = FixAvailability.SOMETIMES
    fix_safe = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._declared: tuple[bool, TorchRequirement | None] | None = None

    def visit_Call(self, node: ast.Call) -> None:
        """``torch.load(...)`` through any import alias."""
        if self.ctx.qualname(node.func) not in _LOADS:
            return
        forwarded, related = "", ()
        if has_star_kwargs(node):
            callers = self._callers_without_weights_only(node)
            if not callers:
                return
            program = self.ctx.program
            names = [program.where(c, s) if program is not None else f"line {s.lineno}" for c, s in callers[:3]]
            forwarded = f" (its callers pass none through `**`: {', '.join(names)})"
            if program is not None:
                related = tuple(program.place(c, s, "called here without weights_only") for c, s in callers[:3])
        kw = keyword(node, "weights_only")
        if (kw is None or is_const(kw.value, False)) and self._asked_by_caller(node):
            return
        custom_pickle = keyword(node, "pickle_module") is not None or len(node.args) >= 3
        if kw is None:
            safe_default, admitting = self._declared_torch()
            if safe_default and not custom_pickle:
                return
            fix = None if custom_pickle or forwarded else self.make_fix(node, _add_weights_only,
                                                                        "add weights_only=True")
            if safe_default:  # and a pickle_module: torch's default is weights_only=False again
                message = ("torch.load with a pickle_module and without weights_only=True can run arbitrary code "
                           "from the file (a pickle_module turns the torch 2.6 default off); pass weights_only=True")
            else:
                message = (f"torch.load without weights_only=True can run arbitrary code from the file{forwarded}; "
                           "pass weights_only=True")
                if admitting is not None:
                    message += (f" (the project's declared `{admitting.text}` in {admitting.source} admits torch "
                                "< 2.6, where weights_only defaults to False)")
            self.report(node, message, fix=fix, related=related)
        elif is_const(kw.value, False):
            fix = None if custom_pickle else self.make_fix(node, _set_weights_only, "set weights_only=True")
            self.report(
                node,
                "torch.load with weights_only=False can run arbitrary code from the file; "
                "use weights_only=True (and torch.serialization.add_safe_globals for custom types)",
                fix=fix,
            )

    def _callers_without_weights_only(self, node: ast.Call) -> list[tuple[Context, ast.Call]]:
        """For ``torch.load(f, **kwargs)`` where ``kwargs`` is the enclosing function's own ``**`` parameter:
        the places that call the function, when there are some and none of them passes ``weights_only`` (nor
        a ``**`` of its own); else nothing (what ``kwargs`` holds is unknown)."""
        fn = self.ctx.scope(node)
        star = [kw.value for kw in node.keywords if kw.arg is None]
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.args.kwarg is None or not all(
                isinstance(v, ast.Name) and v.id == fn.args.kwarg.arg for v in star):  # type: ignore[union-attr]
            return []
        top = self.ctx.scope(fn) is self.ctx.tree
        sites = [(self.ctx, c) for c in self.ctx.call_sites(fn) if self.ctx.scope(c) is not fn and (
            isinstance(c.func, ast.Name) if top else dotted(c.func) == f"self.{fn.name}")]
        program = self.ctx.program
        if program is not None and top:
            sites += program.callers(self.ctx, fn)
        if not sites or any(keyword(c, "weights_only") is not None or has_star_kwargs(c) for _, c in sites):
            return []
        return sites

    def _asked_by_caller(self, node: ast.AST) -> bool:
        """Whether ``node`` runs only on a branch where the enclosing function's caller asked for an unsafe
        load: inside ``if not weights_only:`` (or the ``else`` of ``if weights_only:``), after an ``if
        weights_only: return ...``, inside ``if allow_pickle:``, after ``if not allow_pickle: raise``."""
        fn = self.ctx.scope(node)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child: ast.AST = node
        for parent in self.ctx.ancestors(node):
            if isinstance(parent, ast.If) and child is not parent.test \
                    and _asks_unsafe(fn, parent.test, holds=any(child is s for s in parent.body)):
                return True
            for statements in _statement_lists(parent):
                if any(child is s for s in statements):
                    before = statements[: next(i for i, s in enumerate(statements) if s is child)]
                    if any(isinstance(s, ast.If) and not s.orelse and _ends(s.body)
                           and _asks_unsafe(fn, s.test, holds=False) for s in before):
                        return True
            if parent is fn:
                break
            child = parent
        return False

    def _declared_torch(self) -> tuple[bool, TorchRequirement | None]:
        """Whether the project's declared torch is at least 2.6 everywhere it is versioned (then
        ``weights_only=True`` is the default), and else a declaration that admits an older torch, if any."""
        if self._declared is None:
            found = torch_requirements(self.ctx.path)
            declared = () if found is None else found[1]
            versioned = [r for r in declared if r.versioned]
            admitting = next((r for r in versioned if r.admits_below(_SAFE_DEFAULT_SINCE)), None)
            if admitting is None and not versioned:
                admitting = next(iter(declared), None)  # `torch` alone: any version
            self._declared = (bool(versioned) and admitting is None, admitting)
        return self._declared


def _statement_lists(node: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists directly inside ``node`` (body, else, finally, handlers' bodies are their own)."""
    return [getattr(node, name) for name in ("body", "orelse", "finalbody")
            if isinstance(getattr(node, name, None), list) and getattr(node, name)
            and isinstance(getattr(node, name)[0], ast.stmt)]


def _ends(statements: list[ast.stmt]) -> bool:
    """Whether a block always leaves: its last statement returns or raises."""
    return bool(statements) and isinstance(statements[-1], (ast.Return, ast.Raise))


def _asks_unsafe(fn: ast.FunctionDef | ast.AsyncFunctionDef, test: ast.expr, *, holds: bool) -> bool:
    """Whether ``test`` being ``holds`` means the caller of ``fn`` asked for an unsafe load: its own
    ``weights_only`` parameter (or ``self.weights_only``) false, or an ``allow_pickle``-like switch true."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, holds = test.operand, not holds
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
            and isinstance(test.comparators[0].value, bool):
        equal = isinstance(test.ops[0], (ast.Is, ast.Eq))
        if not equal and not isinstance(test.ops[0], (ast.IsNot, ast.NotEq)):
            return False
        holds = holds == (equal == test.comparators[0].value)
        test = test.left
    name = last_name(test)
    caller_chose = (isinstance(test, ast.Name) and is_param(fn, test.id)) or (
        isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id == "self")
    if name is None or not caller_chose:
        return False
    if name.endswith("weights_only"):
        return not holds
    return holds and _UNSAFE_SWITCH.search(name) is not None


def _add_weights_only(node: object, cst: object) -> object:
    """Append ``weights_only=True``, following the call's layout (one line, or one argument per line)."""
    c = cst
    new_arg = c.Arg(  # type: ignore[attr-defined]
        value=c.Name("True"),  # type: ignore[attr-defined]
        keyword=c.Name("weights_only"),  # type: ignore[attr-defined]
        equal=c.AssignEqual(whitespace_before=c.SimpleWhitespace(""), whitespace_after=c.SimpleWhitespace("")),  # type: ignore[attr-defined]
    )
    args = list(node.args)  # type: ignore[attr-defined]
    if not args:
        return node.with_changes(args=[new_arg])  # type: ignore[attr-defined]
    last = args[-1]
    space = c.Comma(whitespace_after=c.SimpleWhitespace(" "))  # type: ignore[attr-defined]
    if not isinstance(last.comma, c.Comma):  # type: ignore[attr-defined]
        closing = last.whitespace_after_arg
        indent = _argument_indent(node, args, c)
        if isinstance(closing, c.ParenthesizedWhitespace) and indent is not None:  # type: ignore[attr-defined]
            # ")" on a line of its own: the new argument gets a line of its own before it, at the arguments'
            # indent; comments after the last argument stay after it.
            args[-1] = last.with_changes(comma=c.Comma(whitespace_after=closing.with_changes(last_line=indent)),  # type: ignore[attr-defined]
                                         whitespace_after_arg=c.SimpleWhitespace(""))  # type: ignore[attr-defined]
            args.append(new_arg.with_changes(whitespace_after_arg=closing.with_changes(
                first_line=c.TrailingWhitespace(), empty_lines=[])))  # type: ignore[attr-defined]
            return node.with_changes(args=args)  # type: ignore[attr-defined]
        args[-1] = last.with_changes(comma=space)
        args.append(new_arg)
        return node.with_changes(args=args)  # type: ignore[attr-defined]
    # A trailing comma. One argument per line: the last one keeps its comma and comment, its line break
    # now leads to the new argument at the same indent, and the new one ends like the last one did.
    trailing = last.comma.whitespace_after
    between = args[-2].comma.whitespace_after if len(args) >= 2 and isinstance(args[-2].comma, c.Comma) else None  # type: ignore[attr-defined]
    if isinstance(trailing, c.ParenthesizedWhitespace) and isinstance(between, c.ParenthesizedWhitespace):  # type: ignore[attr-defined]
        args[-1] = last.with_changes(comma=last.comma.with_changes(
            whitespace_after=trailing.with_changes(last_line=between.last_line)))
        closing = trailing.with_changes(first_line=c.TrailingWhitespace(), empty_lines=[])  # type: ignore[attr-defined]
        args.append(new_arg.with_changes(comma=last.comma.with_changes(whitespace_after=closing)))
    else:
        args[-1] = last.with_changes(comma=space)
        args.append(new_arg.with_changes(comma=last.comma))
    return node.with_changes(args=args)  # type: ignore[attr-defined]


def _argument_indent(node: object, args: list, c: object) -> object | None:
    """The whitespace that starts the last argument's line, when the arguments are one per line."""
    if len(args) >= 2:
        before = args[-2].comma.whitespace_after if isinstance(args[-2].comma, c.Comma) else None  # type: ignore[attr-defined]
    else:
        before = node.whitespace_before_args  # type: ignore[attr-defined]
    return before.last_line if isinstance(before, c.ParenthesizedWhitespace) else None  # type: ignore[attr-defined]


def _set_weights_only(node: object, cst: object) -> object:
    """``weights_only=False`` -> ``weights_only=True``."""
    args = [
        a.with_changes(value=cst.Name("True"))  # type: ignore[attr-defined]
        if a.keyword is not None and a.keyword.value == "weights_only"
        else a
        for a in node.args  # type: ignore[attr-defined]
    ]
    return node.with_changes(args=args)  # type: ignore[attr-defined]
