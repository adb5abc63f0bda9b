"""What a rule knows about one file: parents, scopes, bindings, import aliases, and the roles of variables.

Built in one pass over the ``ast`` tree before the rules run; the role questions (is this a loader? a model? a
tensor that carries a graph?) are answered lazily and cached. Every predicate leans towards "no" when unsure:
a doctor that cries wolf gets switched off.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Optional

from trainwise.doctor.text import split_lines

_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
# Definitions whose bodies run at another time than the code around them.
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

# Names a fragment (a notebook cell, a snippet) may use without importing them.
_IMPLICIT_MODULES = {"torch": "torch"}

_TORCH_LIBRARIES = frozenset(
    {"torch", "torchvision", "torchaudio", "torchtext", "lightning", "pytorch_lightning", "transformers", "timm",
     "accelerate", "trainwise", "torchmetrics", "diffusers", "peft"}
)
_LOADER_CLASSES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
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

# Methods only an nn.Module has (between them): a receiver of one is a module.
_MODULE_METHODS = frozenset(
    {"parameters", "named_parameters", "modules", "named_modules", "children", "named_children", "buffers"}
)
_MODULE_RETURNING = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval"})
_MODEL_NAME = re.compile(
    r"(?:\w*_)?(?:model|net|network|encoder|decoder|backbone|classifier|generator|discriminator|teacher|student)"
    r"(?:_\w*)?",
    re.IGNORECASE,
)
_LINE_ENDS = re.compile(r"(\r\n|\r|\n)")  # how ast.get_source_segment splits a file into lines
_MODEL_CAMEL = re.compile(r"(?:model|net)[A-Z0-9]\w*|\w*(?:Net|Model)\d*")
_SUBMODULE_ATTR = re.compile(
    r"(?:\w*_)?(?:module|model|backbone|encoder|decoder|features|classifier|fc\d*|head|heads|layers?\d*|conv\d*|"
    r"bn\d*|norm\d*|embeddings?|embed\w*|transformer|blocks?|stem|pooler|lm_head|bert|vit|resnet|"
    r"base_model|lstm|gru|rnn|attention|attn|mlp|decoder_layers|encoder_layers)(?:_\w*)?",
    re.IGNORECASE,
)
_PARAMETER_ATTRS = frozenset({"weight", "bias", "data", "grad", "running_mean", "running_var"})
_OPTIMIZER_NAME = re.compile(r"(?:\w*_)?(?:optimizer|optimiser|opt|optim)(?:_\w*|[A-Z0-9]\w*)?", re.IGNORECASE)
_LOSS_FN_NAME = re.compile(
    r"(?:\w*_)?(?:criterion|loss_fn|loss_func|lossfn|loss_function|loss_fct|criteria)(?:_\w*)?", re.IGNORECASE
)
_FUNCTIONAL_LOSSES = frozenset(
    {
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "kl_div",
        "cosine_embedding_loss",
        "margin_ranking_loss",
        "triplet_margin_loss",
        "ctc_loss",
        "poisson_nll_loss",
        "gaussian_nll_loss",
        "multi_margin_loss",
        "soft_margin_loss",
        "hinge_embedding_loss",
        "multilabel_margin_loss",
        "multilabel_soft_margin_loss",
    }
)
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
_NO_GRAPH_ATTRS = frozenset({"data", "grad", "shape", "dtype", "device", "ndim", "requires_grad", "is_leaf"})


@dataclass(frozen=True)
class Binding:
    """One place a name (or a dotted attribute such as ``self.model``) gets a value.

    ``value`` is the assigned expression (``None`` for parameters, loop targets without a known source, and
    imports); ``iter`` is what a ``for`` loop iterates over; ``unpacked`` is true for tuple targets.
    """

    target: ast.AST
    stmt: ast.AST
    kind: str  # "assign", "augassign", "for", "with", "param", "import", "walrus", "del"
    value: Optional[ast.expr] = None  # noqa: UP045 - dataclass annotations stay evaluable on 3.10
    iter: Optional[ast.expr] = None  # noqa: UP045
    unpacked: bool = False
    index: Optional[int] = None  # noqa: UP045 - position in an unpacked tuple target, when known


@dataclass(frozen=True)
class LoaderInfo:
    """What is known of a DataLoader: the call that built it (if seen) and whether each batch is one sample."""

    call: ast.Call | None
    one_sample_per_batch: bool
    custom_sampling: bool  # sampler/batch_sampler/drop_last: len(loader.dataset) may not be the sample count


def walk_own(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node in and below ``nodes``, nested function, lambda and class definitions excluded."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, DEFINITIONS):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_name(node: ast.AST) -> str | None:
    """The last component of a name or attribute (``nn.Linear`` -> ``Linear``), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    """The keyword argument ``name=`` of a call, if given explicitly."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    """Whether the call passes ``**kwargs`` (which may hold any keyword)."""
    return any(kw.arg is None for kw in call.keywords)


def is_const(node: ast.AST | None, value: object) -> bool:
    """Whether ``node`` is the literal ``value`` (compared by type and value, so ``1`` is not ``True``)."""
    return isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value


def method_call(node: ast.AST, *names: str) -> bool:
    """Whether ``node`` is a call ``<something>.<name>(...)`` for one of ``names``."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names


