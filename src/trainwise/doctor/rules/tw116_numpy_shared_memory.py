"""TW116 numpy-shared-memory: a NumPy array and a tensor that share memory, one written in place while the other
is used; ``.numpy()`` on a tensor that requires grad or lives on CUDA."""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context import dotted, is_const, keyword, last_name, method_call, position, walk_own
from trainwise.doctor.rule import Rule

_FROM_NUMPY = frozenset({"torch.from_numpy"})
_AS_TENSOR = frozenset({"torch.as_tensor", "torch.asarray"})
# ndarray methods that change the array in place.
_INPLACE_METHODS = frozenset({"sort", "fill", "put", "partition", "itemset"})
# Functions (NumPy's, random's) that change their first argument in place.
_INPLACE_FUNCTIONS = frozenset({"copyto", "shuffle", "put", "place", "putmask", "fill_diagonal"})
# Writes that replace every element (a buffer refilled): a mistake only when the old contents were kept.
_WHOLE = frozenset({"copyto", "fill"})
_STORING = frozenset({"append", "extend", "insert", "add", "put", "put_nowait"})
_PARAMETER_FREE = re.compile(
    r"\w*Pad\dd|\w*Pool\dd|\w*ReLU\d*|\w*Dropout\w*|Identity|Flatten|Unflatten|\w*Softm(?:ax|in)\w*|\w*Sigmoid|"
    r"Tanh\w*|GELU|SiLU|Mish|C?ELU|SELU|GLU|Hard\w+|Softplus|Softshrink|Threshold|Upsample\w*|Pixel(?:Un)?Shuffle|"
    r"ChannelShuffle|Fold|Unfold|\w*Loss"
)
_OTHER_ARRAYS = ("tensorflow", "keras", "jax", "cupy", "mxnet", "paddle")


