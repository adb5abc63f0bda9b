"""The roles of variables: DataLoaders, modules and models, optimizers, losses."""

from __future__ import annotations

import ast
import re

from trainwise.doctor.context.syntax import (
    _LOADER_NAME,
    _MODEL_CAMEL,
    _MODEL_NAME,
    Binding,
    LoaderInfo,
    dotted,
    has_star_kwargs,
    is_const,
    keyword,
    last_name,
    method_call,
    walk_own,
)

_LOADER_CLASSES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})

# Methods only an nn.Module has (between them): a receiver of one is a module.
_MODULE_METHODS = frozenset(
    {"parameters", "named_parameters", "modules", "named_modules", "children", "named_children", "buffers"}
)

# Methods that, on a name the file also calls like a function (``predictor(x)``), prove a module whatever its
# class: a model built by ``getattr(models, arch)()``, ``build_model(cfg)`` or a registry ``MODELS[name](...)``.
# ``.to()`` is left out (a diffusers pipeline is called and moved, and runs its own no-grad), as is ``.fit()``.
_CALLED_MODULE_METHODS = frozenset({"train", "eval", "state_dict", "load_state_dict", "cuda", "requires_grad_"})

# Members of every nn.Module that run no forward: ``model.state_dict()`` is no call of the model.
_MODULE_API = frozenset(
    {"parameters", "named_parameters", "modules", "named_modules", "children", "named_children", "buffers",
     "named_buffers", "state_dict", "load_state_dict", "train", "eval", "to", "cuda", "cpu", "float", "half",
     "double", "bfloat16", "type", "apply", "zero_grad", "requires_grad_", "add_module", "get_submodule",
     "get_parameter", "extra_repr", "share_memory", "register_buffer", "register_parameter", "register_module"}
)

_MODULE_RETURNING = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval"})

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

# Words of a loop's iterable or target that say it goes over data (batches, samples, steps), not over a model's
# structure (its layers, feature levels, heads).
_DATA_WORDS = frozenset(
    {"loader", "loaders", "dataloader", "dataloaders", "dl", "dls", "data", "dataset", "datasets", "ds", "batch",
     "batches", "minibatch", "minibatches", "sample", "samples", "example", "examples", "episode", "episodes",
     "step", "steps", "iter", "iters", "iteration", "iterations", "epoch", "epochs", "iterator", "stream", "train",
     "training", "val", "valid", "validation", "test", "testing", "eval", "trainset", "testset", "valset"}
)

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")

_ITERABLE_WRAPPERS = frozenset({"enumerate", "zip", "tqdm", "iter", "reversed", "sorted", "list", "islice",
                                "progress_bar", "track", "range", "len"})

_CLASS_DEPTH = 4  # base classes followed to find nn.Module
_CLASS_NAME = re.compile(r"_*[A-Z]\w*[a-z]\w*")  # ResNet, OutputModel: a class by its spelling (G, D, VGG: unsure)


def _is_model_name(name: str) -> bool:
    return bool(_MODEL_NAME.fullmatch(name) or _MODEL_CAMEL.fullmatch(name))

def _is_loader_name(name: str) -> bool:
    return bool(_LOADER_NAME.fullmatch(name)) and "download" not in name.lower()


