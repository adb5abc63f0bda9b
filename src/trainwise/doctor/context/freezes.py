"""What a file freezes: which modules get ``requires_grad`` off (``requires_grad_(False)``, a loop over
``parameters()`` setting ``p.requires_grad = False``, all but the head through ``named_parameters()``, a helper
``def freeze(m)`` called on a model), what is unfrozen again, which frozen parts a model holds at a given line,
and where a model a function is given comes from (its call sites, a trainer class's ``self.model``).

One ``Freezes`` per file (``ctx.analysis(Freezes)``), the one freeze analysis: TW107 asks which parts of a
module stay frozen when an optimizer gets its parameters (``kept_frozen``), TW108 which frozen parts a model in
train mode holds (``frozen_parts``), TW110 whether a part is frozen where code sets its ``requires_grad``
(``holds_frozen``) and what such an assignment lands on (``grad_target``). Every answer leans towards "nothing
frozen" when the code does not show it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainwise.doctor.context.checkpoints import WRAPPERS
from trainwise.doctor.context.modules import HEAD_WORD
from trainwise.doctor.context.syntax import (
    Binding,
    argument,
    bound_value,
    dotted,
    init_of,
    is_bound_method,
    is_const,
    is_param,
    keyword,
    method_call,
    position,
    walk_own,
)
from trainwise.doctor.context.values import built_by

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_GUARDS = (ast.If, ast.For, ast.AsyncFor, ast.While)
# Calls that return a model holding the same submodules as their first argument.
_SAME_MODULES = frozenset({*WRAPPERS, "torch.nn.SyncBatchNorm.convert_sync_batchnorm"})
# Methods a freeze is never made by (torch's own and the commonest others): not followed into a class.
_NOT_FREEZING = frozenset({"train", "eval", "to", "cuda", "cpu", "float", "half", "double", "step", "zero_grad",
                           "backward", "append", "extend", "update", "load_state_dict", "state_dict", "apply",
                           "requires_grad_", "register_buffer", "add_module", "forward", "print", "write", "close"})
_MAX_SITES = 32  # call sites followed from a function to its callers, at most
_PARAMETERS = frozenset({"weight", "bias"})  # attributes of a module that are parameters
_MODULE_ONLY = ("parameters", "named_parameters", "modules", "children", "named_modules", "named_children")
_PARAMETER_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
_TENSOR_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "tensor", "arange",
                               "linspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
                               "rand_like", "randn_like", "as_tensor", "from_numpy"})

WHOLE, MOST, SOME = "whole", "most", "some"


@dataclass(frozen=True)
class Freeze:
    """A statement that sets ``requires_grad`` on parameters of ``module`` (a dotted path): ``path`` is what it
    names (``model.fc.weight`` for one parameter, else ``module``), ``frozen`` is False for an unfreeze, and
    ``extent`` how many of the module's parameters it reaches: ``WHOLE`` every one, unconditionally; ``MOST``
    every one but perhaps the head (a loop under a test that keeps only the head out, or a test not on the
    parameter's name); ``SOME`` a part (one parameter, ``parameters(recurse=False)``, a loop under another test).
    For a same-file helper's freeze, ``stmt`` is the call that hands it the module."""

    module: str
    path: str
    stmt: ast.AST
    frozen: bool
    extent: str


class Freezes:
    """The freezes of one file and the questions on them (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._freezes: list[Freeze] | None = None
        self._own: list[Freeze] | None = None  # the file's own statements only
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
            given = bound_value(found[0]) if found[0].kind == "assign" else None
            value = self.ctx.strip_moves(given) if given is not None else None
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
        """``(path, statement, frozen?)`` of every freeze that freezes a whole module (perhaps but its head) and
        of every unfreeze, the questions of TW108 (``frozen_parts``) work on."""
        return [(r.path, r.stmt, r.frozen) for r in self.records() if not r.frozen or r.extent != SOME]

    def records(self) -> list[Freeze]:
        """Every statement of the file that sets ``requires_grad`` on parameters (see ``Freeze``), and the
        calls of a same-file helper that does it to the module it is given."""
        if self._freezes is None:
            raw = self.own_records()
            self._freezes = list(raw)
            for record in raw:
                self._freezes.extend(self._through_helper(record))
            self._freezes.extend(self._through_methods())
        return self._freezes

    def own_records(self) -> list[Freeze]:
        """The records of the file's own statements (no helper, no method of a class followed)."""
        if self._own is None:
            raw: list[Freeze] = []
            for node in self.ctx.nodes(ast.Assign):
                value = node.value  # type: ignore[attr-defined]
                if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                    for target in node.targets:  # type: ignore[attr-defined]
                        if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                            raw.extend(self._record(target.value, node, not value.value, method=False))
            for node in self.ctx.nodes(ast.Call):
                if method_call(node, "requires_grad_"):
                    flag = node.args[0] if node.args else getattr(keyword(node, "requires_grad"), "value", None)  # type: ignore[attr-defined]
                    if flag is None or isinstance(flag, ast.Constant):
                        raw.extend(self._record(node.func.value, node, is_const(flag, False), method=True))  # type: ignore[attr-defined]
            self._own = raw
        return self._own

    def _through_methods(self) -> list[Freeze]:
        """``model.freeze_backbone()`` (a statement) where ``model`` is built from a class of the run
        (``values.built_by``: a factory, a registry, another file) whose method of that name freezes (or
        unfreezes) part of ``self`` unconditionally: that freeze, of ``model``'s part, at the call."""
        out: list[Freeze] = []
        for node in self.ctx.nodes(ast.Expr):
            call = node.value  # type: ignore[attr-defined]
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name) and call.func.attr not in _NOT_FREEZING):
                continue
            built = built_by(self.ctx, call.func.value, call)
            cls = built.cls if built is not None else None
            if built is None or cls is None:
                continue
            methods = [f for f in cls.body if isinstance(f, _FUNCS) and f.name == call.func.attr]
            if len(methods) != 1:
                continue
            for record in built.ctx.analysis(Freezes).own_records():
                if (under(record.module, "self") and record.module != "self"
                        and built.ctx.is_inside(record.stmt, methods[0])
                        and _functions(built.ctx).flag_conditions(record.stmt, methods[0]) == []):
                    name = call.func.value.id
                    out.append(Freeze(name + record.module[len("self"):], name + record.path[len("self"):], call,
                                      record.frozen, record.extent))
        return out

    def _record(self, target: ast.AST, stmt: ast.AST, frozen: bool, *, method: bool) -> list[Freeze]:
        """The freeze ``target.requires_grad = ...`` (``method``: ``target.requires_grad_(...)``) makes, if
        any: on a module's parameters, on one parameter; an assignment on a module sets nothing (TW110)."""
        loop = self._param_loop(target, stmt)
        if loop is not None:
            module = self._module_path(loop.iter.func.value)  # type: ignore[union-attr]
            return [Freeze(module, module, stmt, frozen, self._extent(loop, stmt))]  # type: ignore[arg-type]
        path = dotted(target)
        if path is None:
            return []
        owner, _dot, attr = path.rpartition(".")
        if attr in _PARAMETERS and owner:
            return [Freeze(owner, path, stmt, frozen, SOME)]
        return [Freeze(path, path, stmt, frozen, WHOLE)] if method else []

    def _extent(self, loop: Binding, stmt: ast.AST) -> str:
        """How much of the module a freeze in a loop over its parameters reaches (see ``Freeze``)."""
        if loop.iter.args or loop.iter.keywords or not self._freezes_all(loop, stmt):  # type: ignore[union-attr]
            return SOME
        inner = self.ctx.parent(stmt) if isinstance(stmt, ast.Call) else stmt
        direct = isinstance(inner, ast.stmt) and any(inner is s for s in loop.stmt.body)  # type: ignore[attr-defined]
        return WHOLE if direct else MOST

    def _module_path(self, expr: ast.expr) -> str | None:
        """The dotted name of the module ``expr`` is, through moves and unwrapping (``get_model(self.model)``)."""
        expr = self.ctx.strip_moves(expr)
        if isinstance(expr, ast.Attribute):
            base = self._module_path(expr.value)
            return f"{base}.{expr.attr}" if base is not None else None
        return dotted(expr)

    def _param_loop(self, expr: ast.AST, at: ast.AST) -> Binding | None:
        """The ``for p in module.parameters()`` (or ``named_parameters()``) loop that binds ``expr``."""
        if not isinstance(expr, ast.Name):
            return None
        for b in self.ctx.bindings_of(expr, at):
            if b.kind == "for" and self.ctx.is_inside(at, b.stmt) and method_call(b.iter, "parameters",
                                                                                    "named_parameters"):
                if b.iter.func.attr == "named_parameters" and b.index != 1:  # type: ignore[union-attr]
                    return None
                if self._module_path(b.iter.func.value) is None:  # type: ignore[union-attr]
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

    def _through_helper(self, record: Freeze) -> list[Freeze]:
        """A freeze of a parameter of a same-file helper (``def freeze(m): m.requires_grad_(False)``, the
        tutorial's ``set_parameter_requires_grad(model, feature_extracting)``), as a freeze of the argument at
        each call. A freeze under ``if flag:`` counts only where the call passes a true constant for ``flag``."""
        stmt, frozen = record.stmt, record.frozen
        fn = self.ctx.scope(stmt)
        root = record.path.partition(".")[0]
        if not isinstance(fn, _FUNCS) or root in ("self", "cls") or not is_param(fn, root):
            return []
        flags = _functions(self.ctx).flag_conditions(stmt, fn)
        if flags is None and frozen:
            return []
        out: list[Freeze] = []
        for call in self.ctx.calls_of(fn)[:_MAX_SITES]:
            arg = self._argument(fn, root, call)
            target = dotted(arg) if arg is not None else None
            if target is None:
                continue
            if frozen and not all(_truthy(self.ctx, fn, name, call) is wanted for name, wanted in flags or ()):
                continue
            module, path = (target + name[len(root):] for name in (record.module, record.path))
            out.append(Freeze(module, path, call, frozen, record.extent))
        return out

    # ------------------------------------------------------------------ TW107: what an optimizer is handed
    def kept_frozen(self, module: str, at: ast.AST) -> list[Freeze]:
        """Freezes of ``module`` or of a part of it that hold where ``at`` runs (an optimizer built over
        ``module.parameters()``): made before it in its scope, or in ``__init__`` of the class whose method
        builds it. Empty when a part of the module is unfrozen after ``at`` or in another scope (gradual
        unfreezing keeps it in the optimizer on purpose), or unfrozen again after its freeze."""
        frozen = [r for r in self.records() if r.frozen and under(r.module, module) and self._before(r.stmt, at)]
        root = module.split(".", 1)[0]
        for r in self.records():
            if frozen and not r.frozen and r.module.split(".", 1)[0] == root and (
                self.ctx.scope(r.stmt) is not self.ctx.scope(at) or position(r.stmt) > position(at)
                or any(under(f.module, r.module) and position(r.stmt) > position(f.stmt) for f in frozen)
            ):
                return []
        return sorted(frozen, key=lambda r: position(r.stmt))

    def _before(self, stmt: ast.AST, at: ast.AST) -> bool:
        """Whether ``stmt`` runs before ``at``: earlier in the same scope, or in ``__init__`` of its class."""
        own, other = self.ctx.scope(stmt), self.ctx.scope(at)
        if own is other:
            return position(stmt) < position(at)
        cls = self.ctx.enclosing_class(stmt)
        return (isinstance(own, ast.FunctionDef) and own.name == "__init__" and cls is not None
                and cls is self.ctx.enclosing_class(at))

    # ------------------------------------------------------------- TW110: where setting requires_grad lands
    def holds_frozen(self, part: ast.AST, at: ast.AST, *, itself: bool = False) -> Freeze | None:
        """The freeze that leaves every parameter of ``part`` (``model.classifier[3]``) frozen at ``at``: the
        last freeze or unfreeze before ``at`` in its scope, of a module holding ``part`` (``itself``: or of
        ``part``; an unfreeze of anything inside ``part`` counts too), freezes that module whole, and neither
        ``part`` nor a module between was assigned anew since (a new layer trains). None when not shown."""
        chain = [ast.unparse(e) for e in _holders(part)]
        if len(chain) < 2 and not itself:
            return None
        wanted = set(chain if itself else chain[1:])
        scope, end = self.ctx.scope(at), position(at)
        touching = [r for r in self.records() if self.ctx.scope(r.stmt) is scope and position(r.stmt) < end and (
            r.module in wanted or (not r.frozen and (r.module in chain or under(r.module, chain[0]))))]
        last = max(touching, key=lambda r: position(r.stmt), default=None)
        if last is None or not last.frozen or last.extent != WHOLE:
            return None
        renewed = {text for text in chain if under(text, last.module)}
        start = position(last.stmt)
        for node in self.ctx.nodes(ast.Assign):
            if (self.ctx.scope(node) is scope and start < position(node) < end
                    and any(ast.unparse(t) in renewed for t in node.targets)):  # type: ignore[attr-defined]
                return None
        return last

    def grad_target(self, expr: ast.AST, at: ast.AST) -> tuple[str, ast.AST | None] | None:
        """What ``expr.requires_grad = ...`` at ``at`` lands on: ``("parameter", its module)`` (a loop variable
        over ``m.parameters()``, ``m.fc.weight``), ``("module", expr)``, ``("tensor", None)`` (one a torch factory
        made, which does not require grad), or None when unknown (a config, an argument, a parameter or a
        tensor that may be either)."""
        loop = self._param_loop(expr, at)
        if loop is not None:
            return ("parameter", loop.iter.func.value)  # type: ignore[union-attr]
        if isinstance(expr, ast.Attribute) and expr.attr in _PARAMETERS and self.ctx.is_module(expr.value):
            return ("parameter", expr.value)
        if self._may_be_tensor(expr, at):
            return None
        if self.ctx.is_module(expr):
            return ("module", expr)
        found = self.ctx.bindings_of(expr, at) if isinstance(expr, (ast.Name, ast.Attribute)) else []
        if found and all(b.kind == "assign" and not b.unpacked and self._fresh_tensor(b.value) for b in found):
            return ("tensor", None)
        return None

    def _may_be_tensor(self, expr: ast.AST, at: ast.AST) -> bool:
        """Whether ``expr`` may hold a parameter or tensor at ``at``, however module-like its name and use: a
        loop variable over a list that holds one (``[self.patch_embed, self.cls_token]``), or code in the
        ``except`` of a ``try`` that calls ``expr.parameters()``, which runs for values without that method."""
        name = dotted(expr)
        for parent in self.ctx.ancestors(at):
            if isinstance(parent, ast.ExceptHandler):
                attempt = self.ctx.parent(parent)
                if isinstance(attempt, ast.Try) and any(
                        method_call(n, *_MODULE_ONLY) and dotted(n.func.value) == name  # type: ignore[attr-defined]
                        for s in attempt.body for n in ast.walk(s)):
                    return True
        if not isinstance(expr, ast.Name):
            return False
        for b in self.ctx.bindings_of(expr, at):
            items = b.iter
            if b.kind == "for" and isinstance(items, ast.Name):
                found = self.ctx.reaching(items, b.stmt)
                items = found[0].value if len(found) == 1 and found[0].kind == "assign" else None
            if b.kind == "for" and isinstance(items, (ast.List, ast.Tuple)) and any(
                    self._tensor_value(e) for e in items.elts):
                return True
        return False

    def _tensor_value(self, expr: ast.AST) -> bool:
        """``m.weight``, or a name or attribute bound only to ``nn.Parameter(...)`` or a torch factory's tensor."""
        if isinstance(expr, ast.Attribute) and expr.attr in _PARAMETERS:
            return True
        found = self.ctx.bindings_of(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else []
        return bool(found) and all(
            b.kind == "assign" and not b.unpacked and isinstance(b.value, ast.Call) and (
                self.ctx.qualname(b.value.func) in _PARAMETER_CLASSES or self._fresh_tensor(b.value))
            for b in found)

    def _fresh_tensor(self, value: ast.AST | None) -> bool:
        """``torch.zeros(3)``, ``torch.randn(...)``: a new tensor that does not require grad."""
        if not isinstance(value, ast.Call) or keyword(value, "requires_grad") is not None:
            return False
        name = self.ctx.qualname(value.func) or ""
        return name.startswith("torch.") and name.rsplit(".", 1)[-1] in _TENSOR_FACTORIES

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
            elif (isinstance(stmt_scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and own_cls is not None
                  and self.ctx.enclosing_class(stmt) is own_cls and under(module, receiver)
                  and self._unconditional(stmt, stmt_scope)
                  and self._runs_before(own_cls, stmt_scope, scope, self._unfreezers(own_cls, module))):
                # a trainer's self.freeze(), then self.train_epoch() that calls self.model.train(): the order of
                # the methods' calls says whether an unfreeze came between
                if module not in parts:
                    parts.append(module)
                    self.frozen_at.setdefault(module, stmt)
                continue
            if path is not None and not self._unfrozen_before(path, receiver, call) and path not in parts:
                parts.append(path)
                self.frozen_at.setdefault(path, stmt)
        return parts

    def _unconditional(self, stmt: ast.AST, fn: ast.AST) -> bool:
        """Whether ``stmt`` runs whenever ``fn`` does, but for tests of the model's structure (``if
        hasattr(model, "head"):``, which a model that is frozen but for its head passes)."""
        if _functions(self.ctx).flag_conditions(stmt, fn) == []:  # type: ignore[arg-type]
            return True
        for parent in self.ctx.ancestors(stmt):
            if parent is fn:
                return True
            if isinstance(parent, (ast.If, ast.While)) and not (
                    isinstance(parent.test, ast.Call) and isinstance(parent.test.func, ast.Name)
                    and parent.test.func.id == "hasattr"):
                return False
        return False

    def _unfreezers(self, cls: ast.ClassDef, module: str) -> set[str]:
        """The methods of ``cls`` that unfreeze ``module`` (or a module holding it)."""
        return {fn.name for fn in cls.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                and any(not frozen and under(module, part) and self.ctx.is_inside(stmt, fn)
                        for part, stmt, frozen in self.all())}

    def _runs_before(self, cls: ast.ClassDef, freezer: ast.AST, trainer: ast.AST, unfreezers: set[str]) -> bool:
        """Whether a method of ``cls`` calls ``self.<freezer>()`` and then, later in the same method and with no
        call of an ``unfreezers`` method between, a method that is (or calls, through ``self.`` calls, three
        levels deep) ``trainer``: ``linear_probe`` calling ``self.freeze()`` and then ``self.fit(...)``, which
        runs ``self.model.train()`` every epoch."""
        if not isinstance(freezer, (ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(
                trainer, (ast.FunctionDef, ast.AsyncFunctionDef)) or freezer is trainer:
            return False
        methods = {fn.name: fn for fn in cls.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))}

        def self_calls(fn: ast.AST) -> list[ast.Call]:
            return [n for n in walk_own(fn.body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)  # type: ignore[attr-defined]
                    and dotted(n.func.value) == "self" and n.func.attr in methods]

        reaching = {trainer.name}
        for _ in range(3):  # the methods that reach the trainer through self.<method>() calls
            reaching |= {name for name, fn in methods.items()
                         if any(c.func.attr in reaching for c in self_calls(fn))}  # type: ignore[attr-defined]
        for fn in methods.values():
            frozen = False
            for c in sorted(self_calls(fn), key=position):
                name = c.func.attr  # type: ignore[attr-defined]
                if name == freezer.name:
                    frozen = True
                elif name in unfreezers:
                    frozen = False
                elif frozen and name in reaching:
                    return True
        return False

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
            if isinstance(value, ast.Call) and (self.ctx.qualname(value.func) or "") in _SAME_MODULES and value.args:
                value = value.args[0]  # a wrapper or a conversion that keeps the model's submodules
            if isinstance(value, ast.Name):
                if value.id == receiver:
                    continue  # model_train = model_train.cuda(), model_train = DDP(model_train)
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
        return [self._unfrozen_module(module, stmt, receiver) for module, stmt, frozen in self.all() if not frozen]

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

    def _unfrozen_before(self, path: str, receiver: str, call: ast.AST) -> bool:
        """Whether the part is unfrozen before ``call`` on every pass, or somewhere this file cannot order
        (another function, for a model that is not a local of the call's function): an unfreeze in the same
        function that a condition or a loop the call is not in guards (``if epoch >= freeze_epochs:`` inside
        the epoch loop) leaves the earlier passes frozen."""
        scope = self.ctx.scope(call)
        for module, stmt, frozen in self.all():
            if frozen or not under(path, self._unfrozen_module(module, stmt, receiver)):
                continue
            if self.ctx.scope(stmt) is not scope:
                if not self._local(path.split(".", 1)[0], call):
                    return True  # the same object unfrozen where this file cannot order it
                continue  # a local of the call's function: another function's variable of that name
            if position(stmt) < position(call) and all(
                    self.ctx.is_inside(call, guard) for guard in self.ctx.ancestors(stmt)
                    if isinstance(guard, _GUARDS) and self.ctx.scope(guard) is scope):
                return True
        return False

    def _local(self, name: str, at: ast.AST) -> bool:
        """Whether ``name`` at ``at`` is a variable of the function holding ``at`` (not a global, not ``self``)."""
        scope = self.ctx.scope(at)
        return name != "self" and isinstance(scope, _FUNCS) and any(
            self.ctx.scope(b.stmt) is scope or b.stmt is scope for b in self.ctx.lookup(name, at))

    def _unfrozen_module(self, module: str, stmt: ast.AST, receiver: str) -> str:
        """The module an unfreeze reaches, seen from ``receiver`` (``self.x`` of a class as ``receiver.x``)."""
        if under(module, "self") and not under(receiver, "self"):
            module = receiver + module[len("self"):]
        return self._iterated(module, stmt) or module

    def unfrozen(self, path: str, receiver: str) -> bool:
        """Whether the part is unfrozen anywhere (gradual unfreezing: stay silent)."""
        return any(under(path, module) for module in self._unfreezes(receiver))

    def unfrozen_below(self, path: str, receiver: str) -> set[str]:
        """Children of the frozen part that are unfrozen again (``model.requires_grad_(False)`` then
        ``model.classifier.requires_grad_(True)``)."""
        return {m[len(path) + 1:].split(".")[0] for m in self._unfreezes(receiver) if m.startswith(path + ".")}

    def put_in_eval(self, part: str, at: ast.AST) -> ast.Call | None:
        """The ``part.eval()`` (or ``part.train(False)``, ``part.requires_grad_(False).eval()``) that runs before
        ``at`` in its function or, for a variable of the script, at its top: the script's own word that the
        frozen part belongs in eval mode."""
        scope = self.ctx.scope(at)
        root = part.split(".", 1)[0]
        for call in self.ctx.nodes(ast.Call):
            if not (method_call(call, "eval") and not call.args) and not (
                    method_call(call, "train") and len(call.args) == 1 and is_const(call.args[0], False)):  # type: ignore[attr-defined]
                continue
            target = call.func.value  # type: ignore[attr-defined]
            if method_call(target, "requires_grad_"):
                target = target.func.value  # type: ignore[attr-defined]
            there = self.ctx.scope(call)
            if dotted(target) == part and position(call) < position(at) and (
                    there is scope or (isinstance(there, ast.Module) and self._global(root, at))):
                return call  # type: ignore[return-value]
        return None

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


def _holders(part: ast.AST) -> list[ast.AST]:
    """``model.classifier[3]`` -> itself, ``model.classifier``, ``model``: the part and what holds it."""
    out = [part]
    while isinstance(part, (ast.Attribute, ast.Subscript)):
        part = part.value
        out.append(part)
    return out


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
