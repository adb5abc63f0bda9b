"""What the file does with autograd: regions where it is off, tensors that carry a graph, names that are
differentiated."""

from __future__ import annotations

import ast

from trainwise.doctor.context.syntax import (
    dotted,
    is_const,
    names_in,
)

_GRAD_OFF = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.no_grad",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.grad_mode.inference_mode",
        "torch.autograd.inference_mode",
    }
)

_LIGHTNING_NO_GRAD = frozenset({"validation_step", "test_step", "predict_step"})

_SET_GRAD = frozenset({"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"})

# Tensor methods whose result still carries the receiver's autograd graph.
_GRAPH_KEEPING_METHODS = frozenset(
    {
        "sum",
        "mean",
        "float",
        "double",
        "half",
        "cpu",
        "cuda",
        "to",
        "clone",
        "squeeze",
        "unsqueeze",
        "view",
        "reshape",
        "flatten",
        "abs",
        "pow",
        "sqrt",
        "exp",
        "log",
        "contiguous",
        "max",
        "min",
    }
)

_NO_GRAPH_METHODS = frozenset({"item", "tolist", "detach", "numpy", "argmax", "argmin", "__float__"})
_NO_GRAPH_BUILTINS = frozenset({"float", "int", "len", "round", "str", "bool"})

_NO_GRAPH_ATTRS = frozenset({"data", "grad", "shape", "dtype", "device", "ndim", "requires_grad", "is_leaf"})


