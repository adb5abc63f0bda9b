"""TW114 unregistered-module: layers or parameters of a module kept where ``nn.Module`` does not register them."""

from __future__ import annotations

import ast
from collections import deque

from trainwise.doctor.context import Context, init_of, is_const, keyword, last_name
from trainwise.doctor.rule import Rule

# torch.nn classes that hold parameters (or a dropout, which model.eval() must reach): one of these in a plain
# list is lost. Parameter-free layers (activations, pooling, losses) lose nothing there, as the guard says.
_PARAMETRIC = frozenset({
    "Linear", "Bilinear", "LazyLinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "SyncBatchNorm", "LayerNorm", "GroupNorm", "RMSNorm", "Embedding", "EmbeddingBag", "RNN", "LSTM", "GRU",
    "RNNCell", "LSTMCell", "GRUCell", "MultiheadAttention", "Transformer", "TransformerEncoder",
    "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer", "PReLU",
})
_DROPOUT = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"})
_NN_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
_REGISTERING = _NN_CONTAINERS | {"ParameterList", "ParameterDict"}
_PARAMETER = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
_PLAIN = {"list": "list", "tuple": "tuple", "dict": "dict"}
_GROWS = frozenset({"append", "extend", "insert"})
# Methods that register what a plain container holds some other way (or a frozen teacher kept out on purpose).
_REGISTERS = frozenset({"add_module", "register_module", "register_parameter", "register_buffer"})
_DEPTH = 4
_KEPT = (ast.Call, ast.Assign, ast.AnnAssign, ast.AugAssign)  # the nodes the class walk keeps
_SKIP_FIELDS = frozenset({"ctx", "op", "ops", "type_ignores"})  # never hold a node worth visiting
_FIELDS: dict[type, tuple[str, ...]] = {}


