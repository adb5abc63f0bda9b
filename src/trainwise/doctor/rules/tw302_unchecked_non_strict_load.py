"""TW302 unchecked-non-strict-load: ``load_state_dict(strict=False)`` whose key report nobody reads."""

from __future__ import annotations

import ast

from trainwise.doctor.context import Binding, dotted, is_const, keyword, last_name, position
from trainwise.doctor.rule import Rule

# Wrappers whose state_dict() keys carry a prefix the bare model's keys do not have.
_WRAPPERS = {
    "torch.nn.DataParallel": "module.",
    "torch.nn.parallel.DataParallel": "module.",
    "torch.nn.parallel.data_parallel.DataParallel": "module.",
    "torch.nn.parallel.DistributedDataParallel": "module.",
    "torch.nn.parallel.distributed.DistributedDataParallel": "module.",
    "torch.compile": "_orig_mod.",
}
_WRAPPER_NAMES = {"module.": "nn.DataParallel/DistributedDataParallel", "_orig_mod.": "torch.compile"}
# Models built bare: a class of the file, a torchvision/timm/transformers constructor, an nn container.
_MODEL_LIBRARIES = ("torchvision.models.", "timm.", "transformers.")
_PREFIX_TOOLS = frozenset({"consume_prefix_in_state_dict_if_present", "removeprefix", "strip_prefix",
                           "remove_prefix", "unwrap_model"})
_MOVES = ("to", "cuda", "cpu", "float", "half", "double", "eval", "train", "requires_grad_")
# Calls that tell the user about a key: print, warnings.warn, logger.warning/info/error.
_REPORTS = frozenset({"print", "warn", "warning", "info", "error", "debug", "log", "write"})
_READS = frozenset({"keys", "items", "values", "get"})  # dict methods that leave the keys as they are
_Keys = tuple[str, ...]


