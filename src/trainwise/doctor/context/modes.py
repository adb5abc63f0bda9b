"""Where code puts a module in eval mode, or back in train mode: ``.eval()``/``.train(False)`` of a module, of a
part of it or around it, of a ``.modules()`` loop variable, ``.apply(...)``, a helper named for norms or freezing,
a method of the model's own class (of any file of the run) that keeps a part in eval (TW108). Every answer leans
towards "kept in eval" when the code does not show otherwise: the rules asking it stay silent then."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from trainwise.doctor.context.frameworks import deliberate, lightning_chain
from trainwise.doctor.context.freezes import under
from trainwise.doctor.context.syntax import dotted, is_const, last_name, method_call, position
from trainwise.doctor.context.values import builders

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NORM_HELPER = re.compile(r"bn|batch_?norm|norm|freeze|frozen", re.IGNORECASE)
_CLIPPING = frozenset({"clip_grad_norm_", "clip_grad_norm", "clip_grad_value_"})


def class_keeps_eval(ctx: Context, path: str, at: ast.AST, part: str) -> bool:
    """Whether the class that builds the model at ``path`` (``values.builders``: of this file or another of
    the run, through factories and registries, or what a trainer's constructions pass) overrides ``train()``,
    puts the frozen ``part`` in eval in one of its methods, or keeps its norm statistics training on purpose."""
    first, _dot, rest = path.partition(".")
    root = f"self.{rest.split('.')[0]}" if first == "self" and rest else first
    inside = "self" + part[len(root):] if under(part, root) and part != root else None
    for built in builders(ctx, root, at):
        if built.cls is None:
            continue
        chain = lightning_chain(built.ctx, built.cls) or [(built.ctx, built.cls)]
        methods = [(c, f) for c, k in chain for f in k.body if isinstance(f, _FUNCS)]
        if any(f.name == "train" for _c, f in methods) or deliberate(chain):
            return True
        if inside is not None and any(puts_in_eval(c, f, inside, 0) for c, f in methods):
            return True
    return False


def puts_in_eval(ctx: Context, fn: ast.AST, part: str, depth: int, outer: str | None = None) -> bool:
    """Whether ``fn`` (a method, or a script's scope) puts ``part`` in eval: ``.eval()`` or ``.train(False)``
    (or ``.train(flag)``) of the part, of a module inside it or around it (``self`` included, not ``outer``),
    or of a ``.modules()`` loop variable; ``.apply(...)``; Lightning's ``freeze()`` (which ends in ``.eval()``);
    a method of the class that does, or an unknown helper named for norms or freezing."""
    for call in ctx.calls_within(fn):
        if isinstance(fn, ast.Module) and not isinstance(ctx.scope(call), ast.Module):
            continue  # a script: its own statements, not its classes' methods
        func = call.func
        if method_call(call, "eval") or (method_call(call, "train") and call.args and not sets_train(call)):
            target = dotted(func.value)  # type: ignore[attr-defined]
            if target is None or (target != outer and (under(part, target) or under(target, part))):
                return True
            if isinstance(func.value, ast.Name) and any(  # type: ignore[attr-defined]
                    b.kind == "for" for b in ctx.bindings_of(func.value)):  # type: ignore[attr-defined]
                return True
            continue
        if method_call(call, "apply"):
            return True
        if method_call(call, "freeze") and not call.args:
            target = dotted(func.value)  # type: ignore[attr-defined]
            if target is not None and (under(part, target) or under(target, part)):
                return True
        name = last_name(func)
        if (name is None or not _NORM_HELPER.search(name) or not isinstance(ctx.parent(call), ast.Expr)
                or (ctx.qualname(func) or "").startswith("torch.")):
            continue  # a helper's result used (``vgg19_bn(...)``), torch's own (``nn.init.kaiming_normal_``)
        if isinstance(func, ast.Attribute) and dotted(func.value) == "self":
            cls = ctx.enclosing_class(fn) if not isinstance(fn, ast.ClassDef) else fn
            own = [f for f in (cls.body if cls is not None else []) if isinstance(f, _FUNCS) and f.name == name]
            if own:
                if depth < 2 and any(puts_in_eval(ctx, f, part, depth + 1, outer) for f in own):
                    return True
                continue
        elif isinstance(func, ast.Name) and ctx.functions_named(name):
            if depth < 2 and any(puts_in_eval(ctx, f, part, depth + 1, outer) for f in ctx.functions_named(name)):
                return True
            continue
        return True  # a helper of unknown body, named for norms or freezing: stay silent
    return False


def kept_in_eval(ctx: Context, region: ast.AST, train: ast.Call, receiver: str, part: str) -> bool:
    """Whether the loop (or function), after the ``.train()``, puts something back in eval mode (other
    than switching the whole receiver to eval for validation) or calls a helper that may do so."""
    after = [c for c in ctx.calls_within(region) if position(c) > position(train)]
    for call in after:
        func = call.func
        if method_call(call, "eval"):
            target = dotted(func.value)  # type: ignore[attr-defined]
            if target is None:
                return True  # unknown: stay silent
            if target == receiver:
                continue  # the whole model switched to eval for validation
            outside = target.startswith(receiver + ".") and not (
                target == part or target.startswith(part + ".") or part.startswith(target + ".")
            )
            if not outside:  # the frozen part, a part of it, or anything else (a .modules() loop variable)
                return True
            continue
        if method_call(call, "train") and call.args and is_const(call.args[0], False):
            return dotted(func.value) != receiver  # type: ignore[attr-defined]
        if method_call(call, "apply"):
            return True
        name = last_name(func)
        if name is not None and _NORM_HELPER.search(name) and _may_switch_modes(ctx, call, receiver):
            return True
        if isinstance(func, ast.Name) and any(
            _partial_eval(ctx, c) for fn in ctx.functions_named(func.id) for c in ctx.calls_within(fn)
        ):
            return True
    return False


def _may_switch_modes(ctx: Context, call: ast.Call, receiver: str) -> bool:
    """Whether a call named for norms or freezing may switch modes: not torch's own function or a gradient
    clipping (``clip_grad_norm_``, ``F.normalize``, ``p.grad.norm(2)``), and, when its result is used, one that
    is handed the model (``model = freeze_bn(model)``)."""
    if (ctx.qualname(call.func) or "").startswith("torch.") or last_name(call.func) in _CLIPPING:
        return False
    root = receiver.split(".")[0]
    return isinstance(ctx.parent(call), ast.Expr) or any(
        isinstance(n, ast.Name) and n.id == root for n in ast.walk(call))


def _partial_eval(ctx: Context, call: ast.Call) -> bool:
    """In a helper: ``.apply(...)``, or ``.eval()`` of a submodule or of a loop variable (``m.eval()`` over
    ``.modules()``); a plain ``model.eval()`` (an evaluation helper) does not count."""
    if method_call(call, "apply"):
        return True
    if not method_call(call, "eval"):
        return False
    target = call.func.value  # type: ignore[attr-defined]
    if isinstance(target, ast.Attribute):
        return True
    return isinstance(target, ast.Name) and any(b.kind == "for" for b in ctx.bindings_of(target))


def sets_train(call: ast.Call) -> bool:
    """``x.train()`` or ``x.train(True)``."""
    return method_call(call, "train") and not call.keywords and (
        not call.args or (len(call.args) == 1 and is_const(call.args[0], True)))