def position(node: ast.AST) -> tuple[int, int]:
    """(line, column) of a node, for ordering; (0, 0) for nodes without a position."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


class Context:
    """The parsed file and everything rules may ask about it (see docs/doctor-internals.md)."""

    def __init__(self, tree: ast.Module, source: str, path: str = "<string>") -> None:
        self.tree = tree
        self.source = source
        self.path = path
        self.lines = split_lines(source)  # not str.splitlines: U+2028 in a string does not end a line
        self.parents: dict[ast.AST, ast.AST] = {}
        self.by_type: dict[type, list[ast.AST]] = {}
        self.aliases: dict[str, str] = {}  # local name -> qualified name, from every import in the file
        self.bindings: dict[tuple[ast.AST, str], list[Binding]] = {}  # (scope, name) -> bindings
        self.attr_bindings: dict[str, list[Binding]] = {}  # "self.model" -> bindings, file-wide
        self.method_receivers: dict[str, set[str]] = {}  # method name -> dotted receivers it is called on
        self.called: set[str] = set()  # dotted names called like functions: model(x)
        self.module_classes: set[str] = set()  # classes of this file that subclass nn.Module
        self._cache: dict[tuple[str, int], object] = {}
        self._source_lines: list[str] | None = None
        self._backward_names: dict[int, set[str]] | None = None
        self._index()

    # ----------------------------------------------------------------------------------------------- indexing
    def _index(self) -> None:
        """One iterative walk (no recursion, so any nesting depth is fine): parents, nodes by type, scopes,
        bindings, imports and method calls."""
        parents = self.parents
        by_type = self.by_type
        fields_of = _CHILD_FIELDS
        node_class = ast.AST
        stack: list[tuple[ast.AST, ast.AST]] = [(self.tree, self.tree)]
        pop, push = stack.pop, stack.append
        classes: list[ast.ClassDef] = []
        while stack:
            node, scope = pop()
            tp = type(node)
            bucket = by_type.get(tp)
            if bucket is None:
                by_type[tp] = [node]
            else:
                bucket.append(node)
            if tp is ast.Call:
                self._index_call(node)  # type: ignore[arg-type]
            elif tp in _BINDING_TYPES:
                self._index_binding(node, scope)
            elif tp is ast.ClassDef:
                classes.append(node)  # type: ignore[arg-type]
                self.bindings.setdefault((scope, node.name), []).append(Binding(node, node, "def"))  # type: ignore[attr-defined]
            fields = fields_of.get(tp)
            if fields is None:
                fields = fields_of[tp] = tuple(f for f in tp._fields if f not in _SKIP_FIELDS)
            if tp in _SCOPE_TYPES:
                # Decorators, defaults and annotations belong to the enclosing scope, the body to the new one.
                own = _own_children(node)
                for field in fields:
                    value = getattr(node, field, None)
                    for item in value if type(value) is list else (value,):
                        if isinstance(item, node_class):
                            parents[item] = node
                            push((item, node if id(item) in own else scope))
                continue
            for field in fields:
                value = getattr(node, field, None)
                if type(value) is list:
                    for item in value:
                        if isinstance(item, node_class):
                            parents[item] = node
                            push((item, scope))
                elif isinstance(value, node_class):
                    parents[value] = node
                    push((value, scope))
        self._find_module_classes(classes)

    def _index_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = dotted(func.value)
            if receiver is not None:
                self.method_receivers.setdefault(func.attr, set()).add(receiver)
        name = dotted(func)
        if name is not None:
            self.called.add(name)

    def _add(self, scope: ast.AST, target: ast.AST, binding: Binding) -> None:
        if isinstance(target, ast.Name):
            self.bindings.setdefault((scope, target.id), []).append(binding)
        elif isinstance(target, ast.Attribute):
            key = dotted(target)
            if key is not None:
                self.attr_bindings.setdefault(key, []).append(binding)
        elif isinstance(target, ast.Starred):
            self._add(scope, target.value, binding)

    def _add_targets(self, scope: ast.AST, target: ast.AST, stmt: ast.AST, kind: str, **values: object) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for i, element in enumerate(target.elts):
                if isinstance(element, (ast.Tuple, ast.List)):
                    self._add_targets(scope, element, stmt, kind, **{**values, "unpacked": True, "nested": True})
                else:
                    index = None if values.get("nested") else i
                    extra = {k: v for k, v in values.items() if k not in ("unpacked", "nested")}
                    self._add(scope, element, Binding(element, stmt, kind, unpacked=True, index=index, **extra))  # type: ignore[arg-type]
        else:
            self._add(scope, target, Binding(target, stmt, kind, **values))  # type: ignore[arg-type]

    def _index_binding(self, node: ast.AST, scope: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._add_targets(scope, target, node, "assign", value=node.value)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self._add_targets(scope, node.target, node, "assign", value=node.value)
        elif isinstance(node, ast.AugAssign):
            self._add_targets(scope, node.target, node, "augassign", value=node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            self._add_targets(scope, node.target, node, "for", iter=node.iter)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self._add_targets(scope, item.optional_vars, node, "with", value=item.context_expr)
        elif isinstance(node, ast.NamedExpr):
            self._add_targets(scope, node.target, node, "walrus", value=node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None:
                    self.bindings.setdefault((node, arg.arg), []).append(Binding(arg, node, "param"))
            if not isinstance(node, ast.Lambda):
                self.bindings.setdefault((scope, node.name), []).append(Binding(node, node, "def"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name != "*":
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _find_module_classes(self, classes: list[ast.ClassDef]) -> None:
        known = {"torch.nn.Module", "torch.nn.modules.module.Module", "lightning.LightningModule",
                 "pytorch_lightning.LightningModule", "lightning.pytorch.LightningModule"}
        changed = True
        while changed:  # a class deriving from a module class of this file is a module too
            changed = False
            for cls in classes:
                if cls.name in self.module_classes:
                    continue
                for base in cls.bases:
                    q = self.qualname(base)
                    if q in known or (isinstance(base, ast.Name) and base.id in self.module_classes) or (
                        q is not None and q.startswith("torch.nn.") and q.rsplit(".", 1)[1][:1].isupper()
                    ):
                        self.module_classes.add(cls.name)
                        changed = True
                        break

    # ------------------------------------------------------------------------------------------- structure
    def nodes(self, node_type: type) -> list[ast.AST]:
        """Every node of exactly this type, in source order of discovery (pre-order)."""
        return self.by_type.get(node_type, [])

    def parent(self, node: ast.AST) -> ast.AST | None:
        """The node directly containing ``node`` (None for the module)."""
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """The parents of ``node``, innermost first."""
        parent = self.parents.get(node)
        while parent is not None:
            yield parent
            parent = self.parents.get(parent)

    def scope(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module whose body holds ``node``."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, _SCOPES) and _in_own_scope(parent, child):
                return parent
            child = parent
        return self.tree

    def enclosing_loop(self, node: ast.AST) -> ast.For | ast.AsyncFor | ast.While | None:
        """The innermost ``for``/``while`` loop whose body holds ``node``, within the same function."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, _SCOPES):
                return None
            if isinstance(parent, _LOOPS) and _inside(child, parent.body):
                return parent
            child = parent
        return None

    def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None:
        """The innermost class whose body (or a method of it) holds ``node``."""
        for parent in self.ancestors(node):
            if isinstance(parent, ast.ClassDef):
                return parent
        return None

    def is_inside(self, node: ast.AST, container: ast.AST) -> bool:
        """Whether ``container`` is ``node`` or one of its ancestors."""
        return node is container or any(parent is container for parent in self.ancestors(node))

    def segment(self, node: ast.AST) -> str:
        """The source text of a node (empty if unknown): ``ast.get_source_segment``, without splitting the
        whole file again on every call (a file with thousands of findings took minutes)."""
        try:
            first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
            start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return ""
        if last is None or end is None:
            return ""
        if self._source_lines is None:
            self._source_lines = _LINE_ENDS.split(self.source)  # ast's own split: \r\n, \r, \n, kept
            self._source_lines = [a + b for a, b in zip(self._source_lines[::2], [*self._source_lines[1::2], ""])
                                  if a + b]
        lines = self._source_lines
        if not 0 <= first <= last < len(lines):
            return ""
        if first == last:
            return lines[first].encode()[start:end].decode(errors="replace")
        head = lines[first].encode()[start:].decode(errors="replace")
        tail = lines[last].encode()[:end].decode(errors="replace")
        return "".join([head, *lines[first + 1:last], tail])

    # --------------------------------------------------------------------------------------------- names
    def qualname(self, node: ast.AST) -> str | None:
        """The fully qualified name behind a name or attribute, through import aliases (``nn.Linear`` ->
        ``torch.nn.Linear``); None when the root name is not imported (or is rebound locally)."""
        name = dotted(node)
        if name is None:
            return None
        first, dot, rest = name.partition(".")
        root = self.aliases.get(first) or _IMPLICIT_MODULES.get(first)
        if root is None:
            return None
        return root + dot + rest

    def callee(self, call: ast.Call) -> str | None:
        """The qualified name of what a call calls, else its dotted text, else None."""
        return self.qualname(call.func) or dotted(call.func)

    def lookup(self, name: str, at: ast.AST) -> list[Binding]:
        """Bindings of a plain name visible at ``at``: its own scope, else the enclosing functions and module."""
        scope = self.scope(at)
        while True:
            found = self.bindings.get((scope, name))
            if found:
                return found
            if scope is self.tree:
                return []
            parent_scope = self.scope(scope)
            while isinstance(parent_scope, ast.ClassDef):  # class bodies are not visible from methods
                parent_scope = self.scope(parent_scope)
            scope = parent_scope

    def bindings_of(self, node: ast.AST, at: ast.AST | None = None) -> list[Binding]:
        """Bindings of a name (lexically) or a dotted attribute (file-wide) expression."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id, node if at is None else at)
        key = dotted(node)
        if key is None:
            return []
        return self.attr_bindings.get(key, [])

    def reaching(self, node: ast.AST, at: ast.AST | None = None) -> list[Binding]:
        """The bindings that most likely give ``node`` its value at ``at``: the last one before it in the
        source if there is one, else all of them (a loop may bring a later one round)."""
        at = node if at is None else at
        found = [b for b in self.bindings_of(node, at) if b.kind != "del"]
        if not found:
            return []
        before = [b for b in found if position(b.stmt) < position(at) and not self.is_inside(at, b.stmt)]
        if not before:
            # `x = f(x)` style: the statement holding `at` itself does not count as before it.
            return found
        last = max(before, key=lambda b: position(b.stmt))
        if last.kind == "augassign":
            return [b for b in before if b.kind != "augassign"][-1:] or [last]
        return [last]

    def constant(self, node: ast.AST, depth: int = 0) -> object:
        """The value of a literal, or of a name bound exactly once to a literal; ``...`` when unknown."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and depth < 3:
            found = self.bindings_of(node)
            if len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked and found[0].value is not None:
                return self.constant(found[0].value, depth + 1)
        return ...

    # ------------------------------------------------------------------------------------------- autograd
    def grad_disabled(self, node: ast.AST) -> bool:
        """Whether ``node`` runs with autograd off: inside ``with torch.no_grad()``/``inference_mode()``/
        ``set_grad_enabled(False)``, or in a function decorated with ``no_grad``/``inference_mode``."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, (ast.With, ast.AsyncWith)) and _inside(child, parent.body):
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

    # ---------------------------------------------------------------------------------------------- roles
    def loader(self, node: ast.AST, depth: int = 0) -> LoaderInfo | None:
        """The DataLoader that ``node`` refers to: a variable assigned from ``DataLoader(...)``, or one named
        like a loader (``train_loader``, ``dl``, ``valid_dl``, ``dataloaders[phase]``); else None."""
        if depth > 4:
            return None
        if isinstance(node, ast.Subscript):
            name = last_name(node.value)
            if name is not None and _is_loader_name(name) and name.lower().endswith(("loaders", "dls")):
                return LoaderInfo(None, False, False)
            return None
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        bindings = self.bindings_of(node)
        for b in bindings:
            if (b.kind in ("assign", "walrus") and not b.unpacked and isinstance(b.value, ast.Call)
                    and self.is_loader_call(b.value)):
                return self._loader_info(b.value)
        name = last_name(node)
        if name is None or not _is_loader_name(name):
            return None
        for b in bindings:
            if b.kind in ("assign", "walrus") and isinstance(b.value, (ast.Constant, ast.List, ast.Dict, ast.Tuple,
                                                                       ast.ListComp, ast.DictComp, ast.Set)):
                return None
        return LoaderInfo(None, False, False)

    def is_loader_call(self, call: ast.Call) -> bool:
        """Whether a call constructs a ``torch.utils.data.DataLoader`` (through any alias)."""
        q = self.qualname(call.func)
        if q is not None:
            return q in _LOADER_CLASSES
        name = last_name(call.func)
        return name is not None and name.endswith("DataLoader") and not name.startswith("_")

    def _loader_info(self, call: ast.Call) -> LoaderInfo:
        custom = any(kw.arg in ("sampler", "batch_sampler") for kw in call.keywords) or not is_const(
            getattr(keyword(call, "drop_last"), "value", ast.Constant(False)), False
        )
        no_size = keyword(call, "batch_size") is None
        if keyword(call, "batch_sampler") is not None or (has_star_kwargs(call) and no_size):
            return LoaderInfo(call, False, custom)
        kw = keyword(call, "batch_size")
        size: ast.AST | None = kw.value if kw is not None else (call.args[1] if len(call.args) > 1 else None)
        if size is None:
            return LoaderInfo(call, True, custom)  # DataLoader's default batch_size is 1
        value = self.constant(size)
        return LoaderInfo(call, value is None or value == 1, custom)

    def is_module(self, node: ast.AST, depth: int = 0) -> bool:
        """Whether ``node`` is an ``nn.Module`` instance: a model variable, a known submodule of one
        (``model.backbone``, ``self.encoder``, ``model[0]``) or a loop variable over ``.modules()``."""
        if depth > 6:
            return False
        key = ("module", id(node))
        cached = self._cache.get(key)  # type: ignore[arg-type]
        if cached is not None:
            return cached  # type: ignore[return-value]
        result = self._is_module(node, depth)
        self._cache[key] = result  # type: ignore[index]
        return result

    def _is_module(self, node: ast.AST, depth: int) -> bool:
        if isinstance(node, ast.Subscript):  # nn.Sequential / nn.ModuleList indexing
            return self.is_module(node.value, depth + 1)
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return False
        verdict = self._module_from_bindings(node, depth)
        if verdict is not None:
            return verdict
        key = dotted(node)
        if key is not None:
            if any(key in self.method_receivers.get(m, ()) for m in _MODULE_METHODS):
                return True
            if key in self.called and any(key in self.method_receivers.get(m, ()) for m in ("train", "eval")):
                return True
        if self.qualname(node) is not None:
            return False  # an imported name (torch.Generator, nn.Linear) is a function or class, not a model
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name == "self" and isinstance(node, ast.Name):
            cls = self.enclosing_class(node)
            return cls is not None and cls.name in self.module_classes
        if _is_model_name(name):
            return True
        if isinstance(node, ast.Name) or node.attr in _PARAMETER_ATTRS:
            return False
        return bool(_SUBMODULE_ATTR.fullmatch(node.attr)) and self.is_module(node.value, depth + 1)

    def _module_from_bindings(self, node: ast.AST, depth: int) -> bool | None:
        verdicts = set()
        for b in self.bindings_of(node):
            if b.kind == "for" and b.iter is not None:
                if (method_call(b.iter, "modules", "children") and not b.unpacked) or (
                    method_call(b.iter, "named_modules", "named_children") and b.index == 1
                ):
                    verdicts.add(True)
                elif method_call(b.iter, "parameters", "named_parameters", "buffers", "named_buffers"):
                    verdicts.add(False)
            elif b.kind == "def":
                verdicts.add(False)
            elif b.kind in ("assign", "walrus") and b.value is not None and not b.unpacked:
                verdict = self._module_value(b.value, depth)
                if verdict is not None:
                    verdicts.add(verdict)
        if len(verdicts) == 1:
            return verdicts.pop()
        return None

    def _module_value(self, value: ast.AST, depth: int) -> bool | None:
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        q = self.qualname(func)
        if q is not None:
            last = q.rsplit(".", 1)[-1]
            if q.startswith("torch.nn.") and not q.startswith(("torch.nn.functional", "torch.nn.init",
                                                               "torch.nn.utils")):
                return last[:1].isupper() and last not in ("Parameter", "ParameterList", "ParameterDict",
                                                           "Buffer", "UninitializedParameter")
            if q.startswith("torch.") and last[:1].islower() and last not in ("compile",):
                return False  # torch.zeros, torch.tensor, ...: tensors
            if q == "torch.compile":
                return True
            if q.startswith("torchvision.models.") and last[:1].islower():
                return True
            if q in ("timm.create_model",) or (q.startswith("transformers.") and last == "from_pretrained"):
                return True
        if isinstance(func, ast.Name) and func.id in self.module_classes:
            return True
        if isinstance(func, ast.Attribute) and func.attr in _MODULE_RETURNING and self.is_module(func.value, depth + 1):
            return True
        return None

    def is_model_call(self, node: ast.AST) -> bool:
        """Whether ``node`` is a forward call ``model(x)`` of a module."""
        return isinstance(node, ast.Call) and self.is_module(node.func)

    def is_optimizer(self, node: ast.AST) -> bool:
        """Whether ``node`` is an optimizer: assigned from ``torch.optim.<Class>(...)`` or named like one."""
        for b in self.bindings_of(node):
            if b.kind == "assign" and isinstance(b.value, ast.Call):
                q = self.qualname(b.value.func) or ""
                if q.startswith("torch.optim.") and ".lr_scheduler" not in q and ".swa_utils" not in q:
                    return True
        name = last_name(node)
        return name is not None and bool(_OPTIMIZER_NAME.fullmatch(name))

    def is_loss_call(self, node: ast.AST) -> bool:
        """Whether ``node`` calls a loss: ``criterion(out, y)``, ``loss_fn(...)``, ``F.cross_entropy(...)``,
        ``nn.MSELoss()(...)``."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        q = self.qualname(func)
        if q is not None and q.startswith("torch.nn.functional.") and q.rsplit(".", 1)[1] in _FUNCTIONAL_LOSSES:
            return True
        if isinstance(func, ast.Call):  # nn.CrossEntropyLoss()(out, y)
            inner = self.qualname(func.func) or ""
            return inner.startswith("torch.nn.") and inner.endswith("Loss")
        name = last_name(func)
        if name is None:
            return False
        if _LOSS_FN_NAME.fullmatch(name):
            return True
        for b in self.bindings_of(func):
            if b.kind == "assign" and isinstance(b.value, ast.Call):
                inner = self.qualname(b.value.func) or ""
                if inner.startswith("torch.nn.") and inner.endswith("Loss"):
                    return True
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
                        if b.value is not None:
                            new = names_in(b.value) - names
                            if new:
                                names |= new
                                changed = True
        self._cache[key] = names  # type: ignore[index]
        return names

    def _same_function(self, node: ast.AST, scope: ast.AST) -> bool:
        return self.scope(node) is scope

    # ------------------------------------------------------------------------------ same-file call graph
    def uses_torch(self) -> bool:
        """Whether the file imports torch or a library built on it (lightning, torchvision, transformers ...).
        Rules that recognise models by their names use it to stay silent on Keras, JAX or scikit-learn code."""
        cached = self._cache.get(("uses_torch", 0))  # type: ignore[arg-type]
        if cached is None:
            roots = {q.split(".", 1)[0] for q in self.aliases.values()}
            cached = bool(roots & _TORCH_LIBRARIES)
            self._cache[("uses_torch", 0)] = cached  # type: ignore[index]
        return cached  # type: ignore[return-value]

    def functions_named(self, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """Every function or method of the file with this name (any class, any nesting)."""
        table = self._cache.get(("functions", 0))  # type: ignore[arg-type]
        if table is None:
            table = {}
            for tp in (ast.FunctionDef, ast.AsyncFunctionDef):
                for fn in self.nodes(tp):
                    table.setdefault(fn.name, []).append(fn)  # type: ignore[attr-defined]
            self._cache[("functions", 0)] = table  # type: ignore[index]
        return table.get(name, [])  # type: ignore[union-attr]

    def under_unknown_with(self, node: ast.AST, known: frozenset[str]) -> bool:
        """True when a ``with`` around ``node`` (in its own function) names a context outside ``known``: it
        may switch modes or autograd, so a rule that cannot tell stays silent."""
        for parent in self.ancestors(node):
            if isinstance(parent, DEFINITIONS):
                return False
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                for item in parent.items:
                    expr = item.context_expr
                    func = expr.func if isinstance(expr, ast.Call) else expr
                    if last_name(func) not in known:
                        return True
        return False

    def calls_within(self, container: ast.AST) -> list[ast.Call]:
        """Every call inside ``container`` (nested functions, lambdas and comprehensions included)."""
        return [n for n in ast.walk(container) if isinstance(n, ast.Call)]

    def helpers_called(self, container: ast.AST, depth: int = 3) -> list[ast.AST]:
        """Same-file functions that code in ``container`` calls, followed transitively up to ``depth`` levels:
        ``f(...)``, ``self.f(...)``, ``obj.f(...)`` (any function or method of the file named ``f``)."""
        seen: dict[int, ast.AST] = {}
        frontier = [container]
        for _ in range(depth):
            next_frontier = []
            for node in frontier:
                for call in self.calls_within(node):
                    name = last_name(call.func)
                    if name is None:
                        continue
                    for fn in self.functions_named(name):
                        if id(fn) not in seen and fn is not container:
                            seen[id(fn)] = fn
                            next_frontier.append(fn)
            frontier = next_frontier
            if not frontier:
                break
        return list(seen.values())

    def reaches_call(self, container: ast.AST, predicate: Callable[[ast.Call], bool], depth: int = 3) -> bool:
        """Whether a call satisfying ``predicate`` happens in ``container`` or in a same-file helper it calls
        (transitively, ``depth`` levels): "zeroes its gradients in a helper" counts as zeroing them."""
        for node in (container, *self.helpers_called(container, depth)):
            if any(predicate(call) for call in self.calls_within(node)):
                return True
        return False

    def evaluation_regions(self) -> list[tuple[ast.AST, list[ast.Call]]]:
        """Evaluation loops of the file, each with the model calls it runs: a loop over a validation or test
        loader (``for x, y in val_loader``), or a function named like ``evaluate``/``validate``/``test``
        whose loop runs the model. Methods of ``nn.Module``/Lightning classes, ``*_step`` hooks, and
        ``test_*`` functions of test files are left out. Empty unless the file uses torch."""
        cached = self._cache.get(("evaluations", 0))  # type: ignore[arg-type]
        if cached is not None:
            return cached  # type: ignore[return-value]
        regions: list[tuple[ast.AST, list[ast.Call]]] = []
        if self.uses_torch():
            seen: set[int] = set()
            for tp in (ast.FunctionDef, ast.AsyncFunctionDef):
                for fn in self.nodes(tp):
                    if self._is_evaluation_function(fn):  # type: ignore[arg-type]
                        loops = [self.parent(lp) if isinstance(lp, ast.comprehension) else lp for lp in _loops_of(fn)]
                        calls = [c for loop in loops if loop is not None for c in self._model_calls(loop)]
                        calls = list({id(c): c for c in calls}.values())
                        if calls:
                            regions.append((fn, sorted(calls, key=position)))
                            seen.update(id(c) for c in calls)
            for tp in (ast.For, ast.AsyncFor, ast.comprehension):
                for loop in self.nodes(tp):
                    if self._is_evaluation_loader(loop.iter):  # type: ignore[attr-defined]
                        if isinstance(loop, ast.comprehension):
                            loop = self.parent(loop)  # the comprehension expression
                        calls = [c for c in self._model_calls(loop) if id(c) not in seen]
                        if calls:
                            regions.append((loop, sorted(calls, key=position)))
        self._cache[("evaluations", 0)] = regions  # type: ignore[index]
        return regions

    def _is_evaluation_function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        name = fn.name
        if not _EVAL_FUNCTION.fullmatch(name) or name.endswith("_step"):
            return False
        cls = self.enclosing_class(fn)
        if cls is not None and cls.name in self.module_classes:
            return False
        if name.startswith("test"):
            base = self.path.replace("\\", "/").rsplit("/", 1)[-1]
            if base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py":
                return False
            if any(q.split(".", 1)[0] in ("pytest", "unittest") for q in self.aliases.values()):
                return False
        return True

    def _is_evaluation_loader(self, expr: ast.AST) -> bool:
        for _ in range(3):  # enumerate(val_loader), tqdm(val_loader, ...), iter(...)
            if isinstance(expr, ast.Call) and expr.args and last_name(expr.func) in _LOOP_WRAPPERS:
                expr = expr.args[0]
        if isinstance(expr, ast.Subscript):
            key = expr.slice
            return (isinstance(key, ast.Constant) and isinstance(key.value, str)
                    and bool(_EVAL_WORD.fullmatch(key.value)) and self.loader(expr) is not None)
        name = last_name(expr)
        return name is not None and bool(_EVAL_LOADER.fullmatch(name)) and self.loader(expr) is not None

    def _model_calls(self, region: ast.AST) -> list[ast.Call]:
        """Forward calls ``model(x)`` in a region (nested functions excluded)."""
        found = []
        stack = list(ast.iter_child_nodes(region))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Call) and self.is_model_call(node) and not self.is_loss_call(node):
                found.append(node)
            stack.extend(ast.iter_child_nodes(node))
        return found

    def call_sites(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """Calls of a same-file function by its name: ``f(...)``, ``self.f(...)``, ``obj.f(...)``."""
        return [c for c in self.nodes(ast.Call) if last_name(c.func) == fn.name]  # type: ignore[attr-defined]


_SCOPE_TYPES = frozenset(_SCOPES)
_BINDING_TYPES = frozenset(
    {
        ast.Assign,
        ast.AnnAssign,
        ast.AugAssign,
        ast.For,
        ast.AsyncFor,
        ast.comprehension,
        ast.With,
        ast.AsyncWith,
        ast.NamedExpr,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.Lambda,
        ast.Import,
        ast.ImportFrom,
    }
)
_EVAL_WORD = re.compile(r"val|valid|validation|test|testing|eval|evaluation|dev", re.IGNORECASE)
_EVAL_LOADER = re.compile(
    r"(?:\w*_)?(?:val|valid|validation|test|testing|eval|evaluation|dev)(?:_?\w*)?(?:loader|dl|dataloader|iter)s?"
    r"|(?:val|valid|validation|test|eval|dev)_?(?:dl|loader|dataloader)",
    re.IGNORECASE,
)
_EVAL_FUNCTION = re.compile(
    r"_*(?:run_|do_|model_)?(?:evaluate|evaluation|eval|validate|validation|valid|val|test)"
    r"(?:_(?:epoch|loop|model|one_epoch|once|all|net|network|accuracy|loss|metrics))?"
    r"|_*\w+_(?:evaluate|evaluation|validate|validation|eval)",
)
_LOOP_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "progress_bar", "track", "zip"})
_LOADER_NAME = re.compile(r"\w*loaders?\w*|(?:\w+_)?dls?(?:_\w+)?", re.IGNORECASE)


