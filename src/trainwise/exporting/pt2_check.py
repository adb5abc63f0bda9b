"""The check that stands between an untrusted ``.pt2`` file and ``torch.export.load``.

:func:`check_archive` reads the archive's bytes and raises :class:`Refused` (the entry and a phrase saying what it
holds) unless the archive holds only what ``torch.export.save`` writes for a plain model. The loader (and the
torch.export writer) turn a refusal into one sentence; docs/security.md says what is checked and why.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import math
import operator
import re
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

import torch

# torch.export.load is not safe on a file from someone else: it unpickles with weights_only=False every weight or
# constant whose config entry says use_pickle, every "opaque" constant, the legacy data/weights/<model>.pt and
# data/constants/<model>.pt, the whole pre-2.8 layout, and the sample inputs whenever they fail the weights-only
# unpickler; it loads AOTInductor shared libraries; it evaluates every symbolic shape expression with
# sympy.sympify (Python eval); ExportedProgram.module() execs the archive's guards_code and pastes names from the
# graph into generated Python source; and a graph node may name any torch.* callable (torch.os.system). So before
# torch sees a byte, the archive must look exactly like what torch.export.save writes for a plain model: only
# known entries, stored uncompressed, no pickles outside the weights-only sample inputs, aten/prims operators
# only, and every name, expression and guard within a grammar that cannot express a call to anything else.

_PT2_ROOT_ENTRIES = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
_PT2_WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
_PT2_CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
_PT2_MODEL = "models/model.json"
_PT2_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_PT2_ENTRIES = _PT2_ROOT_ENTRIES | {_PT2_WEIGHTS_CONFIG, _PT2_CONSTANTS_CONFIG, _PT2_MODEL, _PT2_SAMPLE_INPUTS}
_PT2_PAYLOAD = re.compile(r"data/weights/weight_\d{1,9}|data/constants/tensor_\d{1,9}")
_PT2_EXTRA = re.compile(r"extra/[A-Za-z0-9_.\-]{1,200}")  # read back as plain text, never run
_PT2_LEGACY = {  # the layout of torch <= 2.7, which torch.export.load still falls back to: all of it pickled
    "version",
    "serialized_exported_program.json",
    "serialized_state_dict.pt",
    "serialized_state_dict.json",
    "serialized_constants.pt",
    "serialized_constants.json",
    "serialized_example_inputs.pt",
}
_PT2_JSON_LIMIT = 256 << 20  # bytes of one JSON entry
_PT2_SAFE_NAME = re.compile(r"[A-Za-z0-9_.+\-]{0,1000}")  # tensor, parameter, node and symbol names
_PT2_DUNDER = re.compile(r"(?:^|\.)__")  # self.__class__...: no name may reach Python's special attributes
# Keys whose strings torch keeps as data (repr'd, split or json-parsed, never pasted into code): any text goes.
_PT2_FREE_TEXT = {
    "stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom", "from_node", "torch_version",
    "as_string", "as_strings",
}  # fmt: skip
_PT2_HIGHER_ORDER = {
    "cond", "while_loop", "map_impl", "scan", "associative_scan", "wrap_with_set_grad_enabled",
    "wrap_with_autocast", "invoke_subgraph",
}  # fmt: skip
# aten operators that touch the file system or build tensors without their invariants being checked.
_PT2_DENIED_OPS = re.compile(r"save|from_file|_print|_sparse_\w*_unsafe|_nested_view_from_\w+")
_PT2_NAMESPACES = ("aten", "prims")  # torch's own operator libraries; any other is someone else's code
_PT2_IDENTIFIER = re.compile(r"[A-Za-z_]\w{0,200}")
_PT2_HOP = re.compile(r"torch\.ops\.higher_order\.(\w{1,200})")
_SYMPY_CALLS = {
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Mod", "Abs", "floor", "ceiling",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan",
    "Equality", "Unequality", "And", "Or", "Not", "Piecewise", "ExprCondPair", "sqrt",
    # torch.utils._sympy.functions, as the deserializer hands them to sympify
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "BitwiseFn_bitwise_and",
    "BitwiseFn_bitwise_or", "BitwiseFn_bitwise_xor",
    *(f"OpaqueUnaryFn_{name}" for name in (
        "acos", "asin", "asinh", "atan", "cos", "cosh", "exp", "log", "log2", "sin", "sinh", "sqrt", "tan", "tanh",
    )),
}  # fmt: skip
_SYMPY_CONSTANTS = {"oo", "zoo", "nan", "int_oo", "true", "false", "pi", "E"}
_SYMPY_KEYWORDS = {
    "integer", "positive", "negative", "nonnegative", "nonpositive", "real", "finite", "infinite", "zero",
    "nonzero", "precision", "evaluate", "commutative", "rational", "extended_real", "extended_positive",
    "extended_negative", "extended_nonnegative", "extended_nonpositive",
}  # fmt: skip
_SYMBOL_NAME = re.compile(r"[a-z]{1,8}\d{1,9}")  # s77, u0, ps3, zf1: torch's shape symbols
_GUARD_CALLS = {"abs", "min", "max", "len", "int", "float", "IsNonOverlappingAndDenseIndicator"}
_GUARD_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_GUARD_MATH = {"isnan", "isinf", "isfinite", "floor", "ceil", "trunc", "sqrt", "inf"}
_EXPR_LIMIT = 20_000  # characters of one expression or guard
_POW_LIMIT = 64  # largest literal exponent: Pow(Integer(10), Integer(10**9)) would hang the loader


class Refused(Exception):
    """An archive that must not reach torch.export.load: ``entry`` and a phrase saying what it holds."""

    def __init__(self, entry: str, what: str, *, unsafe: bool = True, fix: str | None = None) -> None:
        super().__init__(entry, what)
        self.entry, self.what, self.unsafe = entry, what, unsafe
        self.fix = fix  # what to do instead, where exporting again would not help




def check_archive(data: bytes) -> None:
    if not data:
        raise Refused("the file", "is empty", unsafe=False)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise Refused("the file", "is not a zip archive", unsafe=False) from None
    with archive:
        infos = archive.infolist()
        if not infos:
            raise Refused("the archive", "has no entries", unsafe=False)
        root = infos[0].filename.split("/", 1)[0] if "/" in infos[0].filename else ""
        names: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = _pt2_entry_name(info.filename, root)
            if name in names:
                raise Refused(info.filename, "appears twice in the archive")
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                raise Refused(
                    info.filename, "is compressed or encrypted, which torch.export.save never writes", unsafe=False
                )
            names[name] = info
    for required in (*sorted(_PT2_ROOT_ENTRIES - {".data/serialization_id"}), _PT2_MODEL, _PT2_WEIGHTS_CONFIG,
                     _PT2_CONSTANTS_CONFIG, _PT2_SAMPLE_INPUTS):  # fmt: skip
        if required not in names:
            raise Refused(required, "is missing", unsafe=False)
    # torch reads the archive with its own zip reader (miniz): it must see exactly the entries checked here.
    reader = torch._C.PyTorchFileReader(io.BytesIO(data))
    if set(reader.get_all_records()) != set(names):
        raise Refused("the zip directory", "lists other entries than torch's own zip reader sees")

    def record(name: str) -> bytes:
        if reader.get_record_size(name) > _PT2_JSON_LIMIT:
            raise Refused(name, "is too large", unsafe=False)
        return reader.get_record(name)

    if record("archive_format") != b"pt2":
        raise Refused("archive_format", "does not say pt2", unsafe=False)
    if record("archive_version") != b"0":
        raise Refused("archive_version", "is not 0, the version this check knows", unsafe=False)
    sizes = {name: reader.get_record_size(name) for name in names if _PT2_PAYLOAD.fullmatch(name)}
    _check_payload_config(record, _PT2_WEIGHTS_CONFIG, "data/weights/", "weight_", sizes)
    _check_payload_config(record, _PT2_CONSTANTS_CONFIG, "data/constants/", "tensor_", sizes)
    _check_sample_inputs(record(_PT2_SAMPLE_INPUTS))
    _check_program(_json_entry(record, _PT2_MODEL))


def _pt2_entry_name(filename: str, root: str) -> str:
    """The entry's name below the archive's root folder, if it is one torch.export.save writes."""
    if not root or not filename.startswith(root + "/"):
        what = (
            "belongs to the pre-2.8 layout, which torch would unpickle with weights_only=False"
            if filename in _PT2_LEGACY
            else "lies outside the archive's root folder"
        )
        raise Refused(repr(filename), what, unsafe=filename in _PT2_LEGACY)
    name = filename[len(root) + 1 :]
    if name in _PT2_ENTRIES or _PT2_PAYLOAD.fullmatch(name) or _PT2_EXTRA.fullmatch(name):
        return name
    if name.startswith("data/aotinductor/"):
        what = "is AOTInductor native code that torch would load as a shared library"
    elif "custom_obj_" in name or "opaque_obj_" in name:
        what = "is a pickled object that torch would unpickle with weights_only=False"
    elif name in ("data/weights/model.pt", "data/constants/model.pt") or name in _PT2_LEGACY:
        what = "is a legacy-layout pickle that torch would unpickle with weights_only=False"
    else:
        raise Refused(repr(name), "is not an entry torch.export.save writes for a plain model", unsafe=False)
    raise Refused(repr(name), what)


def _json_entry(record: Callable[[str], bytes], name: str) -> Any:
    try:
        return json.loads(record(name).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise Refused(name, f"is not JSON ({reason.rstrip('.')[:300]})", unsafe=False) from None


def _check_payload_config(
    record: Callable[[str], bytes], name: str, folder: str, prefix: str, sizes: dict[str, int]
) -> None:
    """Every entry a raw tensor (never ``use_pickle``) whose bytes are all in the archive."""
    config = _json_entry(record, name)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise Refused(name, "has no config mapping", unsafe=False)
    dtypes: dict[str, Any] = {}
    for fqn, meta in entries.items():
        where = f"{name} entry {str(fqn)[:80]!r}"
        if not _is_safe_name(fqn):
            raise Refused(where, "is not a plain attribute path, yet torch would set it on a module")
        if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
            raise Refused(where, "has no path_name", unsafe=False)
        path = meta["path_name"]
        if meta.get("use_pickle") is not False:
            raise Refused(where, f"asks torch to unpickle {folder}{path[:80]} with weights_only=False (use_pickle)")
        if not path.startswith(prefix) or f"{folder}{path}" not in sizes:
            raise Refused(where, f"points to {folder}{path[:80]!r}, which is not a tensor file of the archive")
        dtype, nbytes = _check_tensor_meta(meta.get("tensor_meta"), where)
        if dtypes.setdefault(path, dtype) is not dtype:
            raise Refused(where, "reads a shared tensor file with another dtype", unsafe=False)
        if nbytes > sizes[f"{folder}{path}"]:
            raise Refused(where, "describes a tensor larger than its file", unsafe=False)


def _check_tensor_meta(meta: Any, where: str) -> tuple[torch.dtype, int]:
    """The dtype and the bytes the strided tensor spans (0 when empty); plain integers only, no expressions."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    if not isinstance(meta, dict):
        raise Refused(where, "has no tensor_meta", unsafe=False)
    dtype = _SERIALIZE_TO_TORCH_DTYPE.get(meta.get("dtype")) if isinstance(meta.get("dtype"), int) else None
    if dtype is None:
        raise Refused(where, "has an unknown dtype", unsafe=False)

    def ints(value: Any) -> list[int]:
        items = value if isinstance(value, list) else None
        if items is None or len(items) > 64:
            raise Refused(where, "has malformed sizes or strides", unsafe=False)
        numbers = [item.get("as_int") if isinstance(item, dict) and len(item) == 1 else None for item in items]
        if not all(type(number) is int and 0 <= number < 1 << 62 for number in numbers):
            raise Refused(where, "has sizes or strides that are not plain non-negative integers", unsafe=False)
        return numbers  # type: ignore[return-value]

    sizes, strides, (offset,) = ints(meta.get("sizes")), ints(meta.get("strides")), ints([meta.get("storage_offset")])
    if len(sizes) != len(strides):
        raise Refused(where, "has a different number of sizes and strides", unsafe=False)
    if any(size == 0 for size in sizes):
        return dtype, 0
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    return dtype, (last + 1) * dtype.itemsize


