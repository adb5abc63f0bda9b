"""What a file freezes: which modules get ``requires_grad`` off (``requires_grad_(False)``, a loop over
``parameters()`` setting ``p.requires_grad = False``, all but the head through ``named_parameters()``, a helper
``def freeze(m)`` called on a model), what is unfrozen again, which frozen parts a model holds at a given line,
and where a model a function is given comes from (its call sites, a trainer class's ``self.model``).

One ``Freezes`` per file (``ctx.analysis(Freezes)``), asked by TW108; every answer leans towards "nothing
frozen" when the code does not show it.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainwise.doctor.context.checkpoints import WRAPPERS
from trainwise.doctor.context.modules import HEAD_WORD
from trainwise.doctor.context.syntax import (
    Binding,
    argument,
    dotted,
    init_of,
    is_bound_method,
    is_const,
    is_param,
    keyword,
    method_call,
    position,
)

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_MAX_SITES = 32  # call sites followed from a function to its callers, at most


class Freezes:
    """The freezes of one file and the questions on them (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._freezes: list[tuple[str, ast.AST, bool]] | None = None  # (dotted module, statement, frozen?)
        self.frozen_at: dict[str, ast.AST] = {}  # frozen part -> the statement that freezes it (once found)
        self._any: bool | None = None

    def any_frozen(self) -> bool:
        """Whether the file (using torch) freezes anything."""
        if self._any is None:
            self._any = self.ctx.uses_torch() and any(frozen for _m, _s, frozen in self.all())
        return self._any

    def origins(self, path: str, at: ast.AST, depth: int = 0) -> list[tuple[str, ast.AST, bool]]:
        """``(path, place, called in a loop)``: the module ``path`` at ``at`` and, when its root is a parameter
        of the enclosing function (``def train_one_epoch(model, ...)``) or an attribute that a class's
        ``__init__`` takes as an argument (``self.model = model``), the argument passed at each call site."""
        out = [(path, at, False)]
        fn = self.ctx.scope(at)
        if depth >= 2 or not isinstance(fn, _FUNCS):
            return out
        root, dot, rest = path.partition(".")
        if root == "self":
            cls = self.ctx.enclosing_class(fn)
            if not rest or cls is None or cls.name in self.ctx.module_classes:
                return out
            attr, dot, rest = rest.partition(".")
            init = init_of(cls)
            found = [b for b in self.ctx.attr_bindings.get(f"self.{attr}", [])
                     if self.ctx.enclosing_class(b.stmt) is cls]
            if init is None or len(found) != 1 or self.ctx.scope(found[0].stmt) is not init:
                return out
            value = self.ctx.strip_moves(found[0].value) if found[0].value is not None else None
            if not (isinstance(value, ast.Name) and is_param(init, value.id)):
                return out
            fn, root, sites = init, value.id, self.ctx.constructions(cls)
        elif is_param(fn, root):
            sites = self.ctx.calls_of(fn)  # type: ignore[arg-type]
        else:
            return out
        for call in sites[:_MAX_SITES]:
            arg = self._argument(fn, root, call)  # type: ignore[arg-type]
            target = dotted(arg) if arg is not None else None
            if target is not None:
                in_loop = self.ctx.enclosing_loop(call) is not None
                out.extend((p, a, lp or in_loop) for p, a, lp in self.origins(target + dot + rest, call, depth + 1))
        return out[:_MAX_SITES]

    def _argument(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call,
                  default: bool = False) -> ast.expr | None:
        """The expression a call passes for parameter ``name`` of a same-file ``fn`` (its default value with
        ``default``), or None when unknown (``*args``, ``**kwargs``)."""
        return argument(fn, name, call, method=is_bound_method(fn, self.ctx.parent(fn)), default=default)

    def all(self) -> list[tuple[str, ast.AST, bool]]:
        if self._freezes is None:
            raw: list[tuple[str, ast.AST, bool]] = []
            for node in self.ctx.nodes(ast.Assign):
                value = node.value  # type: ignore[attr-defined]
                if not isinstance(value, ast.Constant) or not isinstance(value.value, bool):
                    continue
                for target in node.targets:  # type: ignore[attr-defined]
                    if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                        loop = self._param_loop(target.value, node)
                        if loop is not None and (value.value or self._freezes_all(loop, node)):
                            raw.append((dotted(loop.iter.func.value), node, not value.value))  # type: ignore[arg-type, union-attr]
            for node in self.ctx.nodes(ast.Call):
                if method_call(node, "requires_grad_"):
                    flag = node.args[0] if node.args else getattr(keyword(node, "requires_grad"), "value", None)  # type: ignore[attr-defined]
                    if flag is None or isinstance(flag, ast.Constant):
                        frozen = is_const(flag, False)
                        target = node.func.value  # type: ignore[attr-defined]
                        loop = self._param_loop(target, node)
                        if loop is not None:
                            if frozen and not self._freezes_all(loop, node):
                                continue
                            module = dotted(loop.iter.func.value)  # type: ignore[union-attr]
                        else:
                            module = dotted(target)  # whether it holds BatchNorm decides, not its name
                        if module is not None:
                            raw.append((module, node, frozen))
            self._freezes = list(raw)
            for module, stmt, frozen in raw:
                self._freezes.extend(self._through_helper(module, stmt, frozen))
        return self._freezes

    def _param_loop(self, expr: ast.AST, at: ast.AST) -> Binding | None:
        """The ``for p in module.parameters()`` (or ``named_parameters()``) loop that binds ``expr``."""
        if not isinstance(expr, ast.Name):
            return None
        for b in self.ctx.bindings_of(expr, at):
            if b.kind == "for" and self.ctx.is_inside(at, b.stmt) and method_call(b.iter, "parameters",
                                                                                    "named_parameters"):
                if b.iter.func.attr == "named_parameters" and b.index != 1:  # type: ignore[union-attr]
                    return None
                if b.iter.args or b.iter.keywords or dotted(b.iter.func.value) is None:  # type: ignore[union-attr]
                    return None
                return b
        return None

    def _freezes_all(self, loop: Binding, at: ast.AST) -> bool:
        """Whether a freeze in ``for name, p in m.named_parameters()`` freezes all of ``m``, but perhaps its
        head: every condition on ``name`` keeps only head parameters (fc, classifier, head) out. A condition
        on anything else (``"bn" not in name``, ``"layer4" in name``) leaves the frozen part unknown."""
        stmt = loop.stmt
        target = getattr(stmt, "target", None)
        if not (isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name)):
            return True
        var = target.elts[0].id
        for node in ast.walk(stmt):
            if not isinstance(node, (ast.If, ast.IfExp)) or not _mentions(node.test, var):
                continue
            if self.ctx.is_inside(at, node):
                in_body = any(self.ctx.is_inside(at, s) for s in _as_list(node.body))
                if not _head_test(node.test, var, excluding=in_body):
                    return False
            elif (isinstance(node, ast.If) and any(isinstance(n, (ast.Continue, ast.Break)) for s in node.body
                                                    for n in ast.walk(s))
                  and not _head_test(node.test, var, excluding=False)):
                return False  # `if "fc" in name: continue` skips the head; any other skip: unknown
        return True

    def _through_helper(self, module: str, stmt: ast.AST, frozen: bool) -> list[tuple[str, ast.AST, bool]]:
        """A freeze of a parameter of a same-file helper (``def freeze(m): m.requires_grad_(False)``, the
        tutorial's ``set_parameter_requires_grad(model, feature_extracting)``), as a freeze of the argument at
        each call. A freeze under ``if flag:`` counts only where the call passes a true constant for ``flag``."""
        fn = self.ctx.scope(stmt)
        root, dot, rest = module.partition(".")
        if not isinstance(fn, _FUNCS) or root in ("self", "cls") or not is_param(fn, root):
            return []
        flags = _functions(self.ctx).flag_conditions(stmt, fn)
        if flags is None and frozen:
            return []
        out = []
        for call in self.ctx.calls_of(fn)[:_MAX_SITES]:
            arg = self._argument(fn, root, call)
            target = dotted(arg) if arg is not None else None
            if target is None:
                continue
            if frozen and not all(_truthy(self.ctx, fn, name, call) is wanted for name, wanted in flags or ()):
                continue
            out.append((target + dot + rest, call, frozen))
        return out

    def frozen_parts(self, receiver: str, call: ast.AST) -> list[str]:
        """Frozen modules inside ``receiver`` (as dotted paths from it, or modules that ``receiver`` is built
        from: ``nn.Sequential(backbone, head)``), still frozen at the ``.train()``."""
        parts: list[str] = []
        scope = self.ctx.scope(call)
        cls = self._local_class_of(receiver, call)
        members = self._members(receiver, call)
        own_cls = self.ctx.enclosing_class(call) if receiver.startswith("self.") else None
        for module, stmt, frozen in self.all():
            if not frozen:
                continue
            path: str | None = None
            stmt_scope = self.ctx.scope(stmt)
            root = module.split(".", 1)[0]
            if stmt_scope is scope or isinstance(stmt_scope, ast.Module):
                if position(stmt) < position(call) and (under(module, receiver) or root in members) and (
                    stmt_scope is scope or self._global(root, call)
                ):
                    path = module
            elif isinstance(stmt_scope, ast.FunctionDef) and stmt_scope.name == "__init__":
                owner = self.ctx.enclosing_class(stmt)
                flags = _functions(self.ctx).flag_conditions(stmt, stmt_scope)
                if cls is not None and owner is cls and under(module, "self") and flags is not None:
                    ctor = self.ctx.value_of(ast.Name(id=receiver, ctx=ast.Load()), call)
                    if isinstance(ctor, ast.Call) and all(_truthy(self.ctx, stmt_scope, name, ctor) is wanted  # type: ignore[arg-type]
                           for name, wanted in flags):  # `if freeze_backbone:` and Net(freeze_backbone=True)
                        path = receiver + module[len("self"):]
                elif own_cls is not None and owner is own_cls and under(module, receiver) and flags == []:
                    path = module  # a trainer class: self.model.backbone frozen in its __init__
            if path is not None and not self.unfrozen(path, receiver) and path not in parts:
                parts.append(path)
                self.frozen_at.setdefault(path, stmt)
        return parts

    def _global(self, name: str, at: ast.AST) -> bool:
        """Whether ``name`` at ``at`` is the module-level variable (not a local or parameter of the same name)."""
        found = self.ctx.lookup(name, at)
        return bool(found) and all(isinstance(self.ctx.scope(b.stmt), ast.Module) for b in found)

    def _members(self, receiver: str, at: ast.AST) -> set[str]:
        """Names a model is built from, whatever value it holds at ``at``: ``nn.Sequential(backbone, head)``,
        ``Net(backbone)``, ``nn.DataParallel(model)``, ``model.train()`` (``model_train = model.train()``, then
        ``model_train = nn.DataParallel(model)`` under ``if cuda:``)."""
        if "." in receiver:
            return set()
        found: set[str] | None = None
        for b in self.ctx.lookup(receiver, at):
            if b.kind != "assign" or b.unpacked or b.value is None:
                return set()
            value = unchain(self.ctx.strip_moves(b.value))
            if isinstance(value, ast.Name):
                if value.id == receiver:
                    continue  # model_train = model_train.cuda()
                names = {value.id}
            elif isinstance(value, ast.Call):
                names = self._built_from(value)
            else:
                return set()
            found = names if found is None else found & names
        return found or set()

    def _built_from(self, value: ast.Call) -> set[str]:
        q = self.ctx.qualname(value.func) or ""
        if q in WRAPPERS and value.args and isinstance(value.args[0], ast.Name):
            return {value.args[0].id}
        local = isinstance(value.func, ast.Name) and value.func.id in self.ctx.module_classes
        if q not in ("torch.nn.Sequential", "torch.nn.ModuleList") and not local:
            return set()
        items = [a.value if isinstance(a, ast.Starred) else a for a in value.args] + [k.value for k in value.keywords]
        items = [e for a in items for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
        return {a.id for a in items if isinstance(a, ast.Name)}

    def _unfreezes(self, receiver: str) -> list[str]:
        out = []
        for module, stmt, frozen in self.all():
            if not frozen:
                if under(module, "self") and not under(receiver, "self"):
                    module = receiver + module[len("self"):]
                out.append(self._iterated(module, stmt) or module)
        return out

    def _iterated(self, module: str, at: ast.AST) -> str | None:
        """``X`` for a loop variable over ``X.modules()`` / ``X.children()``: unfreezing some of them (the
        BatchNorm layers, on purpose) counts as unfreezing ``X``, so the rule stays silent."""
        if "." in module:
            return None
        for b in self.ctx.lookup(module, at):
            if b.kind != "for":
                continue
            if (method_call(b.iter, "modules", "children") and not b.unpacked) or (
                method_call(b.iter, "named_modules", "named_children") and b.index == 1
            ):
                return dotted(b.iter.func.value)  # type: ignore[union-attr]
        return None

    def unfrozen(self, path: str, receiver: str) -> bool:
        """Whether the part is unfrozen anywhere (gradual unfreezing: stay silent)."""
        return any(under(path, module) for module in self._unfreezes(receiver))

    def unfrozen_below(self, path: str, receiver: str) -> set[str]:
        """Children of the frozen part that are unfrozen again (``model.requires_grad_(False)`` then
        ``model.classifier.requires_grad_(True)``)."""
        return {m[len(path) + 1:].split(".")[0] for m in self._unfreezes(receiver) if m.startswith(path + ".")}

    def _local_class_of(self, receiver: str, at: ast.AST) -> ast.ClassDef | None:
        if "." in receiver:
            return None
        value = self.ctx.value_of(ast.Name(id=receiver, ctx=ast.Load()), at)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return self.ctx.class_named(value.func.id, at)
        return None


def _functions(ctx: Context):  # type: ignore[no-untyped-def]
    from trainwise.doctor.context.functions import functions

    return functions(ctx)


def under(path: str, prefix: str) -> bool:
    """Whether the dotted ``path`` is ``prefix`` or inside it."""
    return path == prefix or path.startswith(prefix + ".")


def unchain(value: ast.AST) -> ast.AST:
    """``model.train()`` / ``model.eval()`` -> ``model`` (they return the module itself)."""
    while method_call(value, "train", "eval") and not value.args:  # type: ignore[attr-defined]
        value = value.func.value  # type: ignore[attr-defined]
    return value


def _truthy(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call) -> bool | None:
    """Whether the value a same-file call gives the parameter ``name`` is true; None when unknown."""
    from trainwise.doctor.context.functions import value_at_call

    value = value_at_call(ctx, fn, name, ctx, call)
    return None if value is ... else bool(value)


def _mentions(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _as_list(body: object) -> list[ast.AST]:
    return body if isinstance(body, list) else [body]  # type: ignore[list-item, return-value]


def _head_name(text: object) -> bool:
    """``"fc"``, ``"fc."``, ``"classifier.1.weight"``: the name of a classification head's parameters."""
    if not isinstance(text, str):
        return False
    parts = [p for p in text.split(".") if p]
    return bool(parts) and bool(HEAD_WORD.fullmatch(parts[0])) and all(
        p.isdigit() or p in ("weight", "bias") or HEAD_WORD.fullmatch(p) for p in parts[1:]
    )


def _head_strings(node: ast.AST) -> bool:
    """A head name, or a tuple/list of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_head_strings(e) for e in node.elts)
    return isinstance(node, ast.Constant) and _head_name(node.value)


def _head_test(test: ast.AST, var: str, *, excluding: bool) -> bool:
    """Whether ``test`` on the parameter name ``var`` is true exactly for head parameters (``excluding``
    false: ``"fc" in name``, ``name.startswith("classifier")``) or exactly for the others (``excluding``:
    ``"fc" not in name``, ``not name.startswith("head")``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _head_test(test.operand, var, excluding=not excluding)
    if isinstance(test, ast.BoolOp):
        combined = ast.And if excluding else ast.Or
        return isinstance(test.op, combined) and all(_head_test(v, var, excluding=excluding) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        positive, negative = ((ast.In, ast.Eq), (ast.NotIn, ast.NotEq))
        if isinstance(left, ast.Name) and left.id == var:
            other = right
            if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                return False  # name in some_string: not a membership of names
        elif isinstance(right, ast.Name) and right.id == var:
            other = left
        else:
            return False
        wanted = negative if excluding else positive
        return isinstance(op, wanted) and _head_strings(other)
    if isinstance(test, ast.Call) and not excluding and isinstance(test.func, ast.Attribute):
        func = test.func
        if func.attr == "startswith" and isinstance(func.value, ast.Name) and func.value.id == var:
            return len(test.args) == 1 and _head_strings(test.args[0])
    return False