def _loops_of(fn: ast.AST) -> list[ast.AST]:
    """Loops of a function's own body (nested functions excluded)."""
    found = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _is_model_name(name: str) -> bool:
    return bool(_MODEL_NAME.fullmatch(name) or _MODEL_CAMEL.fullmatch(name))


def _is_loader_name(name: str) -> bool:
    return bool(_LOADER_NAME.fullmatch(name)) and "download" not in name.lower()


# Fields that never hold nodes worth visiting: operators and load/store contexts are shared singletons.
_SKIP_FIELDS = frozenset({"ctx", "op", "ops", "type_ignores"})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {ast.Name: (), ast.Constant: ()}


def _own_children(scope: ast.AST) -> set[int]:
    """ids of the direct children of a scope node that run inside the scope."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {id(c) for c in scope.body} | {id(scope.args)}
    if isinstance(scope, ast.Lambda):
        return {id(scope.body), id(scope.args)}
    if isinstance(scope, ast.ClassDef):
        return {id(c) for c in scope.body}
    return {id(c) for c in ast.iter_child_nodes(scope)}


def _in_own_scope(scope: ast.AST, child: ast.AST) -> bool:
    """Whether ``child`` (a direct child of the scope node) runs inside that scope rather than around it."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return child in scope.body or child is scope.args
    if isinstance(scope, ast.Lambda):
        return child is scope.body or child is scope.args
    if isinstance(scope, ast.ClassDef):
        return child in scope.body
    return True


def _inside(node: ast.AST, statements: list[ast.stmt]) -> bool:
    return any(node is s for s in statements)


_NO_GRAPH_METHODS = frozenset({"item", "tolist", "detach", "argmax", "argmin", "numpy"})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)


def names_in(node: ast.AST, *, returned: bool = False) -> set[str]:
    """Dotted names in an expression. For a returned value, only those whose graph can reach the caller:
    not inside comprehensions or lambdas, nor under ``.item()``/``.argmax()``/``.detach()``."""
    found = set()
    stack = [node]
    while stack:
        sub = stack.pop()
        if returned and sub is not node and isinstance(sub, _COMPREHENSIONS):
            continue
        if returned and isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and (
            sub.func.attr in _NO_GRAPH_METHODS
        ):
            stack.extend(sub.args)
            continue
        if isinstance(sub, (ast.Name, ast.Attribute)):
            key = dotted(sub)
            if key is not None:
                found.add(key)
        stack.extend(ast.iter_child_nodes(sub))
    return found