class UncheckedNonStrictLoad(Rule):
    """`load_state_dict(..., strict=False)` whose missing and unexpected keys are never looked at.

    ## What it does
    Finds `load_state_dict(state, strict=False)` calls whose result (the named tuple of `missing_keys` and
    `unexpected_keys`) is discarded, or assigned to names that are never read.

    It also finds, within one file, a state dict saved from a wrapped model and loaded strictly into the bare
    one: `torch.save(dp_model.state_dict(), path)` with `dp_model = nn.DataParallel(model)` (or
    `DistributedDataParallel(...)`, `torch.compile(...)`, also `model = nn.DataParallel(model)` on the same
    name), then `model.load_state_dict(torch.load(path))` where `model` is the inner model, `dp_model.module`
    or a model built bare (a class of the file, a torchvision/timm constructor). The state dict may sit in a
    checkpoint dict (`{"model": ...}` saved, `ckpt["model"]` loaded), and the save may be in a helper or
    training function that every call passes the wrapped model (`save_checkpoint(model, path)`).

    ## Why is this bad?
    A wrapper's state dict has `module.` (DataParallel/DDP) or `_orig_mod.` (`torch.compile`) in front of
    every key. A strict load into the bare model fails with every key missing and unexpected, typically after
    the training run, at evaluation or export. With `strict=False`, keys that do not match are skipped
    silently: such a checkpoint then loads *nothing*, training or evaluation runs from random weights, and
    the only symptom is a bad number much later. The call returns the keys it could not match; look at them
    (or use `trainwise.checkpoint.load_weights`, which fixes the prefixes and reports what was left out).

    The rule stays silent when the result is used: assigned and then read, printed, asserted or returned,
    and when the loaded dict is built key by key from the model's own `state_dict()` with a message for the
    keys it leaves out (`for k, v in model.state_dict().items(): if k not in ckpt: logger.warning(...)`).
    On the saved-wrapped form it stays silent when the state dict was taken from `dp_model.module` (or
    `._orig_mod`), when it is loaded into the wrapped model (the DDP tutorial's
    `ddp_model.load_state_dict(...)`), when its keys are rewritten or the loaded dict is passed to anything
    before the load (`{k.replace("module.", ""): v ...}`, `k[7:]`, `removeprefix`,
    `consume_prefix_in_state_dict_if_present`; a file that strips these prefixes anywhere is left alone), when
    the paths differ or cannot be told equal, when the model loaded into is of unknown kind (a parameter,
    `build_model()`), and when a helper saves models that are wrapped on one call and bare on another.

    ## Example
    ```python
    import torch

    model.load_state_dict(torch.load("weights.pt", weights_only=True), strict=False)
    ```

    ## Use instead
    ```python
    import torch

    result = model.load_state_dict(torch.load("weights.pt", weights_only=True), strict=False)
    if result.missing_keys or result.unexpected_keys:
        print(f"missing: {result.missing_keys}, unexpected: {result.unexpected_keys}")
    ```

    ## Fix safety
    There is no automatic fix: what to do with keys that did not match depends on the model.
    """

    code = "TW302"
    name = "unchecked-non-strict-load"
    message = "load_state_dict(strict=False) ignores mismatched keys silently; check the returned keys"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._saves: list[tuple[ast.expr, _Keys, str, str, ast.Call, ast.AST]] | None = None
        self._strips: bool | None = None

    def visit_Call(self, node: ast.Call) -> None:
        """``x.load_state_dict(state, strict=False)`` or ``(state, False)``; a strict load of a wrapped
        model's state dict into the bare model."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "load_state_dict"):
            return
        strict = keyword(node, "strict")
        if not (is_const(strict.value, False) if strict is not None else (
            len(node.args) >= 2 and is_const(node.args[1], False))):
            strict_value = strict.value if strict is not None else (node.args[1] if len(node.args) >= 2 else None)
            if strict_value is None or is_const(strict_value, True):
                self._check_prefix(node)
            return
        state = node.args[0] if node.args else getattr(keyword(node, "state_dict"), "value", None)
        if state is not None and self._checked_key_by_key(state, node):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, ast.Expr):
            self.report(node, "load_state_dict(strict=False) discards its report of missing and unexpected keys: "
                              "a checkpoint whose keys do not match loads nothing, silently; check the result")
            return
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = []
            for target in targets:
                elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                for element in elements:
                    if isinstance(element, ast.Starred):
                        element = element.value
                    if not isinstance(element, ast.Name):
                        return  # stored on an object or in a container: assume someone reads it
                    names.append(element.id)
            if all(name.startswith("_") for name in names):
                return  # an explicit discard
            if not self._read_later(set(names), parent):
                self.report(node, f"the keys that load_state_dict(strict=False) could not match are assigned to "
                                  f"`{', '.join(names)}` but never read; a checkpoint whose keys do not match "
                                  f"loads nothing, silently")

    def _checked_key_by_key(self, state: ast.AST, load: ast.Call) -> bool:
        """The loaded dict is built key by key from the model's own ``state_dict()``, with a message for the
        keys it leaves out (YOLOX's ``load_ckpt``: ``for key, v in model.state_dict().items(): if key not in
        ckpt: logger.warning(...)``): nothing is dropped silently."""
        if not isinstance(state, ast.Name):
            return False
        scope = self.ctx.scope(load)
        for loop in self.ctx.nodes(ast.For):
            if self.ctx.scope(loop) is not scope or position(loop) > position(load):
                continue
            if not self._over_state_dict(loop.iter, loop):  # type: ignore[attr-defined]
                continue
            inner = [n for stmt in loop.body for n in ast.walk(stmt)]  # type: ignore[attr-defined]
            fills = any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                        and n.value.id == state.id for n in inner)
            reports = any(isinstance(n, ast.Call) and (last_name(n.func) or "") in _REPORTS for n in inner)
            if fills and reports:
                return True
        return False

    def _over_state_dict(self, expr: ast.AST, at: ast.AST) -> bool:
        """``model.state_dict().items()`` (``.keys()``, or a name bound to ``model.state_dict()``)."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("items", "keys"):
            expr = expr.func.value
        if isinstance(expr, ast.Name):
            binding = self._only_binding(expr, at)
            expr = binding.value if binding is not None else expr  # type: ignore[assignment]
        return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "state_dict"

    def _read_later(self, names: set[str], stmt: ast.AST) -> bool:
        scope = self.ctx.scope(stmt)
        after = position(stmt)
        for name in self.ctx.nodes(ast.Name):
            if name.id in names and isinstance(name.ctx, ast.Load) and position(name) > after:  # type: ignore[attr-defined]
                inner = self.ctx.scope(name)
                if inner is scope or self.ctx.is_inside(inner, scope):
                    return True
        return False

    # ------------------------------------------------------------------ a wrapped model's keys, loaded bare
    def _check_prefix(self, load: ast.Call) -> None:
        """``torch.save(dp_model.state_dict(), path)`` then ``model.load_state_dict(torch.load(path))``: the
        keys start with ``module.`` (``_orig_mod.``), the bare model's do not, and the strict load fails."""
        state = load.args[0] if load.args else getattr(keyword(load, "state_dict"), "value", None)
        if state is None or not self._wrapped_saves() or self._strips_prefixes():
            return
        source = self._loaded_from(state, load, 0)
        if source is None:
            return
        path, keys = source
        target = load.func.value  # type: ignore[attr-defined]
        for save_path, save_keys, saved, prefix, save, path_at in self._wrapped_saves():
            if save_keys == keys and self._same_path(save_path, path_at, path, load) and self._bare(target, load):
                where = f"{saved} ({_WRAPPER_NAMES[prefix]}, line {save.lineno})"
                self.report(load, f"this state dict was saved from the wrapped {where}: its keys start with "
                                  f"`{prefix}`, the bare `{dotted(target)}`'s do not, so the strict load fails "
                                  f"with missing and unexpected keys; save the inner model's state_dict() "
                                  f"(`.module`, `._orig_mod`) or strip the prefix before loading")
                return

    def _strips_prefixes(self) -> bool:
        """Whether the file handles wrapper prefixes somewhere (``k.replace("module.", "")``,
        ``removeprefix``, ``consume_prefix_in_state_dict_if_present``): then stay silent."""
        if self._strips is None:
            self._strips = any(
                isinstance(c.value, str) and ("module." in c.value or "_orig_mod" in c.value)  # type: ignore[attr-defined]
                for c in self.ctx.nodes(ast.Constant)
            ) or any(getattr(n, "attr", getattr(n, "id", None)) in _PREFIX_TOOLS
                     for tp in (ast.Name, ast.Attribute) for n in self.ctx.nodes(tp))
        return self._strips

    def _wrapped_saves(self) -> list[tuple[ast.expr, _Keys, str, str, ast.Call, ast.AST]]:
        """(path, keys, wrapped model, prefix, the save or its call, where the path is read) of each save of a
        wrapped model's state dict: directly, or in a function of the file that every call passes a wrapped
        model (``def save_checkpoint(model, path)``, ``def train(model, ...)``)."""
        if self._saves is None:
            self._saves = cached = []
            for call in self.ctx.nodes(ast.Call):
                if self.ctx.qualname(call.func) != "torch.save" or len(call.args) < 2:  # type: ignore[attr-defined]
                    continue
                path = call.args[1]  # type: ignore[attr-defined]
                for keys, model in self._state_dicts(call.args[0], call, (), 0):  # type: ignore[attr-defined]
                    prefix = self._wrapper_prefix(model, call)
                    if prefix is not None:
                        cached.append((path, keys, f"`{dotted(model)}`", prefix, call, call))  # type: ignore[arg-type]
                    elif isinstance(model, ast.Name):
                        cached.extend((p, keys, name, pre, site, at)  # type: ignore[misc]
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
        if len(self.ctx.functions_named(fn.name)) != 1 or not _is_param(fn, param):
            return []
        calls = [c for c in self.ctx.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == fn.name]  # type: ignore[attr-defined]
        out = []
        per_call = isinstance(path, ast.Name) and _is_param(fn, path.id)  # each call saves to its own file
        for call in calls[:32]:
            arg = _argument(fn, param, call)  # type: ignore[arg-type]
            prefix = None
            if isinstance(arg, ast.Call):
                prefix = self._wrapper_call(arg)
            elif arg is not None:
                prefix = self._wrapper_prefix(arg, call)
            if per_call and prefix is None:
                continue
            if prefix is None or (out and out[0][2] != prefix):
                return []
            name = f"`{dotted(arg)}`" if dotted(arg) is not None else "model"  # type: ignore[arg-type]
            name += f" passed to `{fn.name}()`"
            if per_call:
                at_call = _argument(fn, path.id, call)  # type: ignore[arg-type, union-attr]
                if at_call is None:
                    continue
                out.append((at_call, name, prefix, call, call))  # type: ignore[arg-type]
            else:
                out.append((path, name, prefix, call, save))  # type: ignore[arg-type]
        return out

    def _state_dicts(self, obj: ast.AST, at: ast.AST, keys: _Keys, depth: int) -> list[tuple[_Keys, ast.AST]]:
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
                    out.extend(self._state_dicts(value, at, (*keys, key.value), depth + 1))
            return out
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "dict" and not obj.args:
            return [r for kw in obj.keywords if kw.arg for r in self._state_dicts(kw.value, at, (*keys, kw.arg),
                                                                                 depth + 1)]
        if isinstance(obj, ast.Name):
            binding = self._only_binding(obj, at)
            if binding is not None and self._untouched(obj.id, binding, at):
                return self._state_dicts(binding.value, binding.stmt, keys, depth + 1)  # type: ignore[arg-type]
        return []

    def _loaded_from(self, state: ast.AST, at: ast.AST, depth: int) -> tuple[ast.expr, _Keys] | None:
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
            binding = self._only_binding(state, at)
            if binding is not None and self._untouched(state.id, binding, at):
                inner = self._loaded_from(binding.value, binding.stmt, depth + 1)  # type: ignore[arg-type]
                if inner is not None:
                    return inner[0], inner[1] + tuple(keys)
        return None

    def _only_binding(self, name: ast.Name, at: ast.AST) -> Binding | None:
        found = self.ctx.reaching(name, at)
        if len(found) != 1 or found[0].kind != "assign" or found[0].unpacked or found[0].value is None:
            return None
        return found[0]

    def _untouched(self, name: str, binding: Binding, at: ast.AST) -> bool:
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
            return False
        return True

    def _wrapper_prefix(self, model: ast.AST, at: ast.AST) -> str | None:
        """The key prefix when ``model`` is, where its state dict is taken, a DataParallel/DDP/compiled
        wrapper: bound to ``nn.DataParallel(net)`` (or ``.to(device)`` of it)."""
        if not isinstance(model, (ast.Name, ast.Attribute)) or dotted(model) is None:
            return None
        found = self.ctx.reaching(model, at)
        if len(found) != 1 or found[0].kind != "assign" or found[0].unpacked or found[0].value is None:
            return None
        return self._wrapper_call(found[0].value)

    def _wrapper_call(self, value: ast.AST) -> str | None:
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
            value = value.func.value
        if isinstance(value, ast.Call) and value.args:
            return _WRAPPERS.get(self.ctx.qualname(value.func) or "")
        return None

    def _bare(self, target: ast.AST, at: ast.AST) -> bool:
        """Whether the model loaded into is known to be unwrapped: ``wrapped.module``, or a name whose value
        there is a model built bare (a class of the file, a torchvision/timm constructor); for an attribute
        (``self.model``), every value it is ever given is one."""
        if isinstance(target, ast.Attribute) and target.attr in ("module", "_orig_mod"):
            return self._wrapper_prefix(target.value, at) is not None
        if isinstance(target, ast.Call):
            return self._built_bare(target)  # Net().load_state_dict(...)
        if isinstance(target, ast.Name):
            found = self.ctx.reaching(target, at)
        elif isinstance(target, ast.Attribute) and dotted(target) is not None:
            found = self.ctx.bindings_of(target)
        else:
            return False
        return bool(found) and all(
            b.kind == "assign" and not b.unpacked and b.value is not None and self._built_bare(b.value)
            for b in found
        )

    def _built_bare(self, value: ast.AST) -> bool:
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
            value = value.func.value
        if not isinstance(value, ast.Call) or self._wrapper_call(value) is not None:
            return False
        if isinstance(value.func, ast.Name) and value.func.id in self.ctx.module_classes:
            return True
        q = self.ctx.qualname(value.func) or ""
        if q.startswith(_MODEL_LIBRARIES):
            return q.rsplit(".", 1)[-1] not in ("compile",)
        return q.startswith("torch.nn.") and q.rsplit(".", 1)[-1][:1].isupper() and q not in _WRAPPERS

    def _same_path(self, a: ast.expr, a_at: ast.AST, b: ast.expr, b_at: ast.AST) -> bool:
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


def _is_param(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    """Whether ``name`` is a parameter of ``fn`` (positional or keyword)."""
    args = fn.args
    return any(a.arg == name for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _argument(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, call: ast.Call) -> ast.expr | None:
    """The expression a call of the plain function ``fn`` passes for its parameter ``name``, if explicit."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if name not in positional:
        return None
    index = positional.index(name)
    if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]) or index >= len(call.args):
        return None
    return call.args[index]