class UnregisteredModule(Rule):
    """Layers, parameters or trainable tensors that a module keeps where `nn.Module` does not register them.

    ## What it does
    Finds, in a class that subclasses `nn.Module` (directly, or through a base class of the same file or of
    another file of the run), an attribute set in `__init__` (or in a method `__init__` calls) to a plain
    `list`, `tuple` or `dict` (a literal, a comprehension, `list(...)`, a local list filled with `append`, or
    an empty one filled later with `self.blocks.append(...)` or `self.blocks = self.blocks + [...]`) whose
    items are modules that hold parameters (`nn.Linear(...)`, `nn.Conv2d(...)`, a dropout, a module class of
    the run) or `nn.Parameter`s; and an
    attribute set to a plain tensor that requires grad (`self.scale = torch.ones(1, requires_grad=True)`,
    `torch.zeros(3).requires_grad_()`).

    ## Why is this bad?
    `nn.Module.__setattr__` registers a module, an `nn.Parameter` or an `nn.ModuleList`, not the items of a
    Python list or dict, and not a tensor that merely requires grad. What it does not register is invisible
    to `model.parameters()`, `.to(device)`, `state_dict()` and `train()`/`eval()`: the optimizer built from
    `model.parameters()` never updates those layers (they stay at their random initialisation, often on
    the wrong device), checkpoints silently omit them, and a dropout in the list keeps dropping out in
    evaluation. Nothing fails: the model just trains worse. `trainwise lab unregistered` measures it, and
    the run-time guard (`trainwise.guard`, the Trainer) reports the same code at the start of a run, naming
    the attribute path (`model.blocks[2]`).

    The rule stays silent on `nn.ModuleList`, `nn.ModuleDict`, `nn.ParameterList`, `nn.ParameterDict`,
    `register_buffer` and `add_module`; on a local list passed to `nn.Sequential(*layers)` or
    `nn.ModuleList(layers)`; on a list later wrapped (`self.blocks = nn.ModuleList(self.blocks)`, or kept
    under another name: `self.path_module_list = nn.ModuleList(self.paths)`); on a list
    of non-modules (ints, strings, functions) or of parameter-free layers (`nn.ReLU()`, losses), which lose
    nothing; on a list of modules the class freezes or puts in eval (a teacher kept out of `state_dict` on
    purpose); on a list of `nn.Parameter`s that a method of the class returns (shards handed to the optimizer
    by hand, as ZeRO-3 style code does); on tensors that do not require grad; and on classes that are not
    modules.

    ## Example
    ```python
    from torch import nn


    class Net(nn.Module):
        def __init__(self, width=64, depth=4):
            super().__init__()
            self.blocks = [nn.Linear(width, width) for _ in range(depth)]

        def forward(self, x):
            for block in self.blocks:
                x = block(x).relu()
            return x
    ```

    ## Use instead
    ```python
    from torch import nn


    class Net(nn.Module):
        def __init__(self, width=64, depth=4):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x).relu()
            return x
    ```

    ## Fix safety
    There is no automatic fix: wrapping the list in `nn.ModuleList` (or a tensor in `nn.Parameter`) changes
    the names in `state_dict()`, so checkpoints saved before no longer load strictly; the message says what
    to write.
    """

    code = "TW114"
    name = "unregistered-module"
    message = "modules held in a plain list are not registered: use nn.ModuleList"

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """A module class: the attributes its ``__init__`` (and the methods it calls) set."""
        init = init_of(node)
        if init is None or not self.ctx.is_module_class(node):
            return
        nodes = _MethodNodes()
        methods = _reached_from_init(node, init, nodes)
        assigned: dict[str, list[tuple[ast.AST, ast.expr, ast.AST]]] = {}  # attr -> (target, value, method)
        for method in methods:
            for stmt in nodes(method):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    target, value = stmt.target, stmt.value
                else:
                    continue
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self" and _concatenated(target.attr, value) is None):
                    assigned.setdefault(target.attr, []).append((target, value, method))
        others: set[str] | None = None
        spared: set[str] = set()
        for attr, found in assigned.items():
            if len(found) != 1:
                continue  # set twice (wrapped later, or rebuilt): not judged
            target, value, method = found[0]
            tensor = _trainable_tensor(self.ctx, value)
            container = None if tensor else _container(self.ctx, value, method)
            if not tensor and container is None:
                continue  # most attributes: a layer, a number; the class's other methods are not walked for them
            if others is None:
                others, spared = _other_assignments(node, methods, nodes), _spared(node)
            if attr in others or attr in spared:
                continue  # set again elsewhere (wrapped later, or rebuilt), or registered another way
            self._judge(node, attr, target, tensor, container, methods, nodes)

    def _judge(self, cls: ast.ClassDef, attr: str, target: ast.AST, tensor: bool,
               container: tuple[str, list[ast.expr]] | None, methods: list[ast.AST], nodes: _MethodNodes) -> None:
        if tensor:
            self.report(target, f"`self.{attr}` is a plain tensor with requires_grad=True, which nn.Module does not "
                                f"register: model.parameters(), .to() and state_dict() do not see it, so the "
                                f"optimizer never updates it and checkpoints omit it; make it "
                                f"`self.{attr} = nn.Parameter(...)`, or register_buffer('{attr}', ...) if it "
                                f"should not train")
            return
        if container is None:
            return
        kind, items = container
        if _passed_on(attr, methods, nodes):
            return  # self.paths handed to nn.ModuleList(self.paths) (kept under another name): registered there
        items = items + _grown_later(attr, methods, nodes)
        held = [h for h in (_held(self.ctx, item, 0) for item in items) if h is not None]
        if not held:
            return
        if all(name == "nn.Parameter" for name, _ in held) and _handed_out(cls, attr):
            return  # parameters kept apart on purpose and given to the optimizer by a method (ZeRO-style shards)
        kinds = sorted({name for name, _ in held})
        trains = any(trains for _, trains in held)
        them = "them"
        if trains:
            lost = (f"model.parameters(), .to() and state_dict() do not see {them}, so the optimizer never updates "
                    f"{them} and checkpoints omit {them}")
        else:
            lost = f"model.eval() does not reach {them}, so dropout stays on in evaluation"
        modules = [name for name in kinds if name != "nn.Parameter" and not name.startswith("tensor")]
        if modules and len(modules) == len(kinds):
            fix = "use an nn.ModuleDict instead" if kind == "dict" else "use an nn.ModuleList instead"
        elif not modules:
            fix = "use an nn.ParameterDict instead" if kind == "dict" else "use an nn.ParameterList instead"
        else:
            fix = "hold the modules in an nn.ModuleList or nn.ModuleDict and the tensors as nn.Parameter"
        words = [f"{', '.join(modules)} modules"] if modules else []
        words += ["nn.Parameters" for name in kinds if name == "nn.Parameter"]
        words += ["tensors with requires_grad=True" for name in kinds if name.startswith("tensor")]
        what = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)
        self.report(target, f"`self.{attr}` holds {what} in a plain {kind}, which nn.Module does not "
                            f"register: {lost}; {fix}")