def _check_sample_inputs(data: bytes) -> None:
    """torch tries weights_only=True first and falls back to weights_only=False: the first must succeed here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sample = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:
        raise Refused(
            _PT2_SAMPLE_INPUTS, "fails the weights-only unpickler, so torch would unpickle it with weights_only=False"
        ) from None
    if not (isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict)):
        raise Refused(_PT2_SAMPLE_INPUTS, "is not an (args, kwargs) pair", unsafe=False)
    stack = [sample]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if not (isinstance(key, str) and key.isidentifier()):
                    raise Refused(
                        _PT2_SAMPLE_INPUTS, f"has the keyword {str(key)[:80]!r}, which torch pastes into code"
                    )
                stack.append(value)
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif not (item is None or isinstance(item, (torch.Tensor, bool, int, float))):
            raise Refused(_PT2_SAMPLE_INPUTS, f"holds a value of type {type(item).__name__}", unsafe=False)


def _check_program(program: Any) -> None:
    """Walk models/model.json: every string that reaches code is a plain name, operator, expression or guard."""
    if not isinstance(program, dict):
        raise Refused(_PT2_MODEL, "is not a JSON object", unsafe=False)
    guards = program.get("guards_code", [])
    if not (isinstance(guards, list) and all(isinstance(guard, str) for guard in guards)):
        raise Refused(_PT2_MODEL, "has a guards_code that is not a list of strings", unsafe=False)
    for guard in guards:
        if not is_plain_guard(guard):
            raise Refused(
                f"{_PT2_MODEL} guards_code {guard[:80]!r}", "is not a plain shape check, yet torch would exec it"
            )
    stack: list[tuple[str, Any]] = [("", program)]
    while stack:
        key, value = stack.pop()
        if key in _PT2_FREE_TEXT or key == "guards_code":
            continue
        if key == "expr_str":
            if not (isinstance(value, str) and is_plain_sympy(value)):
                raise Refused(
                    f"{_PT2_MODEL} expr_str {str(value)[:80]!r}",
                    "is not a plain sympy expression, yet torch would eval it",
                )
        elif key in ("in_spec", "out_spec", "context") and isinstance(value, str):
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                raise Refused(_PT2_MODEL, f"holds {key} text that is not JSON", unsafe=False) from None
            stack.append(("", parsed))
        elif key in ("target", "as_operator"):  # only graph nodes have a target
            check_target(value)
        elif key in ("as_custom_obj", "custom_obj", "custom_obj_values") and value:
            raise Refused(_PT2_MODEL, "uses a custom (torchbind) object that torch would rebuild from a pickle")
        elif isinstance(value, dict):
            for child_key, child in value.items():
                if not _is_safe_name(child_key):
                    raise Refused(
                        _PT2_MODEL, f"has the name {child_key[:80]!r}, which torch would paste into Python code"
                    )
                stack.append((child_key, child))
        elif isinstance(value, list):
            stack.extend((key, child) for child in value)
        elif isinstance(value, str) and not _is_safe_name(value):
            raise Refused(_PT2_MODEL, f"has the name {value[:80]!r}, which torch would paste into Python code")


def _is_safe_name(text: str) -> bool:
    return bool(_PT2_SAFE_NAME.fullmatch(text)) and not _PT2_DUNDER.search(text)


def check_target(target: Any) -> None:
    """A node's operator: a registered aten or prims operator (not a file-touching one), a known higher-order
    (control-flow) operator, or one of torch's symbolic-shape functions.

    torch.export.load resolves the name with getattr from ``torch`` (``torch.ops.aten.__and__.Tensor``, but also
    ``torch.os.system``) and calls what it finds, so the name must lead to exactly the operator that torch's
    dispatcher registered under it; a name that merely looks like one is not enough.
    """
    if not isinstance(target, str):
        raise Refused(_PT2_MODEL, "has a node without an operator name", unsafe=False)
    if target in _sym_op_names():
        return
    hop = _PT2_HOP.fullmatch(target)
    if hop and hop.group(1) in _PT2_HIGHER_ORDER:
        return
    node = f"{_PT2_MODEL} node {target[:80]!r}"
    parts = target.split(".")
    if len(parts) != 5 or parts[:2] != ["torch", "ops"] or not all(map(_PT2_IDENTIFIER.fullmatch, parts[2:])):
        raise Refused(node, "calls something other than a PyTorch operator")
    namespace, op, overload = parts[2:]
    if namespace not in _PT2_NAMESPACES:
        raise Refused(
            node,
            f"calls an operator of the library {namespace!r}, not of torch's own aten or prims, which this check "
            "cannot vet",
            fix="load it with torch.export.load only in a process that registers that operator, and only if you "
            "trust the file as you trust code",
        )
    if _PT2_DENIED_OPS.fullmatch(op):
        raise Refused(node, "calls an operator that touches files or skips its own safety checks")
    if _registered_operator(namespace, op, overload) is None:
        if overload.startswith("__") or (op.startswith("__") and not _has_schemas(namespace, op)):
            # torch.ops.aten.__class__..., torch.ops.aten.add.__call__: a crafted name, not an unknown operator
            raise Refused(node, "is no registered operator, and its getattr steps would reach Python attributes")
        raise Refused(node, "is not an operator of this torch", unsafe=False)  # perhaps one of a newer torch


def _registered_operator(namespace: str, op: str, overload: str) -> torch._ops.OpOverload | None:
    """``namespace::op.overload`` when the dispatcher has that schema and the getattr steps torch.export.load takes
    lead to its OpOverload; None otherwise. No attribute is looked up before the registry knows the name, so a
    name such as ``__class__`` never reaches Python's special attributes."""
    try:
        torch._C._get_schema(f"{namespace}::{op}", "" if overload == "default" else overload)
    except (AttributeError, RuntimeError):  # "Found no matching schema" (or a torch without this lookup)
        return None
    resolved: Any = torch.ops
    for name in (namespace, op, overload):
        resolved = getattr(resolved, name, None)
    if not isinstance(resolved, torch._ops.OpOverload):
        return None
    if resolved._schema.name != f"{namespace}::{op}" or resolved._overloadname != overload:
        return None
    return resolved


