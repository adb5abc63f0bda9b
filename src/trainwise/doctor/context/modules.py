"""What modules are made of: whether the module at a dotted path, a value, a class or a builder holds
BatchNorm (or InstanceNorm that tracks running statistics), as far as the code shows (TW108).

Known: torchvision and timm CNNs with BatchNorm (and which of their children hold it), ``torch.hub.load`` of
``pytorch/vision``, ``nn.BatchNorm*``, ``nn.Sequential``/``ModuleList`` of those, classes and builders of the
file that build them, and, through the program, classes and builders of the other files of the run. One
``Norms`` per file (``ctx.analysis(Norms)``); every answer leans towards "no".
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from trainwise.doctor.context.syntax import argument, bound_value, init_of, is_const, is_param, keyword, method_call
from trainwise.doctor.context.values import Built, built_by, given_to

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

_BN = re.compile(r"(?:Sync)?BatchNorm(?:[123]d)?|LazyBatchNorm[123]d")
_IN = re.compile(r"(?:Lazy)?InstanceNorm[123]d")
# torchvision constructors of CNNs with BatchNorm, and their children that hold it (None: the whole model).
_TV_BN = re.compile(
    r"resnet\d+|resnext\d+_\w+|wide_resnet\d+_\d|densenet\d+|efficientnet_(?:b\d|v2_[sml])|mobilenet_v[23]\w*|"
    r"regnet_[xy]_\w+|vgg\d+_bn|inception_v3|googlenet|shufflenet_v2_\w+|mnasnet\w*"
)
_BN_CHILDREN = {
    "res": {"bn1", "layer1", "layer2", "layer3", "layer4"},
    "wid": {"bn1", "layer1", "layer2", "layer3", "layer4"},
    "reg": {"stem", "trunk_output"},
}
_DEFAULT_CHILDREN = {"features"}
# timm names of BatchNorm CNNs (resnetv2 and *_gn variants use GroupNorm, convnext LayerNorm: left out).
_TIMM_BN = re.compile(r"(?:resnet\d|resnext|seresne|densenet|efficientnet|tf_efficientnet|mobilenetv[23]|regnet|"
                      r"vgg\d+_bn)\w*")
# Parameter names of a classification head (``fc``, ``classifier``, ``head``): frozen all but these.
HEAD_WORD = re.compile(r"fc\d*|classifier|heads?|linear\d*|last_linear|logits|out|output|cls|lm_head|"
                       r"(?:fc|head|classifier)_\w+")
_MAX_SITES = 32  # constructions of a class followed, at most
_DEPTH = 8  # values, classes and builders followed (a model class holding a backbone class holding blocks)
_RESNETS = ("res", "wid")  # ctor[:3] of torchvision ResNets: BatchNorm in conv1/bn1 and every layer


class Norms:
    """Which modules of a file hold BatchNorm (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._builds: dict[tuple[int, int], bool] = {}  # (id(container), depth) -> builds BatchNorm

    def has_bn(self, path: str, at: ast.AST, excluded: set[str] | frozenset[str] = frozenset()) -> bool:
        """Whether the script knows that the module at ``path`` holds BatchNorm (or tracking InstanceNorm)
        outside its ``excluded`` children."""
        root, *attrs = path.split(".")
        value: ast.AST | None
        if root == "self":
            cls = self.ctx.enclosing_class(at)
            if cls is None or not attrs:
                return False
            if cls.name in self.ctx.module_classes:
                return self.class_has_bn(cls, attrs, 0, None, excluded)
            given = given_to(self.ctx, cls, attrs[0])
            if given:  # a trainer's model: what its constructions, in this file or another, pass
                return any(there.analysis(type(self)).value_has_bn(arg, attrs[1:], call, 1, excluded)
                           for there, arg, call in given)
            value, attrs = self.ctx.self_value(cls, attrs[0]), attrs[1:]
        else:
            value = self.ctx.value_of(ast.Name(id=root, ctx=ast.Load()), at)
            if value is None or not self.value_has_bn(value, attrs, at, 0, excluded):
                return self._built_has_bn(built_by(self.ctx, ast.Name(id=root, ctx=ast.Load()), at), attrs, excluded)
        return value is not None and self.value_has_bn(value, attrs, at, 0, excluded)

    def _built_has_bn(self, built: Built | None, attrs: list[str], excluded: set[str] | frozenset[str],
                      depth: int = 1) -> bool:
        """What builds the object (a factory, a registry, a class of another file: ``values.built_by``) holds
        BatchNorm at ``attrs``."""
        if built is None:
            return False
        norms = built.ctx.analysis(type(self))
        if built.cls is not None:
            return norms.class_has_bn(built.cls, attrs, depth, None, excluded)
        return norms.value_has_bn(built.node, attrs, built.node, depth, excluded)

    def value_has_bn(self, value: ast.AST, attrs: list[str], at: ast.AST, depth: int,
                      excluded: set[str] | frozenset[str] = frozenset()) -> bool:
        if depth > _DEPTH:
            return False
        if isinstance(value, ast.Name):
            inner = self.ctx.value_of(value, at)
            if inner is not None and self.value_has_bn(inner, attrs, at, depth + 1, excluded):
                return True
            if inner is None and self._built_has_bn(built_by(self.ctx, value, at), attrs, excluded):
                return True  # net = restore(Net(), path): what builds it, through the functions that hand it back
            return not attrs and not excluded and isinstance(inner, (ast.List, ast.Tuple)) and any(
                self.value_has_bn(item, [], call, depth + 1) for call in self._added_to(value, at)
                for item in call.args)  # layers = [stem]; layers.append(Block(...)); nn.Sequential(*layers)
        if isinstance(value, (ast.List, ast.Tuple)):
            return not attrs and not excluded and any(self.value_has_bn(item, [], at, depth + 1) for item in value.elts)
        if isinstance(value, ast.Subscript):
            return not attrs and not excluded and self._children_slice_has_bn(value, at, depth)
        if isinstance(value, ast.Attribute):  # features = models.vgg16_bn(weights=...).features
            return self.value_has_bn(value.value, [value.attr, *attrs], at, depth + 1, excluded)
        if not isinstance(value, ast.Call):
            return False
        q = self.ctx.qualname(value.func) or ""
        ctor = None
        if q.startswith("torchvision.models."):
            ctor = q.rsplit(".", 1)[1]
        elif q == "torch.hub.load" and len(value.args) >= 2:
            repo, entry = self.ctx.constant(value.args[0]), self.ctx.constant(value.args[1])
            if isinstance(repo, str) and repo.split(":")[0] == "pytorch/vision" and isinstance(entry, str):
                ctor = entry
        if ctor is not None:
            if not _TV_BN.fullmatch(ctor):
                return False
            children = _BN_CHILDREN.get(ctor[:3], _DEFAULT_CHILDREN)
            if not attrs:
                return not excluded or bool(children - excluded)
            return attrs[0] in children and not excluded
        if q == "timm.create_model":
            arch = value.args[0] if value.args else getattr(keyword(value, "model_name"), "value", None)
            name = self.ctx.constant(arch) if arch is not None else ...
            if not isinstance(name, str):
                return False
            name = name.split("/")[-1].split(".")[0]
            return (not attrs and bool(_TIMM_BN.fullmatch(name)) and "_gn" not in name and "resnetv2" not in name
                    and all(HEAD_WORD.fullmatch(e) for e in excluded))
        library = self._library_model(q, value, attrs)
        if library is not None:
            return library
        if q.startswith("torch.nn."):
            last = q.rsplit(".", 1)[1]
            if attrs or excluded:
                return False
            if self._layer(last, value):
                return True
            if last in ("Sequential", "ModuleList"):
                items = [a.value if isinstance(a, ast.Starred) else a for a in value.args]
                items = [e for a in items for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
                return any(self.value_has_bn(a, [], at, depth + 1) for a in items)
            return False
        if isinstance(value.func, ast.Name):
            cls = self.ctx.class_named(value.func.id, at)
            if cls is not None:
                return self.class_has_bn(cls, attrs, depth, value, excluded)
        built = built_by(self.ctx, value, at)  # restore(Net(), path): a function of the run that hands it back
        if built is not None and built.node is not value and self._built_has_bn(built, attrs, excluded, depth + 1):
            return True
        if isinstance(value.func, ast.Name):
            helpers = [fn for fn in self.ctx.functions_named(value.func.id) if self.ctx.enclosing_class(fn) is None]
            if len(helpers) == 1 and not attrs and not excluded:  # make_layers(cfg): a builder of this file
                return self.builds_bn(helpers[0], depth)
        return self._elsewhere_has_bn(value, attrs, depth, excluded)

    def _layer(self, name: str, call: ast.Call) -> bool:
        """Whether ``torch.nn.<name>(...)`` is a layer this question looks for: BatchNorm, or InstanceNorm that
        tracks running statistics."""
        if _BN.fullmatch(name):
            return True
        tracking = getattr(keyword(call, "track_running_stats"), "value", None)
        return bool(_IN.fullmatch(name)) and is_const(tracking, True)

    def _library_model(self, q: str, call: ast.Call, attrs: list[str]) -> bool | None:
        """What a model of another library (``q``, the call's qualified name) holds, when this question knows
        more of it than torchvision's and timm's BatchNorm (None: not known here)."""
        return None

    def _elsewhere_has_bn(self, value: ast.Call, attrs: list[str], depth: int,
                          excluded: set[str] | frozenset[str]) -> bool:
        """A class or builder of another file of the run (``YoloBody`` imported from ``nets.yolo``)."""
        program = self.ctx.program
        if program is None:
            return False
        found = program.class_of(self.ctx, value.func)
        if found is not None:
            return found[0].analysis(type(self)).class_has_bn(found[1], attrs, depth + 1, None, excluded)
        callee = program.callee(self.ctx, value)
        if callee is not None and not attrs and not excluded:
            return callee[0].analysis(type(self)).builds_bn(callee[1], depth + 1)
        return False

    def _added_to(self, name: ast.Name, at: ast.AST) -> list[ast.Call]:
        """``name.append(...)``, ``.extend(...)``, ``.insert(...)`` in the function that holds ``at``."""
        return [c for c in self.ctx.calls_within(self.ctx.scope(at))
                if method_call(c, "append", "extend", "insert") and isinstance(c.func.value, ast.Name)  # type: ignore[attr-defined]
                and c.func.value.id == name.id]  # type: ignore[attr-defined]

    def _children_slice_has_bn(self, expr: ast.Subscript, at: ast.AST, depth: int) -> bool:
        """``list(resnet.children())[:-1]``: the first children of a torchvision CNN with BatchNorm (its stem
        for a ResNet, ``features`` for the others) are kept."""
        sl = expr.slice
        if not isinstance(sl, ast.Slice) or sl.step is not None or not (sl.lower is None or is_const(sl.lower, 0)):
            return False
        inner = expr.value
        if isinstance(inner, ast.Name):
            inner = self.ctx.value_of(inner, at)  # type: ignore[assignment]
        if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in ("list", "tuple")
                and len(inner.args) == 1):
            inner = inner.args[0]
        if not method_call(inner, "children") or inner.args or not isinstance(inner.func.value, ast.Name):  # type: ignore[attr-defined]
            return False
        upper = sl.upper
        stop = (-upper.operand.value if isinstance(upper, ast.UnaryOp) and isinstance(upper.op, ast.USub)  # type: ignore[attr-defined]
                and isinstance(upper.operand, ast.Constant) else getattr(upper, "value", None))
        if not isinstance(stop, int) or isinstance(stop, bool):
            return False
        source = self.ctx.value_of(inner.func.value, at)  # type: ignore[attr-defined]
        q = self.ctx.qualname(source.func) if isinstance(source, ast.Call) else None
        if q is None or not q.startswith("torchvision.models.") or not _TV_BN.fullmatch(q.rsplit(".", 1)[1]):
            return False
        if q.rsplit(".", 1)[1][:3] in _RESNETS:
            return -8 <= stop <= -1 or stop >= 2
        return stop == -1 or stop >= 1

    def class_has_bn(self, cls: ast.ClassDef, attrs: list[str], depth: int, ctor: ast.Call | None = None,
                      excluded: set[str] | frozenset[str] = frozenset()) -> bool:
        init = init_of(cls)
        if init is None:
            return False
        if not attrs:
            names = {b.split(".", 1)[1] for b in self.ctx.attr_bindings if b.startswith("self.") and b.count(".") == 1
                     and any(self.ctx.scope(x.stmt) is init for x in self.ctx.attr_bindings[b])}
            if excluded:  # the class's parts, but those unfrozen again
                return any(self.class_has_bn(cls, [n], depth, ctor) for n in sorted(names - excluded))
            return self.builds_bn(cls, depth) or (
                ctor is not None and any(self.class_has_bn(cls, [n], depth, ctor) for n in sorted(names))
            )
        for b in self.ctx.attr_bindings.get(f"self.{attrs[0]}", []):
            value: ast.AST | None = bound_value(b) if b.kind == "assign" else None
            if self.ctx.scope(b.stmt) is not init or value is None:
                continue
            where: ast.AST = b.stmt
            if isinstance(value, ast.Name) and is_param(init, value.id):
                if ctor is None:
                    continue
                value, where = argument(init, value.id, ctor, method=True), ctor  # Classifier(resnet18(...), 10)
            if value is not None and self.value_has_bn(value, attrs[1:], where, depth + 1, excluded):
                return True
        return False

    def builds_bn(self, container: ast.AST, depth: int) -> bool:
        """Whether code in ``container`` constructs BatchNorm (or a known BatchNorm model, or a class or
        builder of the file that does); memoised, a cycle (a class building itself) counts as no."""
        key = (id(container), depth)
        found = self._builds.get(key)
        if found is None:
            self._builds[key] = False
            found = self._builds[key] = any(self.value_has_bn(call, [], call, depth + 1)
                                            for call in self.ctx.calls_within(container))
        return found


# Hugging Face classes whose released checkpoints keep dropout on (0.1) in training: T5 and its multilingual
# variants, BERT and its family, BART, GPT-2 (CLIP, ViT, LLaMA and Whisper default to no dropout: left out).
_HF_DROPOUT_CLASS = re.compile(r"(?:(?:U?M)?T5|Bert|Roberta|XLMRoberta|DistilBert|M?Bart|GPT2|Electra|Deberta(?:V2)?|"
                               r"MPNet|Camembert)(?:Model|EncoderModel|LMHeadModel|For\w+)")
_HF_DROPOUT_CHECKPOINT = re.compile(r"(?:flan-)?(?:u?m)?t5(?:-v1_1)?-\w+|(?:distil)?bert-\w+.*|(?:xlm-)?roberta-\w+.*|"
                                    r"m?bart-\w+.*|gpt2(?:-\w+)?|electra-\w+.*|deberta-\w+.*|(?:all-)?mpnet-\w+.*")
_DROPOUT = re.compile(r"(?:Alpha|FeatureAlpha)?Dropout(?:[123]d)?|Transformer(?:Encoder|Decoder)?(?:Layer)?")


class ModeLayers(Norms):
    """Which modules hold a layer whose forward depends on train/eval mode: BatchNorm (``Norms``) or dropout
    with a rate that is not zero (``nn.Dropout``, torch's Transformer layers, Hugging Face text encoders whose
    checkpoints train with dropout). One per file (``ctx.analysis(ModeLayers)``); every answer leans to "no"."""

    def _layer(self, name: str, call: ast.Call) -> bool:
        if super()._layer(name, call):
            return True
        if not _DROPOUT.fullmatch(name):
            return False
        rate = keyword(call, "dropout" if name.startswith("Transformer") else "p")
        given = rate.value if rate is not None else (call.args[0] if call.args and "Dropout" in name else None)
        return not (is_const(given, 0) or is_const(given, 0.0))

    def _library_model(self, q: str, call: ast.Call, attrs: list[str]) -> bool | None:
        parts = q.split(".")
        if parts[0] != "transformers" or len(parts) < 2:
            return None
        if _HF_DROPOUT_CLASS.fullmatch(parts[1]):
            return not attrs
        if parts[1].startswith("Auto") and call.args:
            name = self.ctx.constant(call.args[0])
            return not attrs and isinstance(name, str) and bool(
                _HF_DROPOUT_CHECKPOINT.fullmatch(name.rsplit("/", 1)[-1].lower()))
        return False


# Layers whose forward does not depend on train/eval mode (InstanceNorm normalises each sample by its own
# statistics in train mode, as in training: eval would switch a tracking one to running averages).
_MODE_FREE_LAYERS = re.compile(
    r"Conv(?:Transpose)?[123]d|Linear|Bilinear|Embedding|EmbeddingBag|Identity|Flatten|Unflatten|Sequential|"
    r"ModuleList|ModuleDict|ParameterList|ParameterDict|Parameter|(?:Leaky)?ReLU6?|PReLU|R?ReLU|[CS]?ELU|GELU|SiLU|Mish|"
    r"Sigmoid|Tanh|Softmax2?d?|LogSoftmax|Softplus|Hardswish|Hardsigmoid|Hardtanh|Softsign|(?:Adaptive)?(?:Max|Avg)"
    r"Pool[123]d|Upsample\w*|PixelShuffle|PixelUnshuffle|(?:Zero|Reflection|Replication|Constant)Pad[123]d|"
    r"LayerNorm|GroupNorm|RMSNorm|LocalResponseNorm|(?:Lazy)?InstanceNorm[123]d"
)
_MODE_WORD = re.compile(r"dropout|Dropout\w*|BatchNorm\w*|batch_norm|training|RNN|LSTM|GRU|Transformer\w*|"
                        r"MultiheadAttention|scaled_dot_product_attention")
_BUILTINS = frozenset({"super", "range", "len", "int", "float", "list", "tuple", "dict", "zip", "enumerate", "min",
                       "max", "sum", "isinstance", "getattr", "setattr", "hasattr", "print", "round", "abs", "str"})


def mode_free_class(ctx: Context, cls: ast.ClassDef, depth: int = 0) -> bool:
    """Whether a module class of the run behaves the same in train and eval mode, as far as the code shows:
    every layer it builds is known and mode-free (convolutions, activations, LayerNorm, InstanceNorm) or a
    class of the run that is, and nothing in it names dropout, BatchNorm, recurrent layers or
    ``self.training``. Leans towards "no": an unknown layer or builder makes it False."""
    if depth > 3:
        return False
    for node in ast.walk(cls):
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if word is not None and _MODE_WORD.fullmatch(word):
            return False
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name is None or name in _BUILTINS or _MODE_FREE_LAYERS.fullmatch(name):
            continue
        if isinstance(func, ast.Attribute) and not name[:1].isupper():
            root = func.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.value if not isinstance(root, ast.Call) else root.func
            if isinstance(root, ast.Name) and root.id not in ctx.aliases:
                continue  # layers.append(...), x.view(...), self.main(x): a method of a value, not a builder
            if isinstance(root, ast.Name) and ctx.aliases.get(root.id, "").split(".")[0] == "torch" and (
                    ctx.qualname(func) or "").startswith(("torch.nn.functional.", "torch.")) \
                    and "models" not in (ctx.qualname(func) or ""):
                continue  # F.relu, torch.cat: functions, not layers (dropout and batch_norm are caught above)
            return False
        if isinstance(func, ast.Name) and not name[:1].isupper():
            local = ctx.functions_named(name)
            if not local:
                return False  # a builder of another library
            continue  # a helper of the file: its layers are judged where it builds them (walked with the file)
        found = ctx.class_named(name, node) if isinstance(func, ast.Name) else None
        other = (ctx, found) if found is not None else (
            ctx.program.class_of(ctx, func) if ctx.program is not None else None)
        if other is None or other[1] is cls or not mode_free_class(other[0], other[1], depth + 1):
            return False
    return True


# Layers whose forward changes with the mode by default: dropout, and torch's transformer layers (dropout 0.1).
_MODE_LAYERS = re.compile(r"(?:Alpha|FeatureAlpha)?Dropout[123]?d?|Transformer(?:Encoder|Decoder)?(?:Layer)?")
# Hugging Face families whose configurations default to dropout > 0 (not Llama, ViT, ...: 0.0 there).
_HF_DROPOUT = re.compile(r"(?:GPT2|OpenAIGPT|Bert|Roberta|XLMRoberta|DistilBert|Electra|XLNet|Bart|MBart|T5|MT5|"
                         r"Marian|Pegasus|Camembert|Deberta(?:V2)?)(?:Model|LMHeadModel|For\w+)")


def mode_dependent_parts(ctx: Context, cls: ast.ClassDef, excluded: set[str] | frozenset[str] = frozenset(),
                         depth: int = 0) -> list[str]:
    """The attributes that a module class of the run assigns in its ``__init__`` (``excluded`` left out) to a
    layer whose forward depends on the mode, as far as the code shows: dropout, BatchNorm, torch's transformer
    layers, a Hugging Face model of a family with dropout by default (``GPT2Model.from_pretrained``,
    ``BertModel(config)``), a BatchNorm CNN, or a class of the run that holds one. The positive twin of
    ``mode_free_class``; leans towards "none"."""
    init = init_of(cls)
    if init is None or depth > 3:
        return []
    found = []
    for key, bindings in ctx.attr_bindings.items():
        if not key.startswith("self.") or key.count(".") != 1 or key[5:] in excluded:
            continue
        if any(ctx.scope(b.stmt) is init and b.kind == "assign" and b.value is not None and not b.unpacked
               and _mode_dependent_value(ctx, b.value, b.stmt, depth) for b in bindings):
            found.append(key[5:])
    return sorted(found)


def assigns_in_init(ctx: Context, cls: ast.ClassDef, attr: str) -> bool:
    """Whether the ``__init__`` of ``cls`` assigns ``self.<attr>``."""
    init = init_of(cls)
    return init is not None and any(ctx.scope(b.stmt) is init for b in ctx.attr_bindings.get(f"self.{attr}", []))


def _mode_dependent_value(ctx: Context, value: ast.AST, at: ast.AST, depth: int) -> bool:
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda", "cpu", "train", "eval", "float", "half"):
        return _mode_dependent_value(ctx, func.value, at, depth)
    q = ctx.qualname(func) or ""
    if q.startswith("transformers."):
        parts = q.split(".")
        name = parts[-2] if parts[-1] == "from_pretrained" and len(parts) > 2 else parts[-1]
        return bool(_HF_DROPOUT.fullmatch(name))
    if q.startswith("torch.nn."):
        last = q.rsplit(".", 1)[1]
        if _MODE_LAYERS.fullmatch(last):  # nn.Dropout(0.0), dropout=0: the same in both modes
            rate = keyword(value, "p") or keyword(value, "dropout")
            given = rate.value if rate is not None else (value.args[0] if "Dropout" in last and value.args else None)
            return not (is_const(given, 0) or is_const(given, 0.0))
        if _BN.fullmatch(last):
            return True
        if last in ("Sequential", "ModuleList"):
            items = [a.value if isinstance(a, ast.Starred) else a for a in value.args]
            items = [e for a in items for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
            return any(_mode_dependent_value(ctx, a, at, depth) for a in items)
        return False
    if ctx.analysis(Norms).value_has_bn(value, [], at, depth + 1):
        return True
    found = ctx.class_named(func.id, at) if isinstance(func, ast.Name) else None
    program = ctx.program
    other = (ctx, found) if found is not None else (program.class_of(ctx, func) if program is not None else None)
    return other is not None and bool(mode_dependent_parts(other[0], other[1], frozenset(), depth + 1))