class Roles:
    """The roles of variables: DataLoaders, modules and models, optimizers, losses. (a part of :class:`Context`)."""

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
        # the answer depends on the name's bindings (and its name, the same for all of them): once per list
        return self.memo_bindings("loader", bindings, lambda: self._loader_from(node, bindings))

    def _loader_from(self, node: ast.Name | ast.Attribute, bindings: list[Binding]) -> LoaderInfo | None:
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
        in_progress = self._modules_in_progress
        if id(node) in in_progress:
            self._module_cycles += 1  # asked again while answering it: answers found meanwhile are partial
            result = self._is_module(node, depth)
        else:
            in_progress.add(id(node))
            try:
                result = self._is_module(node, depth)
            finally:
                in_progress.discard(id(node))
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
            if key in self.called and any(key in self.method_receivers.get(m, ()) for m in _CALLED_MODULE_METHODS):
                return True  # a model of unknown class, called and used as a module
            if (any(key in self.method_receivers.get(m, ()) for m in ("eval", "train"))
                    and any(key in self.method_receivers.get(m, ()) for m in ("load_state_dict", "state_dict"))):
                return True  # a mode and a state dict: a module of unknown class (`agent = Model(env)`)
        if self.qualname(node) is not None:
            return False  # an imported name (torch.Generator, nn.Linear) is a function or class, not a model
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name == "self" and isinstance(node, ast.Name):
            cls = self.enclosing_class(node)
            return cls is not None and cls.name in self.module_classes
        if isinstance(node, ast.Attribute) and self._own_method(node):
            return False
        if _is_model_name(name):
            return True
        if isinstance(node, ast.Name) or node.attr in _PARAMETER_ATTRS:
            return False
        if not self.is_module(node.value, depth + 1):
            return False
        return bool(_SUBMODULE_ATTR.fullmatch(node.attr)) or self._submodule_of_project(node.attr)

    def _own_method(self, node: ast.Attribute) -> bool:
        """Whether ``self.name`` names a method its enclosing class defines (not a property): a bound method,
        never a module, whatever its name (``self._model_classes(...)``)."""
        if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            return False
        cls = self.enclosing_class(node)
        return cls is not None and any(
            isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == node.attr
            and not any(last_name(d) in ("property", "cached_property") for d in f.decorator_list)
            for f in cls.body)  # type: ignore[attr-defined]

    def _submodule_of_project(self, name: str) -> bool:
        """Whether every module class of the project that defines ``name`` assigns it a module
        (``self.outc = OutConv(64, n_classes)``): then ``model.outc`` is a module whatever its name."""
        kinds = self.program.member_kinds(self, name) if self.program is not None else self.member_kinds_here(name)
        return kinds == {"submodule"}

    def _module_from_bindings(self, node: ast.AST, depth: int) -> bool | None:
        """The verdict of a name's bindings (all say module, or all say not), computed once per list of
        bindings and depth unless the answer went through a question still being answered (a cycle)."""
        bindings = self.bindings_of(node)
        if not bindings:
            return None
        key = (("module_from_bindings", depth), id(bindings))
        known = self._per_bindings.get(key)
        if known is not None and known[0] is bindings:
            return known[1]  # type: ignore[return-value]
        cycles = self._module_cycles
        verdict = self._module_verdict(bindings, depth)
        if cycles == self._module_cycles:
            self._per_bindings[key] = (bindings, verdict)
        return verdict

    def _module_verdict(self, bindings: list[Binding], depth: int) -> bool | None:
        verdicts = set()
        for b in bindings:
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
        if isinstance(func, ast.Name):
            local = self.class_named(func.id, value)
            if local is not None:  # a class of this file: a module exactly when it subclasses nn.Module
                return self.is_module_class(local)
        if self.program is not None and isinstance(func, (ast.Name, ast.Attribute)):
            return self._class_of_run_is_module(func)  # Agent(...), PyTorchModel(...) from another file
        return None

    def _class_of_run_is_module(self, func: ast.expr, depth: int = 1) -> bool | None:
        """Whether the class of another file of the run that ``func`` names subclasses ``nn.Module`` (its bases
        followed from ``depth``); None when ``func`` names no class of the run. Each class answered once a run."""
        program = self.program
        assert program is not None
        symbol = program.resolve(self, func)
        if symbol is None or symbol.name is None or "." in symbol.name:
            return None
        if program.known_module_class(symbol):
            return True

        def answer() -> bool | None:
            found = program.class_of(self, func)
            return None if found is None else found[0].is_module_class(found[1], depth)

        return program.remember(("module class", symbol.path, symbol.name, depth), answer)

    def is_module_class(self, cls: ast.ClassDef, depth: int = 0) -> bool:
        """Whether a class of this file subclasses ``nn.Module``: as the file knows it, or through base classes
        of this file or of other files of the run (each class of the run answered once per run)."""
        if cls.name in self.module_classes:
            return True
        if depth >= _CLASS_DEPTH:
            return False
        for base in cls.bases:
            if isinstance(base, ast.Name):
                local = self.class_named(base.id, cls)
                if local is not None and local is not cls:
                    if self.is_module_class(local, depth + 1):
                        return True
                    continue
            if self.program is not None and self._class_of_run_is_module(base, depth + 1):
                return True
        return False

    def is_new_object(self, node: ast.AST, at: ast.AST) -> bool:
        """Whether a name holds an object built where it is bound and never anything else: ``copy =
        Net(...)``, ``copy = copy.deepcopy(model)`` (a class called, or a deep copy), not a module passed in,
        returned by a helper or moved with ``.to()`` from another name. A mode set on such an object leaves
        every other module as it was."""
        if not isinstance(node, ast.Name):
            return False
        found = self.lookup(node.id, at)
        return bool(found) and all(b.kind == "assign" and not b.unpacked and self._constructs(b.value) for b in found)

    def _constructs(self, value: ast.AST | None) -> bool:
        """``Net(...)`` (a name spelled like a class) or ``copy.deepcopy(...)``."""
        if not isinstance(value, ast.Call):
            return False
        if self.qualname(value.func) == "copy.deepcopy":
            return True
        name = last_name(value.func)
        return name is not None and bool(_CLASS_NAME.fullmatch(name))

    def is_model_call(self, node: ast.AST) -> bool:
        """Whether ``node`` is a forward call ``model(x)`` of a module, or of a member of a module that runs one
        (``model.forward(x)``, ``agent.get_value(obs)``, ``clip_model.visual(images)``: see
        :meth:`member_kinds_here`). A call of a name spelled like a class (``ResNet(...)``,
        ``clearml.OutputModel(...)``) that the file never assigns nor uses as a module constructs an object: it
        runs no forward."""
        if not isinstance(node, ast.Call):
            return False
        if not self.is_module(node.func):
            return self._forward_member_call(node)
        name = last_name(node.func)
        if name is not None and _CLASS_NAME.fullmatch(name):  # G_net = Generator(); G_net(z) is a forward
            key = dotted(node.func)
            return any(b.kind in ("assign", "walrus", "with", "for") for b in self.bindings_of(node.func)) or any(
                key in self.method_receivers.get(m, ()) for m in _MODULE_METHODS)
        return True

    def called_module(self, call: ast.Call) -> ast.expr:
        """The module a model call runs: ``model`` for ``model(x)``, also for ``model.forward(x)`` and
        ``agent.get_value(obs)`` (a member that runs one)."""
        func = call.func
        if isinstance(func, ast.Attribute) and not self.is_module(func) and self.is_module(func.value):
            return func.value
        return func

    def _forward_member_call(self, call: ast.Call) -> bool:
        """``module.name(...)`` where ``name`` is ``forward``, or where every module class of the project that
        defines ``name`` makes it a forward (a submodule, a method that runs one): the receiver's own class
        may be unknown (a parameter, a library loader's result), its members are looked up by name."""
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr in _MODULE_API or func.attr.startswith("__"):
            return False
        if not self.is_module(func.value):
            return False
        if func.attr == "forward":
            return True
        kinds = self.program.member_kinds(self, func.attr) if self.program is not None else self.member_kinds_here(
            func.attr)
        return bool(kinds) and kinds <= {"forward", "submodule"}

    def member_kinds_here(self, name: str) -> frozenset[str]:
        """What the ``nn.Module`` classes of this file define as ``name``: ``"submodule"`` for a module attribute
        (``self.visual = VisionTransformer(...)``), ``"forward"`` for a method that calls a module with autograd on,
        ``"no_grad"`` for a method that turns autograd off (decorated, or its whole body under ``no_grad``),
        ``"trains"`` for a method that computes or applies gradients itself, ``"other"`` for anything else (a
        method that calls no module, a tensor or number attribute)."""
        key = ("member", name)
        cached = self._cache.get(key)  # type: ignore[arg-type]
        if cached is not None:
            return cached  # type: ignore[return-value]
        self._cache[key] = frozenset()  # type: ignore[index]  # a method that calls itself: no answer yet
        kinds: set[str] = set()
        for cls in self.nodes(ast.ClassDef):
            if not self.is_module_class(cls):  # type: ignore[arg-type]
                continue
            for stmt in cls.body:  # type: ignore[attr-defined]
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                    kinds.add(self._method_kind(stmt))
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in walk_own(stmt.body):
                        if isinstance(node, (ast.Assign, ast.AnnAssign)):
                            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                            for target in targets:
                                if (isinstance(target, ast.Attribute) and target.attr == name
                                        and isinstance(target.value, ast.Name) and target.value.id == "self"):
                                    kinds.add("submodule" if self.is_module(target) else "other")
        found = frozenset(kinds)
        self._cache[key] = found  # type: ignore[index]
        return found

    def kept_arguments_here(self, name: str) -> frozenset[str]:
        """What the methods called ``name`` of this file's classes do with their arguments: for each definition,
        the positions (``self`` not counted, joined by commas) of the parameters it adds to its object's state
        (``self.sum += val * n``, ``self.totals[k] += losses[k]``, ``self.history.append(val)``), state that
        outlives the call; ``"-"`` for one that keeps none. Empty when no class of the file defines ``name``."""
        key = ("kept", name)
        cached = self._cache.get(key)  # type: ignore[arg-type]
        if cached is not None:
            return cached  # type: ignore[return-value]
        kept: set[str] = set()
        for cls in self.nodes(ast.ClassDef):
            for fn in cls.body:  # type: ignore[attr-defined]
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == name:
                    kept.add(",".join(sorted(_kept_parameters(fn))) or "-")
        result = frozenset(kept)
        self._cache[key] = result  # type: ignore[index]
        return result

    def _method_kind(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
        if self.grad_disabled(fn.body[0]) if fn.body else False:  # type: ignore[attr-defined]
            return "no_grad"
        if any(method_call(n, "backward", "manual_backward", "zero_grad") or (
                method_call(n, "step") and self.is_optimizer(n.func.value)) for n in walk_own(fn.body)):  # type: ignore[attr-defined]
            return "trains"  # discriminator.update(batch): forwards, backward and step of its own
        for node in walk_own(fn.body):
            if isinstance(node, ast.Call) and self.is_model_call(node) and not self.grad_disabled(node):  # type: ignore[attr-defined]
                return "forward"
        return "other"

    def iterates_over_data(self, loop: ast.AST) -> bool:
        """Whether a loop goes over data rather than over a model's structure: a ``while`` loop, a loop over a
        loader, a loop that calls ``next()``, or one whose iterable or target is named for data (``batches``,
        ``range(len(dataset))``, ``for step in range(num_steps)``). A loop over ``enumerate(feature_maps)``,
        ``self.layers`` or ``range(self.num_levels)`` is not: its length is the model's, not the run's."""
        if isinstance(loop, ast.While):
            return True
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            return False
        for node in ast.walk(loop):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next":
                return True
        iterables = [loop.iter]
        for _ in range(4):  # enumerate(tqdm(loader)), zip(loader_a, loader_b), range(len(dataset))
            unwrapped = []
            for expr in iterables:
                if isinstance(expr, ast.Call) and last_name(expr.func) in _ITERABLE_WRAPPERS:
                    unwrapped.extend(expr.args)
                else:
                    unwrapped.append(expr)
            iterables = unwrapped
        if any(self.loader(expr) is not None for expr in iterables):
            return True
        for part in (loop.iter, loop.target):
            for node in ast.walk(part):
                name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
                if name is not None and any(w.lower() in _DATA_WORDS for w in _WORD.findall(name)):
                    return True
        return False

    def is_optimizer(self, node: ast.AST) -> bool:
        """Whether ``node`` is an optimizer: assigned from ``torch.optim.<Class>(...)`` or named like one."""
        bindings = self.bindings_of(node)
        if self.memo_bindings("optimizer", bindings, lambda: any(_builds_optimizer(self, b) for b in bindings)):
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
        bindings = self.bindings_of(func)
        return self.memo_bindings("loss", bindings, lambda: any(_builds_loss(self, b) for b in bindings))


def _builds_optimizer(roles: Roles, b: Binding) -> bool:
    """``x = torch.optim.<Class>(...)`` (not a scheduler nor an SWA helper)."""
    if b.kind == "assign" and isinstance(b.value, ast.Call):
        q = roles.qualname(b.value.func) or ""  # type: ignore[attr-defined]
        return q.startswith("torch.optim.") and ".lr_scheduler" not in q and ".swa_utils" not in q
    return False


def _builds_loss(roles: Roles, b: Binding) -> bool:
    """``x = nn.<Name>Loss(...)``."""
    if b.kind == "assign" and isinstance(b.value, ast.Call):
        inner = roles.qualname(b.value.func) or ""  # type: ignore[attr-defined]
        return inner.startswith("torch.nn.") and inner.endswith("Loss")
    return False


def _kept_parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Positions (``self`` not counted) of the parameters a method adds to ``self``'s state as they are: the
    value of ``self.<...> += ...`` or of ``self.<...>.append(...)`` names the parameter (or an item of it) other
    than through ``.item()``, ``.detach()``, ``float()`` or the like."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)][1:]
    kept: set[str] = set()
    for node in walk_own(fn.body):
        value: ast.AST | None = None
        target: ast.AST | None = None
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            target, value = node.target, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
              and len(node.args) == 1):
            target, value = node.func.value, node.args[0]
        if target is None or value is None:
            continue
        root = target
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if not (isinstance(root, ast.Name) and root.id == "self" and target is not root):
            continue
        for position, param in enumerate(params):
            if _names_raw(value, param):
                kept.add(str(position))
    return kept


def _names_raw(value: ast.AST, name: str) -> bool:
    """Whether ``value`` reads ``name`` other than through a call that turns a tensor into a number or a
    detached tensor (``val.item()``, ``float(val)``, ``val.detach()``)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in _DETACHING) or (
                    isinstance(func, ast.Name) and func.id in ("float", "int", "round", "len", "str", "bool")):
                continue
        if isinstance(node, ast.Name) and node.id == name:
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


_DETACHING = frozenset({"item", "detach", "tolist", "numpy", "cpu_numpy"})