def _has_schemas(namespace: str, op: str) -> bool:
    """Whether the dispatcher has any overload of ``namespace::op``."""
    try:
        return bool(torch._C._jit_get_schemas_for_operator(f"{namespace}::{op}"))
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def _sym_op_names() -> frozenset[str]:
    """The names torch's serializer writes for its symbolic-shape functions (``_operator.add``, ``torch.sym_max``,
    ``math.trunc``), each kept only where torch.export.load's getattr steps lead back to that same function."""
    from torch._export.serde.serialize import _SYM_OPS

    modules = {"_operator": operator, "torch": torch, "math": math}  # the deserializer's three roots
    names = set()
    for function in _SYM_OPS:
        name = f"{function.__module__}.{function.__name__}"
        root, *attributes = name.split(".")
        resolved: Any = modules.get(root)
        for attribute in attributes:
            resolved = getattr(resolved, attribute, None)
        if resolved is not None and resolved is function:
            names.add(name)
    return frozenset(names)


def _parse_expression(text: str) -> ast.Expression | None:
    if len(text) > _EXPR_LIMIT:
        return None
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr, ast.BitXor)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_UNARY = (ast.USub, ast.UAdd, ast.Not, ast.Invert)


def _small_power(node: ast.BinOp | ast.Call) -> bool:
    exponent = node.right if isinstance(node, ast.BinOp) else (node.args[1] if len(node.args) > 1 else None)
    if isinstance(exponent, ast.Call) and exponent.args:  # Integer(3)
        exponent = exponent.args[0]
    if isinstance(exponent, ast.UnaryOp):
        exponent = exponent.operand
    return not isinstance(exponent, ast.Constant) or (
        isinstance(exponent.value, (int, float)) and abs(exponent.value) <= _POW_LIMIT
    )