class NumpySharedMemory(Rule):
    """A NumPy array and a tensor sharing memory, one written in place while the other is used; a failing `.numpy()`.

    ## What it does
    Finds `t = torch.from_numpy(a)` (or `torch.as_tensor(a)` of a NumPy array, with no `dtype` or
    `device`) followed, in the same block, by an in-place write of `a` (`a += ...`, `a[i] = ...`,
    `a.sort()`, `a.fill(...)`, `np.copyto(a, ...)`, `np.random.shuffle(a)`, `out=a`) while `t` is used
    after the write, where the program reads `t` before the write or goes on using both `t` and `a`;
    `x = t.numpy()` followed by an in-place write of `x` while `t` is used after it (the same way); a
    loop that keeps `torch.from_numpy(buffer)` (appends it to a list) and writes `buffer` in place on
    every iteration; and `.numpy()` called on a tensor that requires grad (a model's output, a loss, a
    parameter) or that is on CUDA (`.cuda()`, `.to("cuda")`).

    ## Why is this bad?
    On the CPU, `torch.from_numpy`, `torch.as_tensor` and `Tensor.numpy()` do not copy: the tensor and the
    array are two views of one buffer, so an in-place edit of one silently changes the other, and every
    tensor kept from a reused buffer ends up holding its last contents. Nothing fails; the numbers are
    just wrong. `.numpy()` on a tensor that requires grad raises `RuntimeError: Can't call numpy() on Tensor
    that requires grad`, and on a CUDA tensor `TypeError: can't convert cuda:0 device type tensor to
    numpy`. `trainwise lab from-numpy` measures the sharing (every element of the tensor changed by an edit
    of the array, none of a `torch.tensor` copy).

    The rule stays silent on copies (`torch.tensor(a)`, `.clone()`, `.copy()`, `np.array(t)`, a chained
    `torch.from_numpy(a).float()`), on arrays never written after the tensor is made, on a tensor not used
    after the write, on a write meant to reach the tensor (only the tensor is used afterwards, and it was
    not read before: `t = torch.from_numpy(onehot)` then `onehot[label] = 1`), on an array rebound rather
    than written (`a = a * 2`), on a buffer refilled whole
    (`a[:] = ...`, `np.copyto(a, ...)`) whose tensor was not kept before, on a tensor made before a loop
    that refills its array inside it (a buffer shared on purpose), on `.detach().cpu().numpy()`, and on
    outputs computed under `torch.no_grad()`.

    ## Example
    ```python
    import numpy as np
    import torch

    features = np.load("features.npy")
    raw = torch.from_numpy(features)
    features -= features.mean(axis=0)
    features /= features.std(axis=0)
    dataset = torch.utils.data.TensorDataset(raw, torch.from_numpy(features))
    ```

    ## Use instead
    ```python
    import numpy as np
    import torch

    features = np.load("features.npy")
    raw = torch.tensor(features)
    features -= features.mean(axis=0)
    features /= features.std(axis=0)
    dataset = torch.utils.data.TensorDataset(raw, torch.from_numpy(features))
    ```

    ## Fix safety
    There is no automatic fix: whether to copy (`torch.tensor(a)`, `t.clone()`, `x.copy()`) or to write a
    new array instead of editing in place depends on which side the program means to change.
    """

    code = "TW116"
    name = "numpy-shared-memory"
    message = "a NumPy array and a tensor share memory and one is written in place while the other is used"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._frozen: bool | None = None

    def visit_Assign(self, node: ast.Assign) -> None:
        """``t = torch.from_numpy(a)`` and ``x = t.numpy()``: a pair of names over one buffer."""
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name) or not isinstance(node.value, ast.Call):
            return
        target = node.targets[0].id
        call = node.value
        array = self._shared_array(call)
        if array is not None:
            self._check_pair(node, written=array, used=target, copy=f"`torch.tensor({array})`")
            return
        if method_call(call, "numpy") and not call.args and not call.keywords \
                and isinstance(call.func.value, ast.Name) and call.func.value.id != target:  # type: ignore[attr-defined]
            tensor = call.func.value.id  # type: ignore[attr-defined]
            self._check_pair(node, written=target, used=tensor, copy=f"`{target} = {tensor}.numpy().copy()`")

    def visit_Call(self, node: ast.Call) -> None:
        """``.numpy()`` on a tensor that requires grad or is on CUDA; ``torch.from_numpy(buffer)`` kept in a loop
        that refills ``buffer``."""
        if method_call(node, "numpy") and not node.args and not node.keywords:
            self._numpy_call(node)
            return
        array = self._shared_array(node)
        if array is not None:
            self._kept_from_refilled_buffer(node, array)

    # ------------------------------------------------------------------------------------ shared buffers
    def _shared_array(self, call: ast.Call) -> str | None:
        """The array name ``a`` of ``torch.from_numpy(a)``, or of ``torch.as_tensor(a)`` with no dtype or device
        where ``a`` comes from NumPy."""
        q = self.ctx.qualname(call.func) or ""
        if q not in _FROM_NUMPY and q not in _AS_TENSOR:
            return None
        if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Name):
            return None
        name = call.args[0]
        if q in _AS_TENSOR and not self._is_numpy_array(name, call):
            return None
        return name.id

    def _is_numpy_array(self, name: ast.Name, at: ast.AST) -> bool:
        found = self.ctx.reaching(name, at)
        return bool(found) and all(
            b.kind == "assign" and not b.unpacked and isinstance(b.value, ast.Call)
            and (self.ctx.qualname(b.value.func) or "").startswith("numpy.") for b in found)

    def _check_pair(self, made: ast.Assign, *, written: str, used: str, copy: str) -> None:
        """After ``made``, an in-place write of ``written`` at the same loop level, then a use of ``used``;
        ``copy``: the copy that fixes it."""
        scope = self.ctx.scope(made)
        loop = self.ctx.enclosing_loop(made)
        nodes = _own_nodes(scope)
        start = _end(made)
        kept = observed = False
        for node in nodes:
            if position(node) < start:
                continue
            if _rebinds(node, (written, used)):
                return
            if _stores(node, used):
                kept = True
            if isinstance(node, ast.Name) and node.id == used and isinstance(node.ctx, ast.Load):
                observed = True
            write = _inplace_write(node, written)
            if write is None:
                continue
            if self.ctx.enclosing_loop(node) is not loop:
                return  # refilled in a loop of its own: a buffer shared on purpose (or a loop this cannot follow)
            whole, what = write
            if whole and not kept:
                return  # refilled whole, its tensor not kept before: how a shared buffer is used on purpose
            use = _next_use(nodes, used, _end(node))
            # The program expects the old contents: it read them before the write, or it goes on using both
            # names as two values (a write meant to reach the other side, such as a one-hot set through the
            # array, uses only that side afterwards).
            if use is None or not (kept or observed or _next_use(nodes, written, _end(node)) is not None):
                return
            other = (f" or write a new array (`{written} = {written} - m` rather than `{written} -= m`)"
                     if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) else "")
            self.report(
                node,
                f"`{used}` and `{written}` share one buffer (line {made.lineno}: {self.ctx.segment(made.value)}), so "
                f"{what} also changes `{used}`, which is used after it (line {use.lineno}); make a copy "
                f"({copy}){other}",
            )
            return

    def _kept_from_refilled_buffer(self, call: ast.Call, array: str) -> None:
        """``kept.append(torch.from_numpy(buffer))`` in a loop that writes ``buffer`` in place each iteration."""
        parent = self.ctx.parent(call)
        if not (isinstance(parent, ast.Call) and method_call(parent, *_STORING) and call in parent.args):
            return
        loop = self.ctx.enclosing_loop(call)
        if loop is None:
            return
        body = _own_nodes(loop)
        if any(_rebinds(node, (array,)) for node in body):
            return
        for node in body:
            write = _inplace_write(node, array)
            if write is not None and self.ctx.enclosing_loop(node) is loop:
                self.report(
                    call,
                    f"every tensor kept here shares the memory of `{array}`, written in place on each iteration "
                    f"({write[1]}, line {node.lineno}): all the kept tensors end up holding its last contents; keep "
                    f"a copy (`torch.tensor({array})`)",
                )
                return

    # ------------------------------------------------------------------------------------------- .numpy()
    def _numpy_call(self, call: ast.Call) -> None:
        if not self.ctx.uses_torch() or any(v.split(".")[0] in _OTHER_ARRAYS for v in self.ctx.aliases.values()):
            return
        receiver = call.func.value  # type: ignore[attr-defined]
        text = self.ctx.segment(receiver)
        if self._on_cuda(receiver, call):
            self.report(call, f"`{text}` is on CUDA, and .numpy() raises TypeError for a CUDA tensor; move it to "
                              f"the CPU first: `.cpu().numpy()` (`.detach().cpu().numpy()` if it requires grad)")
            return
        why = self._requires_grad(receiver, call)
        if why is not None:
            self.report(call, f"`{text}` {why}, and .numpy() raises RuntimeError on a tensor that requires grad; "
                              f"call `{text}.detach().cpu().numpy()`")

    def _on_cuda(self, expr: ast.AST, at: ast.AST, depth: int = 0) -> bool:
        """``x.cuda()``, ``x.to("cuda")``, or a name bound only to one of them."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            if expr.func.attr == "cuda":
                return True
            if expr.func.attr == "to":
                device = expr.args[0] if expr.args else getattr(keyword(expr, "device"), "value", None)
                return isinstance(device, ast.Constant) and isinstance(device.value, str) \
                    and device.value.startswith("cuda")
            return False
        if isinstance(expr, ast.Name) and depth < 3:
            found = self.ctx.reaching(expr, at)
            return bool(found) and all(b.kind == "assign" and not b.unpacked and b.value is not None
                                       and self._on_cuda(b.value, b.stmt, depth + 1) for b in found)
        return False

    def _requires_grad(self, expr: ast.AST, at: ast.Call) -> str | None:
        """Why ``expr`` requires grad (a parameter of a module, a model's output or a loss), or None."""
        if self._frozen_somewhere():
            return None
        if isinstance(expr, ast.Attribute) and expr.attr in ("weight", "bias") and self.ctx.is_module(expr.value):
            return "is a parameter (it requires grad)"
        if isinstance(expr, ast.Name):
            for b in self.ctx.reaching(expr, at):
                if b.kind == "for" and b.iter is not None and (
                        (method_call(b.iter, "parameters") and not b.unpacked)
                        or (method_call(b.iter, "named_parameters") and b.index == 1)):
                    return "is a parameter (it requires grad)"
        if self._model_output(expr, at):
            return "is a model's output computed with autograd on (it requires grad)"
        if isinstance(expr, ast.Name) and self.ctx.carries_graph(expr, at) and any(
                method_call(c, "backward") and dotted(c.func.value) == expr.id  # type: ignore[attr-defined]
                for c in self.ctx.nodes(ast.Call) if self.ctx.scope(c) is self.ctx.scope(at)):
            return "is a loss that backward() is called on (it requires grad)"
        return None

    def _model_output(self, expr: ast.AST, at: ast.AST, depth: int = 0) -> bool:
        """``model(x)`` (or ``out.logits`` of it, or a name bound only to one) computed with autograd on, by a
        module that may hold parameters (not ``nn.ZeroPad2d(...)``, ``nn.ReLU()``, a loss)."""
        if depth > 3:
            return False
        while isinstance(expr, ast.Attribute) and expr.attr not in ("data", "grad"):
            expr = expr.value
        if isinstance(expr, ast.Call):
            return self.ctx.is_model_call(expr) and not self.ctx.grad_disabled(expr) \
                and not self._parameter_free(expr.func)
        if isinstance(expr, ast.Name):
            found = self.ctx.reaching(expr, at)
            return bool(found) and all(b.kind == "assign" and not b.unpacked and b.value is not None
                                       and self._model_output(b.value, b.stmt, depth + 1) for b in found)
        return False

    def _parameter_free(self, func: ast.AST) -> bool:
        """A module built from a torch.nn class without parameters (padding, pooling, activations, losses)."""
        found = self.ctx.bindings_of(func)
        values = [b.value for b in found if b.kind == "assign" and b.value is not None]
        return bool(values) and all(
            isinstance(v, ast.Call) and (self.ctx.qualname(v.func) or "").startswith("torch.nn.")
            and _PARAMETER_FREE.fullmatch((self.ctx.qualname(v.func) or "").rsplit(".", 1)[1]) is not None
            for v in values)

    def _frozen_somewhere(self) -> bool:
        """Whether the file switches gradients off for some parameters (its models' outputs may not need grad)."""
        if self._frozen is None:
            self._frozen = self._switches_grad_off()
        return self._frozen

    def _switches_grad_off(self) -> bool:
        for call in self.ctx.nodes(ast.Call):
            if method_call(call, "requires_grad_") and call.args and is_const(call.args[0], False):  # type: ignore[attr-defined]
                return True
        for assign in self.ctx.nodes(ast.Assign):
            if any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in assign.targets) \
                    and is_const(assign.value, False):  # type: ignore[attr-defined]
                return True
        return False


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope (or a loop), nested functions and classes left out, in source order."""
    return sorted(walk_own(ast.iter_child_nodes(scope)), key=position)


def _end(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


def _rebinds(node: ast.AST, names: tuple[str, ...]) -> bool:
    """``a = ...`` (not ``a += ...``), ``for a in``, ``with ... as a``, ``del a``: a name given another value."""
    targets: list[ast.AST] = []
    if isinstance(node, (ast.Assign,)):
        targets = list(node.targets)
    elif (isinstance(node, ast.AnnAssign) and node.value is not None) or isinstance(node, (ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name) and sub.id in names and isinstance(sub.ctx, (ast.Store, ast.Del)):
                return True
    return False


def _stores(node: ast.AST, name: str) -> bool:
    """``kept.append(t)``, ``box[k] = t``, ``self.x = t``, ``yield t``: the tensor kept beyond this point."""
    if isinstance(node, ast.Call) and method_call(node, *_STORING):
        return any(isinstance(a, ast.Name) and a.id == name for a in node.args)
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == name:
        return any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in node.targets)
    if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        items = node.value.values if isinstance(node.value, ast.Dict) else node.value.elts
        return any(isinstance(item, ast.Name) and item.id == name for item in items)
    return isinstance(node, (ast.Yield, ast.YieldFrom)) and isinstance(node.value, ast.Name) and node.value.id == name


def _inplace_write(node: ast.AST, name: str) -> tuple[bool, str] | None:
    """An in-place write of the array ``name`` at ``node``: (whether it replaces every element, its words)."""
    if isinstance(node, ast.AugAssign):
        target = node.target
        if isinstance(target, ast.Name) and target.id == name:
            return False, f"`{name} {_OPS.get(type(node.op), '?')}= ...` (in place)"
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == name:
            return False, f"`{name}[...] {_OPS.get(type(node.op), '?')}= ...`"
        return None
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == name:
                return _whole_slice(target.slice), f"`{name}[...] = ...`"
        return None
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == name \
            and func.attr in _INPLACE_METHODS:
        return func.attr in _WHOLE, f"`{name}.{func.attr}(...)`"
    out = keyword(node, "out")
    if out is not None and isinstance(out.value, ast.Name) and out.value.id == name:
        return False, f"`{last_name(func) or 'a call'}(..., out={name})`"
    if last_name(func) in _INPLACE_FUNCTIONS and node.args and isinstance(node.args[0], ast.Name) \
            and node.args[0].id == name and (dotted(func) or "").split(".")[0] not in ("torch", "self"):
        return last_name(func) in _WHOLE, f"`{dotted(func) or last_name(func)}({name}, ...)`"
    return None


def _whole_slice(index: ast.AST) -> bool:
    """``a[:]`` or ``a[...]``: every element."""
    if isinstance(index, ast.Constant) and index.value is Ellipsis:
        return True
    return isinstance(index, ast.Slice) and index.lower is None and index.upper is None and index.step is None


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
        ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.MatMult: "@"}


def _next_use(nodes: list[ast.AST], name: str, after: tuple[int, int]) -> ast.AST | None:
    """The first read of ``name`` after ``after``, unless the name is rebound first."""
    for node in nodes:
        if position(node) < after:
            continue
        if _rebinds(node, (name,)) and not any(isinstance(s, ast.Name) and s.id == name and isinstance(s.ctx, ast.Load)
                                               for s in ast.walk(getattr(node, "value", None) or ast.Pass())):
            return None
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            return node
    return None