class AutogradFacts:
    """Autograd in the file: where it is off, what carries a graph, what is differentiated (a part of
    :class:`Context`)."""

    def grad_disabled(self, node: ast.AST) -> bool:
        """Whether ``node`` runs with autograd off: inside ``with torch.no_grad()``/``inference_mode()``/
        ``set_grad_enabled(False)``, or in a function decorated with ``no_grad``/``inference_mode``."""
        child = node
        for parent in self.ancestors(node):
            # a direct child of a `with` that is a statement is one of its body (the others are its items)
            if isinstance(parent, (ast.With, ast.AsyncWith)) and isinstance(child, ast.stmt):
                if any(self._grad_off(item.context_expr) for item in parent.items):
                    return True
            elif isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(self._grad_off(d) for d in parent.decorator_list):
                    return True
                if parent.name in _LIGHTNING_NO_GRAD:  # Lightning runs these with autograd off
                    cls = self.enclosing_class(parent)
                    if cls is not None and cls.name in self.module_classes:
                        return True
            child = parent
        return False

    def _grad_off(self, expr: ast.AST) -> bool:
        call = expr if isinstance(expr, ast.Call) else None
        func = call.func if call is not None else expr
        name = self.qualname(func) or dotted(func) or ""
        if name in _GRAD_OFF or name.endswith((".no_grad", ".inference_mode")) or name in ("no_grad",
                                                                                           "inference_mode"):
            if call is not None and name.endswith("inference_mode") and call.args:
                return not is_const(call.args[0], False)
            return True
        if (name in _SET_GRAD or name.endswith(".set_grad_enabled")) and call is not None and call.args:
            return is_const(call.args[0], False)
        return False

    def carries_graph(self, node: ast.AST, at: ast.AST | None = None) -> bool:
        """Whether ``node`` is a tensor that carries an autograd graph: a loss, a model output, or an
        arithmetic of them, not detached (``.item()``, ``.detach()``, ``float()``) and not computed under
        ``no_grad``. Unknown values count as no."""
        return self._graph(node, node if at is None else at, 0) is True

    def _graph(self, node: ast.AST, at: ast.AST, depth: int) -> bool | None:
        if depth > 8:
            return None
        if isinstance(node, ast.BinOp):
            sides = (self._graph(node.left, at, depth + 1), self._graph(node.right, at, depth + 1))
            return True if True in sides else (False if sides == (False, False) else None)
        if isinstance(node, ast.UnaryOp):
            return self._graph(node.operand, at, depth + 1)
        if isinstance(node, (ast.Constant, ast.JoinedStr, ast.Compare, ast.BoolOp, ast.List, ast.Dict, ast.Tuple)):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                if func.attr in _GRAPH_KEEPING_METHODS:
                    return self._graph(func.value, at, depth + 1)
                if func.attr in ("item", "detach", "tolist", "numpy", "detach_", "__float__"):
                    return False
            if isinstance(func, ast.Name) and func.id in ("float", "int", "len", "round", "str", "bool"):
                return False
            if self.is_loss_call(node) or self.is_model_call(node):
                return not self.grad_disabled(node)
            return None
        if isinstance(node, ast.Attribute):  # outputs.loss, out.logits: fields of a model output
            if node.attr in _NO_GRAPH_ATTRS:
                return False
            return True if self._graph(node.value, at, depth + 1) is True else None
        if isinstance(node, ast.Subscript):
            return self._graph(node.value, at, depth + 1)
        if isinstance(node, ast.Name):
            reaching = self.reaching(node, at)
            verdicts: set[bool | None] = set()
            for b in reaching:
                if b.kind in ("assign", "walrus", "with") and b.value is not None:
                    if self.grad_disabled(b.stmt):
                        verdicts.add(False)
                    elif b.unpacked and isinstance(b.value, (ast.Tuple, ast.List)):
                        element = b.value.elts[b.index] if b.index is not None and b.index < len(b.value.elts) else None
                        verdicts.add(None if element is None else self._graph(element, b.stmt, depth + 1))
                    else:
                        verdicts.add(self._graph(b.value, b.stmt, depth + 1))
                elif b.kind == "for" and b.iter is not None and self.loader(b.iter) is not None:
                    verdicts.add(False)
                else:
                    verdicts.add(None)
            if verdicts == {True}:
                return True
            if False in verdicts:
                return False
            if verdicts <= {None} and self._is_graph_name(node):
                return True
            return None
        return None

    def _is_graph_name(self, node: ast.Name) -> bool:
        """A name that some ``.backward()`` of its own scope is called on: a loss."""
        if self._backward_names is None:
            self._backward_names = {}
            for call in self.nodes(ast.Call):
                func = call.func  # type: ignore[attr-defined]
                if isinstance(func, ast.Attribute) and func.attr == "backward" and isinstance(func.value, ast.Name):
                    self._backward_names.setdefault(id(self.scope(call)), set()).add(func.value.id)
        return node.id in self._backward_names.get(id(self.scope(node)), ())

    def differentiated(self, scope: ast.AST) -> set[str]:
        """Dotted names whose value flows into a ``backward()`` or a ``return`` of ``scope`` (directly or
        through assignments): totals that are meant to carry a graph."""
        key = ("differentiated", id(scope))
        cached = self._cache.get(key)  # type: ignore[arg-type]
        if cached is not None:
            return cached  # type: ignore[return-value]
        seeds: list[ast.AST] = []
        for call in self.nodes(ast.Call):
            func = call.func  # type: ignore[attr-defined]
            if not isinstance(func, ast.Attribute):
                if self.qualname(func) in ("torch.autograd.backward", "torch.autograd.grad"):
                    seeds.extend(call.args)  # type: ignore[attr-defined]
                continue
            if func.attr in ("backward", "manual_backward") and self._same_function(call, scope):
                seeds.append(func.value)
                seeds.extend(call.args)  # type: ignore[attr-defined]
        names: set[str] = set()
        for seed in seeds:
            names |= names_in(seed)
        for ret in self.nodes(ast.Return):
            if ret.value is not None and self._same_function(ret, scope):  # type: ignore[attr-defined]
                names |= names_in(ret.value, returned=True)  # type: ignore[attr-defined]
        changed = True
        while changed:  # y = f(x); y.backward()  ->  x flows into the backward too
            changed = False
            for (bscope, name), found in self.bindings.items():
                if name in names and bscope is scope:
                    for b in found:
                        if b.value is not None and not self.grad_disabled(b.stmt):
                            new = self._graph_names(b.value) - names
                            if new:
                                names |= new
                                changed = True
        self._cache[key] = names  # type: ignore[index]
        return names

    def _graph_names(self, expr: ast.AST) -> set[str]:
        """Dotted names in ``expr`` whose graph can reach its value: not those under a call that returns none
        (``.item()``, ``float(...)``, ``np.mean(...)``, ``math.exp(...)``)."""
        return names_in(expr, cut=self._returns_no_graph)

    def _returns_no_graph(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _NO_GRAPH_METHODS:
            return True
        if isinstance(func, ast.Name) and func.id in _NO_GRAPH_BUILTINS:
            return True
        return (self.qualname(func) or "").split(".", 1)[0] in ("numpy", "math", "random", "statistics")

    def _same_function(self, node: ast.AST, scope: ast.AST) -> bool:
        return self.scope(node) is scope