def is_plain_sympy(text: str) -> bool:
    """What ``sympy.srepr`` writes for shape expressions: whitelisted constructors, numbers, symbol names."""
    tree = _parse_expression(text)
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load, *_ARITHMETIC, *_COMPARISONS, *_UNARY, ast.UnaryOp, ast.Compare)):
            continue
        if isinstance(node, ast.BinOp):
            if not isinstance(node.op, _ARITHMETIC) or (isinstance(node.op, ast.Pow) and not _small_power(node)):
                return False
        elif isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_CALLS):
                return False
            if node.func.id in ("Pow", "PowByNatural", "FloatPow") and not _small_power(node):
                return False
            if node.func.id in ("Symbol", "Float", "Integer", "Rational"):
                for arg in node.args:  # only these take strings, and only names or numbers
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        if not _PT2_SAFE_NAME.fullmatch(arg.value) or len(arg.value) > 100:
                            return False
                        arg.value = 0  # checked; the Constant rule below then allows it
        elif isinstance(node, ast.keyword):
            if node.arg not in _SYMPY_KEYWORDS or not isinstance(node.value, ast.Constant):
                return False
        elif isinstance(node, ast.Name):
            if not (node.id in _SYMPY_CALLS or node.id in _SYMPY_CONSTANTS or _SYMBOL_NAME.fullmatch(node.id)):
                return False
        elif isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, bool) or (type(node.value) is int and abs(node.value) >= 1 << 64):
                return False
        else:
            return False
    return True