# ------------------------------------------------------------------------------------------------ the class
def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {fn.name: fn for fn in cls.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))}


class _MethodNodes:
    """The calls and assignments (``Assign``, ``AnnAssign``, ``AugAssign``) of each method of a class, in
    ``ast.walk``'s order (breadth first), each method walked once and only when asked: the questions below
    share these walks instead of walking the class again each (they took a third of a run over transformers)."""

    def __init__(self) -> None:
        self._walked: dict[ast.AST, list[ast.AST]] = {}

    def __call__(self, method: ast.AST) -> list[ast.AST]:
        found = self._walked.get(method)
        if found is None:
            found = self._walked[method] = _kept_nodes(method)
        return found


def _kept_nodes(root: ast.AST) -> list[ast.AST]:
    """The calls and assignments in and below ``root``, in ``ast.walk``'s order."""
    found: list[ast.AST] = []
    queue: deque[ast.AST] = deque([root])
    pop, push = queue.popleft, queue.append
    node_class, kept, fields_of = ast.AST, _KEPT, _FIELDS
    while queue:
        node = pop()
        tp = type(node)
        if tp in kept:
            found.append(node)
        fields = fields_of.get(tp)
        if fields is None:
            fields = fields_of[tp] = tuple(f for f in tp._fields if f not in _SKIP_FIELDS)
        for name in fields:
            value = getattr(node, name, None)
            if type(value) is list:
                for item in value:
                    if isinstance(item, node_class):
                        push(item)
            elif isinstance(value, node_class):
                push(value)
    return found


