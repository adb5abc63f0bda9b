"""TW301 torch-load-without-weights-only: ``torch.load`` may unpickle arbitrary code."""

from __future__ import annotations

import ast

from trainwise.doctor.context import has_star_kwargs, is_const, keyword
from trainwise.doctor.rule import FixAvailability, Rule

_LOADS = frozenset({"torch.load", "torch.serialization.load"})


class TorchLoadWithoutWeightsOnly(Rule):
    """`torch.load` without `weights_only=True`, or with `weights_only=False`.

    ## What it does
    Finds calls of `torch.load` that do not pass `weights_only=True`.

    ## Why is this bad?
    A checkpoint is a pickle. Without `weights_only=True`, loading it may run any code the file's author
    put in it: a checkpoint downloaded from the internet, or shared in a team folder, becomes a program
    you execute. `weights_only=True` restricts unpickling to tensors, primitive types and dictionaries
    (the default only since torch 2.6, and code often runs on older versions or passes `False` to silence
    an error). Loading through trainwise (`trainwise.checkpoint`) is safe and is not reported.

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

    def visit_Call(self, node: ast.Call) -> None:
        """``torch.load(...)`` through any import alias."""
        if self.ctx.qualname(node.func) not in _LOADS or has_star_kwargs(node):
            return
        kw = keyword(node, "weights_only")
        custom_pickle = keyword(node, "pickle_module") is not None or len(node.args) >= 3
        if kw is None:
            fix = None if custom_pickle else self.make_fix(node, _add_weights_only, "add weights_only=True")
            self.report(
                node,
                "torch.load without weights_only=True can run arbitrary code from the file; "
                "pass weights_only=True",
                fix=fix,
            )
        elif is_const(kw.value, False):
            fix = None if custom_pickle else self.make_fix(node, _set_weights_only, "set weights_only=True")
            self.report(
                node,
                "torch.load with weights_only=False can run arbitrary code from the file; "
                "use weights_only=True (and torch.serialization.add_safe_globals for custom types)",
                fix=fix,
            )


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