def is_plain_guard(text: str) -> bool:
    """Shape checks such as ``L['x'].size()[0] == L['w'].size()[0]`` or ``2 <= L['x'].size()[0]``."""
    tree = _parse_expression(text)
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load, *_ARITHMETIC, *_COMPARISONS, *_UNARY, ast.UnaryOp, ast.Compare)):
            continue
        if isinstance(node, (ast.BoolOp, ast.And, ast.Or)):
            continue
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow) and not _small_power(node):
                return False
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(node.value, ast.Name) and node.value.id == "L":
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier()):
                    return False
                key.value = 0  # checked: the input's name
            elif not (isinstance(key, ast.Constant) and type(key.value) is int):
                return False
        elif isinstance(node, ast.Call):
            func = node.func
            if node.keywords:
                return False
            if isinstance(func, ast.Name):
                if func.id not in _GUARD_CALLS:
                    return False
            elif isinstance(func, ast.Attribute):
                if not (func.attr in _GUARD_METHODS or (_is_math(func.value) and func.attr in _GUARD_MATH)):
                    return False
            else:
                return False
        elif isinstance(node, ast.Attribute):
            if not (node.attr in _GUARD_METHODS or (_is_math(node.value) and node.attr in _GUARD_MATH)):
                return False
        elif isinstance(node, ast.Name):
            if node.id not in ("L", "math", "inf") and node.id not in _GUARD_CALLS:
                return False
        elif isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, bool) or (type(node.value) is int and abs(node.value) >= 1 << 64):
                return False
        else:
            return False
    return True


def _is_math(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "math"