def _reached_from_init(cls: ast.ClassDef, init: ast.FunctionDef, nodes: _MethodNodes) -> list[ast.AST]:
    """``__init__`` and the methods of the class it calls as ``self.name(...)`` (and those call), once each."""
    methods = _methods(cls)
    reached: list[ast.AST] = [init]
    todo: list[ast.AST] = [init]
    while todo:
        fn = todo.pop()
        for node in nodes(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
                callee = methods.get(node.func.attr)
                if callee is not None and callee not in reached and len(reached) < 16:
                    reached.append(callee)
                    todo.append(callee)
    return reached


def _other_assignments(cls: ast.ClassDef, methods: list[ast.AST], nodes: _MethodNodes) -> set[str]:
    """Attributes the class also sets outside the methods ``__init__`` reaches (a ``setup()`` that wraps them)."""
    out: set[str] = set()
    for fn in _methods(cls).values():
        if fn in methods:
            continue
        for node in nodes(fn):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                attr = _self_attr(target)
                if attr is not None:
                    out.add(attr)
    return out


def _spared(cls: ast.ClassDef) -> set[str]:
    """Attributes the class registers another way, freezes or keeps in eval (``self.teacher[0].eval()``),
    or every attribute (``"*"``) when it registers by name (``add_module``, ``setattr(self, ...)``)."""
    out: set[str] = set()
    for node in ast.walk(cls):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and node.args and _is_self(node.args[0]):
            out.add("*")
        if not isinstance(func, ast.Attribute):
            continue
        if func.attr in _REGISTERS and _is_self(func.value):
            out.add("*")
        if func.attr == "eval" or (func.attr == "requires_grad_" and node.args and is_const(node.args[0], False)):
            attr = _self_attr_root(func.value)
            if attr is not None:
                out.add(attr)
    if "*" in out:
        out |= {a.attr for a in ast.walk(cls) if isinstance(a, ast.Attribute) and _is_self(a.value)}
    return out


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _self_attr_root(node: ast.AST) -> str | None:
    """``attr`` of ``self.attr``, ``self.attr[0]``, ``self.attr["a"].x``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and _is_self(node.value):
            return node.attr
        node = node.value
    return None


# ------------------------------------------------------------------------------------------------ the values
def _container(ctx: Context, value: ast.expr, fn: ast.AST) -> tuple[str, list[ast.expr]] | None:
    """The kind of plain container ``value`` builds (``list``, ``tuple``, ``dict``) and the expressions of
    its items; None for anything else."""
    if isinstance(value, (ast.List, ast.Set)):
        return "list", [e for e in value.elts if not isinstance(e, ast.Starred)]
    if isinstance(value, ast.Tuple):
        return "tuple", [e for e in value.elts if not isinstance(e, ast.Starred)]
    if isinstance(value, ast.Dict):
        return "dict", [v for v in value.values if v is not None]
    if isinstance(value, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return "list", [value.elt]
    if isinstance(value, ast.DictComp):
        return "dict", [value.value]
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _PLAIN \
            and not ctx.lookup(value.func.id, value) and ctx.qualname(value.func) is None:
        kind = _PLAIN[value.func.id]
        items = [kw.value for kw in value.keywords if kw.arg is not None]
        if value.args:
            inner = _container(ctx, value.args[0], fn) if len(value.args) == 1 else None
            if inner is None:
                return None
            items += inner[1]
        return kind, items
    if isinstance(value, ast.Name):
        return _local_list(ctx, value, fn)
    return None


def _local_list(ctx: Context, name: ast.Name, fn: ast.AST) -> tuple[str, list[ast.expr]] | None:
    """A local name of ``fn`` bound once to a plain container, with what the function appends to it."""
    found = ctx.lookup(name.id, name)
    if len(found) != 1 or found[0].kind != "assign" or found[0].unpacked or found[0].value is None:
        return None
    if ctx.scope(found[0].stmt) is not fn or isinstance(found[0].value, ast.Name):
        return None
    container = _container(ctx, found[0].value, fn)
    if container is None:
        return None
    kind, items = container
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Attribute) and node.func.attr in _GROWS) \
                and any(isinstance(a, ast.Name) and a.id == name.id for a in _arguments(node)):
            return None  # passed on (nn.Sequential(*layers), nn.ModuleList(layers)): registered there too
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _GROWS \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == name.id and node.args:
            items = items + _grown(ctx, node, fn)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                                                  and t.value.id == name.id for t in node.targets):
            items = [*items, node.value]
    return kind, items


def _passed_on(attr: str, methods: list[ast.AST], nodes: _MethodNodes) -> bool:
    """Whether ``self.<attr>`` is handed to a registering container in the methods:
    ``self.path_module_list = nn.ModuleList(self.paths)`` registers the modules of ``self.paths`` there."""
    for method in methods:
        for node in nodes(method):
            if isinstance(node, ast.Call) and last_name(node.func) in _REGISTERING \
                    and any(isinstance(a, ast.Attribute) and a.attr == attr and isinstance(a.value, ast.Name)
                            and a.value.id == "self" for a in _arguments(node)):
                return True
    return False


def _arguments(call: ast.Call) -> list[ast.expr]:
    """A call's arguments, starred ones unwrapped."""
    values = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
    return values + [kw.value for kw in call.keywords]


def _grown(ctx: Context, call: ast.Call, fn: ast.AST) -> list[ast.expr]:
    attr = call.func.attr  # type: ignore[attr-defined]
    if attr == "append":
        return [call.args[0]]
    if attr == "insert":
        return [call.args[1]] if len(call.args) > 1 else []
    inner = _container(ctx, call.args[0], fn)  # extend
    return inner[1] if inner is not None else []


def _grown_later(attr: str, methods: list[ast.AST], nodes: _MethodNodes) -> list[ast.expr]:
    """What ``self.attr.append(...)``, ``self.attr[k] = ...`` and ``self.attr += [...]`` add in ``methods``."""
    items: list[ast.expr] = []
    for fn in methods:
        for node in nodes(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _GROWS \
                    and _self_attr(node.func.value) == attr and node.args:
                if node.func.attr == "append":
                    items.append(node.args[0])
                elif node.func.attr == "insert" and len(node.args) > 1:
                    items.append(node.args[1])
                elif isinstance(node.args[0], (ast.List, ast.Tuple, ast.ListComp, ast.GeneratorExp)):
                    arg = node.args[0]
                    items.extend([arg.elt] if isinstance(arg, (ast.ListComp, ast.GeneratorExp)) else arg.elts)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and _self_attr(t.value) == attr
                                                      for t in node.targets):
                items.append(node.value)
            elif isinstance(node, ast.AugAssign) and _self_attr(node.target) == attr \
                    and isinstance(node.value, (ast.List, ast.Tuple)):
                items.extend(node.value.elts)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and _self_attr(node.targets[0]) == attr:
                items.extend(_concatenated(attr, node.value) or [])
    return items


def _concatenated(attr: str, value: ast.expr) -> list[ast.expr] | None:
    """The items ``self.attr = self.attr + [...]`` (or ``[...] + self.attr``) adds; None for any other value."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return None
    if _self_attr(value.left) == attr:
        other = value.right
    elif _self_attr(value.right) == attr:
        other = value.left
    else:
        return None
    if isinstance(other, (ast.ListComp, ast.GeneratorExp)):
        return [other.elt]
    return list(other.elts) if isinstance(other, (ast.List, ast.Tuple)) else []


def _handed_out(cls: ast.ClassDef, attr: str) -> bool:
    """A method of the class returns ``self.attr`` or its items (``return [self.chunk[0]]``): the class gives
    those parameters to whoever builds the optimizer itself."""
    for fn in _methods(cls).values():
        if fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None and any(
                    _self_attr(sub) == attr for sub in ast.walk(node.value)):
                return True
    return False


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and _is_self(node.value):
        return node.attr
    return None


def _trainable_tensor(ctx: Context, value: ast.expr) -> bool:
    """``torch.ones(1, requires_grad=True)``, ``torch.zeros(3).requires_grad_()`` (or ``(True)``): a leaf tensor
    that requires grad, built by a torch factory."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr == "requires_grad_":
        if value.keywords or len(value.args) > 1 or (value.args and not is_const(value.args[0], True)):
            return False
        return isinstance(func.value, ast.Call) and _torch_factory(ctx, func.value)
    flag = keyword(value, "requires_grad")
    return flag is not None and is_const(flag.value, True) and _torch_factory(ctx, value)


def _torch_factory(ctx: Context, call: ast.Call) -> bool:
    q = ctx.qualname(call.func) or ""
    last = q.rsplit(".", 1)[-1]
    return q.count(".") == 1 and q.startswith("torch.") and last[:1].islower() and last not in ("compile", "load")


def _held(ctx: Context, item: ast.expr, depth: int) -> tuple[str, bool] | None:
    """What an item of a plain container is, when it is lost there: (its kind in words, whether it holds a
    parameter that trains; False for a parameter-free dropout); None when it is anything else or unknown."""
    if depth > _DEPTH or not isinstance(item, ast.Call):
        return None
    func = item.func
    if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda", "cpu", "float", "double", "half", "bfloat16"):
        return _held(ctx, func.value, depth + 1) if isinstance(func.value, ast.Call) else None
    if _trainable_tensor(ctx, item):
        return "tensor with requires_grad=True", True
    q = ctx.qualname(func) or ""
    if q in _PARAMETER:
        return "nn.Parameter", True
    if q.startswith("torch.nn.") and q.count(".") == 2:
        last = q.rsplit(".", 1)[1]
        if last in _PARAMETRIC:
            return f"nn.{last}", True
        if last in _DROPOUT:
            p = keyword(item, "p")
            rate = p.value if p is not None else (item.args[0] if item.args else None)
            return None if rate is not None and ctx.constant(rate) == 0 else (f"nn.{last}", False)
        if last in _NN_CONTAINERS:
            inner = [_held(ctx, arg.value if isinstance(arg, ast.Starred) else arg, depth + 1) for arg in item.args]
            found = [h for h in inner if h is not None]
            return (f"nn.{last}", any(t for _, t in found)) if found else None
        return None
    if (q.startswith("torchvision.models.") and q.rsplit(".", 1)[1][:1].islower()) or q == "timm.create_model":
        return q.rsplit(".", 1)[1], True
    cls, where = _class_called(ctx, item)
    if cls is not None and where is not None and where.is_module_class(cls) and _builds_something(cls):
        return cls.name, True
    return None


def _class_called(ctx: Context, call: ast.Call) -> tuple[ast.ClassDef | None, Context | None]:
    """The class of the file or of the run a call constructs."""
    if isinstance(call.func, ast.Name):
        local = ctx.class_named(call.func.id, call)
        if local is not None:
            return local, ctx
    program = ctx.program
    found = program.class_of(ctx, call.func) if program is not None else None
    return (found[1], found[0]) if found is not None else (None, None)


def _builds_something(cls: ast.ClassDef) -> bool:
    """A module class that may hold parameters: its ``__init__`` calls something besides ``super().__init__()``
    (or it has no ``__init__`` of its own but a base class other than ``nn.Module``)."""
    init = init_of(cls)
    if init is None:
        return any(not (isinstance(b, ast.Attribute) and b.attr == "Module") and not
                   (isinstance(b, ast.Name) and b.id == "Module") for b in cls.bases)
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"):
            return True
    return False
