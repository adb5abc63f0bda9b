"""What a file saves and loads: state dicts taken from models (wrapped in ``DataParallel``/DDP/``torch.compile``
or bare), the keys of the checkpoint dict they sit in, the paths, and the models they are loaded into (TW302).

One ``Checkpoints`` per file, made on first use (``ctx.analysis(Checkpoints)``); like the rest of the context it
answers "unknown" (``None``, an empty list) when unsure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainwise.doctor.context.checkpoint_paths import Frame, frames_of, path_pattern
from trainwise.doctor.context.functions import callees, constant_of
from trainwise.doctor.context.syntax import (
    DEFINITIONS,
    Binding,
    argument,
    dotted,
    is_param,
    keyword,
    last_name,
    position,
    walk_own,
)

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

# Wrappers whose state_dict() keys carry a prefix the bare model's keys do not have.
WRAPPERS = {
    "torch.nn.DataParallel": "module.",
    "torch.nn.parallel.DataParallel": "module.",
    "torch.nn.parallel.data_parallel.DataParallel": "module.",
    "torch.nn.parallel.DistributedDataParallel": "module.",
    "torch.nn.parallel.distributed.DistributedDataParallel": "module.",
    "torch.compile": "_orig_mod.",
}
WRAPPER_NAMES = {"module.": "nn.DataParallel/DistributedDataParallel", "_orig_mod.": "torch.compile"}
# Models built bare: a class of the file, a torchvision/timm/transformers constructor, an nn container.
_MODEL_LIBRARIES = ("torchvision.models.", "timm.", "transformers.")
_PREFIX_TOOLS = frozenset({"consume_prefix_in_state_dict_if_present", "removeprefix", "strip_prefix",
                           "remove_prefix", "unwrap_model"})
_MOVES = ("to", "cuda", "cpu", "float", "half", "double", "eval", "train", "requires_grad_")
_READS = frozenset({"keys", "items", "values", "get"})  # dict methods that leave the keys as they are
# Calls that tell the user about a key: print, warnings.warn, logger.warning/info/error.
_REPORTS = frozenset({"print", "warn", "warning", "info", "error", "debug", "log", "write"})
_COPIES = frozenset({"dict", "OrderedDict", "copy", "deepcopy"})  # f(d): a dict with the keys of d
_SAME_KEYS = frozenset({"get", "copy", "items", "keys", "pop"})  # d.get(...), d.copy(): d's keys (or d's value)
_VIEWS = frozenset({"set", "frozenset", "list", "sorted", "tuple"})  # set(d), sorted(d.keys()): d's keys
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SET_TESTS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)  # a.keys() == b.keys(), a.keys() <= b.keys()
Keys = tuple[str, ...]


@dataclass(frozen=True)
class WrappedSave:
    """A wrapped model's state dict saved: ``path`` (an expression of the file, read at ``path_at``), the keys
    of the checkpoint dict it sits in, how the saved model is named in a message, its key prefix, and the
    save (or the call of the function that saves it)."""

    path: ast.expr
    keys: Keys
    saved: str
    prefix: str
    save: ast.Call
    path_at: ast.AST


@dataclass(frozen=True)
class HelperSave:
    """A wrapped model's state dict that a function of the file or of the run saves for a call of this file
    (``writer.write({"net": dp.state_dict()})``, ``save_checkpoint(dp_model, path)``): the call, the
    ``torch.save`` (in ``callee``) and its function's name, the keys leading to the state dict, how the saved
    model is named, its key prefix, and the pattern of the file it goes to (``path_pattern``)."""

    call: ast.Call
    callee: Context
    save: ast.Call
    function: str
    keys: Keys
    saved: str
    prefix: str
    pattern: str


class Checkpoints:
    """The state dicts a file saves and loads (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._saves: list[WrappedSave] | None = None
        self._helper_saves: list[HelperSave] | None = None
        self._strips: bool | None = None
        self._wraps: bool | None = None

    def strips_prefixes(self) -> bool:
        """Whether the file handles wrapper prefixes somewhere (``k.replace("module.", "")``,
        ``removeprefix``, ``consume_prefix_in_state_dict_if_present``)."""
        if self._strips is None:
            self._strips = any(
                isinstance(c.value, str) and ("module." in c.value or "_orig_mod" in c.value)  # type: ignore[attr-defined]
                for c in self.ctx.nodes(ast.Constant)
            ) or any(getattr(n, "attr", getattr(n, "id", None)) in _PREFIX_TOOLS
                     for tp in (ast.Name, ast.Attribute) for n in self.ctx.nodes(tp))
        return self._strips

    def wrapped_saves(self) -> list[WrappedSave]:
        """Each save of a wrapped model's state dict: directly, or in a function of the file that every call
        passes a wrapped model (``def save_checkpoint(model, path)``, ``def train(model, ...)``)."""
        if self._saves is None:
            self._saves = cached = []
            for call in self.ctx.nodes(ast.Call):
                if self.ctx.qualname(call.func) != "torch.save" or len(call.args) < 2:  # type: ignore[attr-defined]
                    continue
                path = call.args[1]  # type: ignore[attr-defined]
                for keys, model in self.state_dicts(call.args[0], call, (), 0):  # type: ignore[attr-defined]
                    prefix = self.wrapper_prefix(model, call)
                    if prefix is not None:
                        cached.append(WrappedSave(path, keys, f"`{dotted(model)}`", prefix, call, call))  # type: ignore[arg-type]
                    elif isinstance(model, ast.Name):
                        cached.extend(WrappedSave(p, keys, name, pre, site, at)  # type: ignore[arg-type]
                                      for p, name, pre, site, at in self._through_callers(model.id, path, call))
        return self._saves

    def _through_callers(self, param: str, path: ast.expr,
                         save: ast.AST) -> list[tuple[ast.expr, str, str, ast.Call, ast.AST]]:
        """(path, model, prefix, call site, where the path is read) when ``param`` is a parameter of the
        function around ``save`` and every call of it passes a model wrapped in the same way; a path that is a
        parameter too is read at each call."""
        fn = self.ctx.scope(save)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or isinstance(self.ctx.parent(fn), ast.ClassDef):
            return []
        if len(self.ctx.functions_named(fn.name)) != 1 or not is_param(fn, param):
            return []
        calls = [c for c in self.ctx.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == fn.name]  # type: ignore[attr-defined]
        out = []
        per_call = isinstance(path, ast.Name) and is_param(fn, path.id)  # each call saves to its own file
        for call in calls[:32]:
            arg = argument(fn, param, call)  # type: ignore[arg-type]
            prefix = None
            if isinstance(arg, ast.Call):
                prefix = self.wrapper_call(arg)
            elif arg is not None:
                prefix = self.wrapper_prefix(arg, call)
            if per_call and prefix is None:
                continue
            if prefix is None or (out and out[0][2] != prefix):
                return []
            name = f"`{dotted(arg)}`" if dotted(arg) is not None else "model"  # type: ignore[arg-type]
            name += f" passed to `{fn.name}()`"
            if per_call:
                at_call = argument(fn, path.id, call)  # type: ignore[arg-type, union-attr]
                if at_call is None:
                    continue
                out.append((at_call, name, prefix, call, call))  # type: ignore[arg-type]
            else:
                out.append((path, name, prefix, call, save))  # type: ignore[arg-type]
        return out

    # ---------------------------------------------------------------------- saves and loads through helpers
    def wraps_models(self) -> bool:
        """Whether the file builds a DataParallel/DDP/compiled wrapper anywhere (a cheap first test)."""
        if self._wraps is None:
            self._wraps = any(self.ctx.qualname(c.func) in WRAPPERS for c in self.ctx.nodes(ast.Call))  # type: ignore[attr-defined]
        return self._wraps

    def helper_saves(self) -> list[HelperSave]:
        """Each wrapped model's state dict that a function this file calls saves: a method of an instance of a
        class of the run (``writer.write_checkpoint({"model": dp.state_dict()}, step)`` whose method puts the
        dict it is given in the saved one) or a function of the file or of the run (``save_checkpoint(dp_model,
        ...)`` saving ``model.state_dict()``), with the file it saves to as a pattern read for this call."""
        if self._helper_saves is None:
            self._helper_saves = found = []
            if not self.wraps_models():
                return found
            for call in self.ctx.nodes(ast.Call):
                if self.ctx.qualname(call.func) == "torch.save" or not self._passes_models(call):  # type: ignore[attr-defined]
                    continue
                for frame in frames_of(self.ctx, call):  # type: ignore[arg-type]
                    found.extend(self._saves_for(call, frame))  # type: ignore[arg-type]
        return self._helper_saves

    def _passes_models(self, call: ast.Call) -> bool:
        """An argument holds a ``state_dict()`` call or is a wrapped model."""
        for arg in (*call.args, *(k.value for k in call.keywords)):
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
                   for n in ast.walk(arg)):
                return True
            if isinstance(arg, (ast.Name, ast.Attribute)) and self.wrapper_prefix(arg, call) is not None:
                return True
        return False

    def _saves_for(self, call: ast.Call, frame: Frame) -> list[HelperSave]:
        there = frame.ctx.analysis(Checkpoints)
        out = []
        for save in walk_own(frame.fn.body):
            if not isinstance(save, ast.Call) or frame.ctx.qualname(save.func) != "torch.save" or len(save.args) < 2:
                continue
            pattern = path_pattern(frame.ctx, save.args[1], save, frame)
            for keys, param, is_model in there.param_leaves(save.args[0], save, frame.fn, (), 0):
                passed = argument(frame.fn, param, call, method=frame.method)
                if passed is None or there._tested(param, save, frame.fn):
                    continue
                if is_model:
                    prefix = (self.wrapper_call(passed) if isinstance(passed, ast.Call)
                              else self.wrapper_prefix(passed, call))
                    models = [(keys, passed, prefix)]
                else:
                    models = [(keys + inner, model, self.wrapper_prefix(model, call))
                              for inner, model in self.state_dicts(passed, call, (), 0)]
                for full_keys, model, prefix in models:
                    if prefix is not None:
                        name = f"`{dotted(model)}`" if dotted(model) is not None else "model"
                        out.append(HelperSave(call, frame.ctx, save, frame.fn.name, full_keys,
                                              f"{name} passed to `{frame.fn.name}()`", prefix, pattern))
        return out

    def _tested(self, name: str, node: ast.AST, fn: ast.AST) -> bool:
        """Whether ``node`` runs under an ``if`` of ``fn`` whose test reads ``name`` (``if isinstance(model,
        nn.DataParallel): torch.save(model.module.state_dict(), out) else: ...``): the function saves according to
        what it is given, which this analysis does not follow."""
        for parent in self.ctx.ancestors(node):
            if parent is fn:
                return False
            if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and any(
                    isinstance(n, ast.Name) and n.id == name for n in ast.walk(parent.test)):
                return True
        return False

    def param_leaves(self, obj: ast.AST, at: ast.AST, fn: ast.AST, keys: Keys,
                     depth: int) -> list[tuple[Keys, str, bool]]:
        """What of a saved object comes from the parameters of ``fn``, with the keys leading to it: ``(keys,
        parameter, True)`` for ``model.state_dict()`` of a parameter, ``(keys, parameter, False)`` for a
        parameter saved as it is given (a state dict, or a dict holding some), in ``{"model_state": model_state,
        ...}``, ``dict(...)`` or a name bound to one of these."""
        if depth > 3:
            return []
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Attribute) and obj.func.attr == "state_dict":
            model = obj.func.value
            ok = not obj.args and not obj.keywords and isinstance(model, ast.Name) and is_param(fn, model.id)
            return [(keys, model.id, True)] if ok else []  # type: ignore[attr-defined]
        if isinstance(obj, ast.Dict):
            out = []
            for key, value in zip(obj.keys, obj.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out.extend(self.param_leaves(value, at, fn, (*keys, key.value), depth + 1))
            return out
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "dict" and not obj.args:
            return [r for kw in obj.keywords if kw.arg
                    for r in self.param_leaves(kw.value, at, fn, (*keys, kw.arg), depth + 1)]
        if isinstance(obj, ast.Name):
            if is_param(fn, obj.id) and not any(b.kind != "param" for b in self.ctx.lookup(obj.id, at)):
                return [(keys, obj.id, False)]
            binding = self.only_binding(obj, at)
            if binding is not None and self.untouched(obj.id, binding, at):
                return self.param_leaves(binding.value, binding.stmt, fn, keys, depth + 1)  # type: ignore[arg-type]
        return []

    def load_pattern(self, state: ast.AST, at: ast.AST) -> tuple[str, Keys] | None:
        """(pattern of the file, keys) a loaded state dict comes from: ``torch.load(path)[key]...`` here, or
        what a function of the file or of the run returns from ``torch.load`` (``ckpt = load_latest(folder,
        "ckpt")[0]``, the function returning ``state["model"], state["epoch"]``), its path read for this call."""
        return _load_chain(self.ctx, state, at, None, (), 0)

    def state_dicts(self, obj: ast.AST, at: ast.AST, keys: Keys, depth: int) -> list[tuple[Keys, ast.AST]]:
        """The ``model.state_dict()`` calls a saved object holds, with the keys leading to each:
        ``model.state_dict()``, ``{"model": model.state_dict(), ...}``, ``dict(model=...)``, or a name bound
        to one of these."""
        if depth > 3:
            return []
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Attribute) and obj.func.attr == "state_dict":
            return [(keys, obj.func.value)] if not obj.args and not obj.keywords else []
        if isinstance(obj, ast.Dict):
            out = []
            for key, value in zip(obj.keys, obj.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out.extend(self.state_dicts(value, at, (*keys, key.value), depth + 1))
            return out
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "dict" and not obj.args:
            return [r for kw in obj.keywords if kw.arg for r in self.state_dicts(kw.value, at, (*keys, kw.arg),
                                                                                depth + 1)]
        if isinstance(obj, ast.Name):
            binding = self.only_binding(obj, at)
            if binding is not None and self.untouched(obj.id, binding, at):
                return self.state_dicts(binding.value, binding.stmt, keys, depth + 1)  # type: ignore[arg-type]
        return []

    def loaded_from(self, state: ast.AST, at: ast.AST, depth: int = 0) -> tuple[ast.expr, Keys] | None:
        """(path, keys) when the state dict is ``torch.load(path)[key]...`` (directly or through a name bound
        to it and not changed before the load)."""
        if depth > 3:
            return None
        keys: list[str] = []
        while isinstance(state, ast.Subscript):
            key = state.slice
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return None
            keys.insert(0, key.value)
            state = state.value
        if isinstance(state, ast.Call) and self.ctx.qualname(state.func) == "torch.load":
            path = state.args[0] if state.args else getattr(keyword(state, "f"), "value", None)
            return (path, tuple(keys)) if path is not None else None
        if isinstance(state, ast.Name):
            binding = self.only_binding(state, at)
            if binding is not None and self.untouched(state.id, binding, at):
                inner = self.loaded_from(binding.value, binding.stmt, depth + 1)  # type: ignore[arg-type]
                if inner is not None:
                    return inner[0], inner[1] + tuple(keys)
        return None

    def only_binding(self, name: ast.Name, at: ast.AST) -> Binding | None:
        """The one assignment that gives ``name`` its value at ``at``, else None."""
        found = self.ctx.reaching(name, at)
        if len(found) != 1 or found[0].kind != "assign" or found[0].unpacked or found[0].value is None:
            return None
        return found[0]

    def untouched(self, name: str, binding: Binding, at: ast.AST) -> bool:
        """Whether, between its binding and ``at``, the name is only read by subscripting (``ckpt["epoch"]``):
        passed to a call or changed in place, its keys may have been rewritten."""
        scope = self.ctx.scope(binding.stmt)
        start, end = position(binding.stmt), position(at)
        for node in self.ctx.nodes(ast.Name):
            if node.id != name or not (start < position(node) < end) or self.ctx.scope(node) is not scope:  # type: ignore[attr-defined]
                continue
            if self.ctx.is_inside(node, binding.stmt) or self.ctx.is_inside(node, at):
                continue
            parent = self.ctx.parent(node)
            if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.ctx, ast.Load):
                continue  # ckpt["epoch"]
            if (isinstance(parent, ast.Attribute) and parent.attr in _READS
                    and isinstance(self.ctx.parent(parent), ast.Call)):
                continue  # state.keys(), state.items()
            if isinstance(parent, ast.Compare) and node is not parent.left and all(
                    isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
                continue  # "model" in ckpt
            return False
        return True

    def wrapper_prefix(self, model: ast.AST, at: ast.AST, depth: int = 0) -> str | None:
        """The key prefix when ``model`` is, where its state dict is taken, a DataParallel/DDP/compiled
        wrapper: bound to ``nn.DataParallel(net)`` (or ``.to(device)`` of it), also through a move of the same
        object after the wrap (``if n_gpus > 1: net = nn.DataParallel(net)`` then ``net = net.to(device)``: the
        checkpoint carries the prefix on the runs that wrap)."""
        if not isinstance(model, (ast.Name, ast.Attribute)) or dotted(model) is None or depth > 3:
            return None
        found = self.ctx.reaching(model, at)
        if len(found) != 1 or found[0].kind != "assign" or found[0].unpacked or found[0].value is None:
            return None
        value = found[0].value
        prefix = self.wrapper_call(value)
        if prefix is None:
            moved = _unmove(value)
            if moved is not value and isinstance(moved, (ast.Name, ast.Attribute)) and dotted(moved) == dotted(model):
                return self.wrapper_prefix(moved, found[0].stmt, depth + 1)
        return prefix

    def wrapper_call(self, value: ast.AST) -> str | None:
        """The key prefix of a wrapper built by ``value`` (``nn.DataParallel(net).cuda()``), else None."""
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
            value = value.func.value
        if isinstance(value, ast.Call) and value.args:
            return WRAPPERS.get(self.ctx.qualname(value.func) or "")
        return None

    def bare(self, target: ast.AST, at: ast.AST) -> bool:
        """Whether the model loaded into is known to be unwrapped: ``wrapped.module``, or a name whose value
        there is a model built bare (a class of the file or of another file of the run, a torchvision/timm
        constructor); for an attribute (``self.model``), every value it is ever given is one."""
        if isinstance(target, ast.Attribute) and target.attr in ("module", "_orig_mod"):
            return self.wrapper_prefix(target.value, at) is not None
        if isinstance(target, ast.Call):
            return self.built_bare(target)  # Net().load_state_dict(...)
        if isinstance(target, ast.Name):
            found = self.ctx.reaching(target, at)
        elif isinstance(target, ast.Attribute) and dotted(target) is not None:
            found = self.ctx.bindings_of(target)
        else:
            return False
        return bool(found) and all(
            b.kind == "assign" and not b.unpacked and b.value is not None and self.built_bare(b.value)
            for b in found
        )

    def built_bare(self, value: ast.AST, depth: int = 0) -> bool:
        """Whether ``value`` builds a model that is no wrapper: a module class of this file or another file of
        the run, a torchvision/timm/transformers constructor, an ``nn`` layer or container, or a factory
        function of the run whose every ``return`` is one of these (``net = create_model(cfg)``)."""
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
            value = value.func.value
        if not isinstance(value, ast.Call) or self.wrapper_call(value) is not None:
            return False
        if isinstance(value.func, ast.Name) and value.func.id in self.ctx.module_classes:
            return True
        program = self.ctx.program
        if program is not None and program.module_class(self.ctx, value.func) is not None:
            return True
        if depth < 2 and self._factory_builds_bare(value, depth):
            return True
        q = self.ctx.qualname(value.func) or ""
        if q.startswith(_MODEL_LIBRARIES):
            return q.rsplit(".", 1)[-1] not in ("compile",)
        return q.startswith("torch.nn.") and q.rsplit(".", 1)[-1][:1].isupper() and q not in WRAPPERS

    def _factory_builds_bare(self, call: ast.Call, depth: int) -> bool:
        """``create_model(cfg)`` calling a function of this file or another file of the run whose every
        ``return`` gives a model built bare (directly, or a local name every assignment of which builds one)."""
        if self.ctx.qualname(call.func) is not None:  # imported: only a function of another file of the run
            other = self.ctx.program.callee(self.ctx, call) if self.ctx.program is not None else None
            found = [other] if other is not None else []
        else:
            found = callees(self.ctx, call)
        if len(found) != 1:
            return False
        there, fn = found[0]
        facts = there.analysis(Checkpoints)
        returns = [n for n in walk_own(fn.body) if isinstance(n, ast.Return)]
        if not returns:
            return False
        for ret in returns:
            value = ret.value
            if isinstance(value, ast.Name):
                bindings = [b for b in there.lookup(value.id, ret) if b.kind != "del"]
                if not bindings or not all(
                        b.kind == "assign" and not b.unpacked and b.value is not None
                        and there.scope(b.stmt) is fn and facts.built_bare(b.value, depth + 1) for b in bindings):
                    return False
            elif value is None or not facts.built_bare(value, depth + 1):
                return False
        return True

    def same_path(self, a: ast.expr, a_at: ast.AST, b: ast.expr, b_at: ast.AST) -> bool:
        """The same file: equal constants, or the same expression over the same variables."""
        ca, cb = self.ctx.constant(a), self.ctx.constant(b)
        if isinstance(ca, str) and isinstance(cb, str):
            return ca == cb
        if ast.dump(a) != ast.dump(b):
            return False
        for na, nb in zip(ast.walk(a), ast.walk(b)):
            if isinstance(na, ast.Name) and isinstance(nb, ast.Name):
                left = [id(x.stmt) for x in self.ctx.lookup(na.id, a_at)]
                right = [id(x.stmt) for x in self.ctx.lookup(nb.id, b_at)]
                if not left or left != right:
                    return False
        return True

    # ------------------------------------------------------------------ keys compared before a non-strict load
    def keys_checked(self, load: ast.Call) -> bool:
        """Whether the function around ``model.load_state_dict(state, strict=False)`` compares the keys itself
        before the load and looks at the outcome: the keys of ``state`` (or of a dict it is built from) or of
        ``model.state_dict()`` in a set difference, an ``in`` test of each key of one against the other, or
        ``==``/``<=`` of key sets, whose result is raised, reported, asserted, returned or tested with a raise
        or a report in the branch (``if missing: raise``). A comparison that only filters what is loaded
        (``{k: v for k, v in sd.items() if k in model_sd}``) looks at nothing and does not count."""
        state = load.args[0] if load.args else getattr(keyword(load, "state_dict"), "value", None)
        if state is None or not isinstance(load.func, ast.Attribute):
            return False
        scope = self.ctx.scope(load)
        names, built = self._built_from(state, load)
        target = dotted(load.func.value)
        for tp in (ast.Compare, ast.BinOp):
            for node in self.ctx.nodes(tp):
                if position(node) >= position(load) or self.ctx.scope(node) is not scope:
                    continue
                if (self._compares_keys(node, names, target) and self._looked_at(node, scope, 0)
                        and not any(self.ctx.is_inside(node, expr) for expr in built)):  # a filter of what is loaded
                    return True
        return False

    def _built_from(self, state: ast.expr, load: ast.AST) -> tuple[set[str], list[ast.expr]]:
        """The names whose dicts ``state`` takes its keys from (``sd = ckpt["model"]``, ``sd = {k: f(v) for k, v
        in sd.items()}``, ``dict(sd)``), and the expressions that build it from them, before ``load``."""
        names: set[str] = set()
        built: list[ast.expr] = []
        work = [state]
        while work and len(built) < 64:
            expr = work.pop()
            built.append(expr)
            if isinstance(expr, ast.Name):
                if expr.id in names:
                    continue
                names.add(expr.id)
                for b in self.ctx.lookup(expr.id, load):
                    if b.kind in ("assign", "walrus") and b.value is not None and position(b.stmt) < position(load):
                        work.append(b.value)
            elif isinstance(expr, ast.Subscript):
                work.append(expr.value)  # ckpt["model"]
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_KEYS:
                work.append(expr.func.value)
                work.extend(expr.args[1:2])  # ckpt.get("model", ckpt)
            elif isinstance(expr, ast.Call) and last_name(expr.func) in _COPIES and len(expr.args) == 1:
                work.append(expr.args[0])
            elif isinstance(expr, ast.DictComp):
                work.extend(gen.iter for gen in expr.generators)
            elif isinstance(expr, ast.Dict):
                work.extend(v for k, v in zip(expr.keys, expr.values) if k is None)  # {**a, **b}
            elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
                work.extend((expr.left, expr.right))
            elif isinstance(expr, ast.IfExp):
                work.extend((expr.body, expr.orelse))
        return names, built

    def _compares_keys(self, node: ast.AST, names: set[str], target: str | None) -> bool:
        """``set(a) - set(b)`` (``^``), ``k in b`` for each ``k`` of ``a``, ``a.keys() == b.keys()``: two key
        collections compared, one of them the loaded dict's (``names``) or the target's ``state_dict()``."""
        if isinstance(node, ast.BinOp):
            if not isinstance(node.op, (ast.Sub, ast.BitXor)):
                return False
            sides = [self._key_set(side, node, shaped=True) for side in (node.left, node.right)]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            if isinstance(node.ops[0], (ast.In, ast.NotIn)):
                element = self._iterated(node.left, node) if isinstance(node.left, ast.Name) else None
                sides = [element, self._key_set(node.comparators[0], node, shaped=False)]
            elif isinstance(node.ops[0], _SET_TESTS):
                sides = [self._key_set(side, node, shaped=True) for side in (node.left, node.comparators[0])]
            else:
                return False
        else:
            return False
        return None not in sides and any(self._related(side, names, target) for side in sides)

    def _key_set(self, expr: ast.AST, at: ast.AST, *, shaped: bool, depth: int = 0) -> ast.AST | None:
        """The dict whose keys ``expr`` is: ``d.keys()``, ``set(d)``, ``sorted(d.keys())``, a name bound to one
        of these; with ``shaped=False`` (the right side of ``in``) also ``d`` itself. None for anything else."""
        viewed = False
        while isinstance(expr, ast.Call) and len(expr.args) <= 1 and not expr.keywords:
            if isinstance(expr.func, ast.Attribute) and expr.func.attr == "keys" and not expr.args:
                expr = expr.func.value
            elif isinstance(expr.func, ast.Name) and expr.func.id in _VIEWS and expr.args:
                expr = expr.args[0]
            else:
                break
            viewed = True
        if viewed or not shaped:
            return expr if not isinstance(expr, (ast.Constant, ast.List, ast.Tuple, ast.Set)) else None
        if isinstance(expr, ast.Name) and depth < 3:
            binding = self.only_binding(expr, at)
            if binding is not None:
                return self._key_set(binding.value, binding.stmt, shaped=True, depth=depth + 1)  # type: ignore[arg-type]
        return None

    def _iterated(self, name: ast.Name, at: ast.AST) -> ast.AST | None:
        """The dict whose keys a loop variable runs over at ``at``: ``for k in d``, ``for k, v in d.items()``,
        ``[k for k in d.keys() if ...]``."""
        for parent in self.ctx.ancestors(at):
            if isinstance(parent, DEFINITIONS):
                return None
            loops = parent.generators if isinstance(parent, _COMPREHENSIONS) else (
                [parent] if isinstance(parent, (ast.For, ast.AsyncFor)) else [])
            for loop in loops:
                target, it = loop.target, loop.iter
                if isinstance(target, ast.Tuple) and target.elts and isinstance(it, ast.Call) and (
                        isinstance(it.func, ast.Attribute) and it.func.attr == "items" and not it.args):
                    target, it = target.elts[0], it.func.value
                if isinstance(target, ast.Name) and target.id == name.id:
                    return self._key_set(it, loop, shaped=False)
        return None

    def _related(self, keys_of: ast.AST, names: set[str], target: str | None, depth: int = 0) -> bool:
        """Whether a dict is the loaded one (or one it is built from), or the target's ``state_dict()``
        (directly or through a name bound to it)."""
        if isinstance(keys_of, ast.Call) and isinstance(keys_of.func, ast.Attribute):
            return (keys_of.func.attr == "state_dict" and not keys_of.args and target is not None
                    and dotted(keys_of.func.value) == target)
        if not isinstance(keys_of, ast.Name):
            return False
        if keys_of.id in names:
            return True
        binding = self.only_binding(keys_of, keys_of) if depth < 3 else None
        if binding is None:
            return False
        value = self._key_set(binding.value, binding.stmt, shaped=False)  # type: ignore[arg-type]
        return value is not None and self._related(value, names, target, depth + 1)

    def _looked_at(self, node: ast.AST, scope: ast.AST, depth: int) -> bool:
        """Whether the value of ``node`` is raised, reported, asserted, returned, tested (or looped over) with a
        raise or a report in the branch; or assigned to a name read later in one of these ways."""
        child = node
        for parent in self.ctx.ancestors(node):
            if isinstance(parent, ast.Call) and child is not parent.func and last_name(parent.func) in _REPORTS:
                return True
            if isinstance(parent, (ast.Assert, ast.Raise, ast.Return)):
                return True
            if (isinstance(parent, (ast.If, ast.While, ast.IfExp)) and child is parent.test) or (
                    isinstance(parent, (ast.For, ast.AsyncFor)) and child is parent.iter):
                body, orelse = parent.body, parent.orelse
                branches = body + orelse if isinstance(body, list) else [body, orelse]  # an IfExp's are expressions
                return any(isinstance(n, ast.Raise) or (isinstance(n, ast.Call) and last_name(n.func) in _REPORTS)
                           for n in walk_own(branches))
            if isinstance(parent, (ast.Assign, ast.AnnAssign)) and child is parent.value and depth < 3:
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                assigned = {t.id for t in targets if isinstance(t, ast.Name)}
                return any(
                    name.id in assigned and isinstance(name.ctx, ast.Load) and position(name) > position(parent)
                    and self.ctx.is_inside(self.ctx.scope(name), scope) and self._looked_at(name, scope, depth + 1)
                    for name in self.ctx.nodes(ast.Name)
                )
            if isinstance(parent, (ast.stmt, *DEFINITIONS)):
                return False
            child = parent
        return False


def _unmove(value: ast.AST) -> ast.AST:
    """``net.to(device).eval()`` -> ``net``: the object a chain of moves returns."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
        value = value.func.value
    return value


def _load_chain(ctx: Context, expr: ast.AST, at: ast.AST, frame: Frame | None, pending: tuple[str | int, ...],
                depth: int) -> tuple[str, Keys] | None:
    """Follow a loaded value back to its ``torch.load``: subscripts collect keys (an integer picks an element
    of a tuple a function returns), names go to their one assignment (read only by subscripts, ``in`` tests
    and ``.keys()`` on the way), calls into the function they run (every ``return`` agreeing)."""
    if depth > 6:
        return None
    facts = ctx.analysis(Checkpoints)
    while isinstance(expr, ast.Subscript):
        key = constant_of(ctx, expr.slice)
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            return None
        pending = (key, *pending)
        expr = expr.value
    if isinstance(expr, ast.Call) and ctx.qualname(expr.func) == "torch.load":
        path = expr.args[0] if expr.args else getattr(keyword(expr, "f"), "value", None)
        if path is None or any(not isinstance(k, str) for k in pending):
            return None
        return path_pattern(ctx, path, expr, frame), pending  # type: ignore[return-value]
    if isinstance(expr, ast.Name):
        found = ctx.reaching(expr, at)
        if len(found) != 1 or found[0].kind != "assign" or found[0].value is None:
            return None
        binding = found[0]
        if not facts.untouched(expr.id, binding, at):
            return None
        if binding.unpacked:  # state, epoch = load_latest(folder): the first element of what it returns
            if binding.index is None or not isinstance(binding.value, ast.Call):
                return None
            pending = (binding.index, *pending)
        return _load_chain(ctx, binding.value, binding.stmt, frame, pending, depth + 1)
    if isinstance(expr, ast.Call):
        frames = frames_of(ctx, expr, frame)
        if len(frames) != 1:
            return None
        inner = frames[0]
        found = set()
        for ret in walk_own(inner.fn.body):
            if isinstance(ret, (ast.Yield, ast.YieldFrom)):
                return None
            if not isinstance(ret, ast.Return):
                continue
            value, rest = ret.value, pending
            if rest and isinstance(rest[0], int):
                if not isinstance(value, ast.Tuple) or not -len(value.elts) <= rest[0] < len(value.elts):
                    return None
                value, rest = value.elts[rest[0]], rest[1:]
            if value is None:
                return None
            found.add(_load_chain(inner.ctx, value, ret, inner, rest, depth + 1))
        return found.pop() if len(found) == 1 else None
    return None
