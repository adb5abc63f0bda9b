"""The check that stands between an untrusted ``.onnx`` file and onnxruntime.

:func:`check_model` walks a parsed ``ModelProto`` (every graph, the subgraphs of If/Loop/Scan nodes, local
functions, training graphs) and returns a phrase saying what it refuses, or None: a node in an operator domain
onnxruntime does not run itself, or a tensor whose external data lies outside the artifact's folder. The loader
parses the file with the ``onnx`` package (an optional dependency, imported only there) and words the refusal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

# The operator domains onnxruntime's own kernels implement: the standard ONNX operators ("" and its alias
# "ai.onnx"), the ONNX-ML operators ("ai.onnx.ml") and onnxruntime's contrib operators ("com.microsoft"), which
# torch.onnx.export emits for a few fused operators. torch.onnx.export (dynamo) otherwise emits only "" nodes, and
# calls to local functions (domains such as "pkg.onnxscript.torch_lib") whose bodies are in model.functions: those
# are accepted because their bodies are checked here too. Any other domain needs a custom-operator library, that
# is native code of the file's choosing; trainwise registers none, so such a graph could not run anyway, and
# refusing it says so in one sentence rather than leaving it to whatever a runtime may have registered.
NATIVE_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})

# onnxruntime reads an initializer from a raw memory address when its external data location is this tag.
_ORT_MEMORY_TAG = "_ORT_MEM_ADDR_"


def _name(text: str) -> str:
    return repr(text[:100])  # names come from the file: quoted (no line breaks) and short


def check_model(model: Any, folder: Path) -> str | None:
    """What in ``model`` (an ``onnx.ModelProto``) makes it unsafe to hand to onnxruntime, or None.

    ``folder`` is the artifact's folder: external data must resolve (symlinks followed) inside it.
    """
    local = {(function.domain, function.name, function.overload) for function in model.functions}
    for where, graph in _graphs(model):
        for node in graph.node:
            if node.domain not in NATIVE_DOMAINS and (node.domain, node.op_type, node.overload) not in local:
                return (f"node {_name(node.op_type)} in {where} uses the operator domain {_name(node.domain)}, "
                        "which needs a native custom-operator library")
        for tensor in _tensors(graph):
            problem = _external_data_problem(tensor, folder)
            if problem:
                return f"tensor {_name(tensor.name)} in {where} {problem}"
    return None


def has_external_data(model: Any) -> bool:
    """Whether any tensor of ``model`` keeps its data in another file."""
    return any(_is_external(tensor) for _, graph in _graphs(model) for tensor in _tensors(graph))


def _graphs(model: Any) -> Iterator[tuple[str, Any]]:
    """Every graph of ``model`` with where it is: the main graph, training graphs, local functions, and the
    subgraphs in their nodes' attributes (If/Loop/Scan bodies), nested to any depth."""
    pending: list[tuple[str, Any]] = [(f"graph {_name(model.graph.name)}", model.graph)]
    for info in model.training_info:
        pending += [("a training graph", info.initialization), ("a training graph", info.algorithm)]
    pending += [(f"function {_name(function.name)}", function) for function in model.functions]
    while pending:  # a list, not recursion: a crafted file may nest subgraphs thousands deep
        where, graph = pending.pop()
        yield where, graph
        for node in graph.node:
            for attribute in node.attribute:
                inner = [attribute.g] if attribute.HasField("g") else []
                here = f"a subgraph of node {_name(node.op_type)} in {where}"
                pending += [(here, g) for g in [*inner, *attribute.graphs]]


def _tensors(graph: Any) -> list[Any]:
    """The tensors a graph holds: initializers (a FunctionProto has none) and its nodes' tensor attributes."""
    tensors = list(getattr(graph, "initializer", ()))
    sparse = list(getattr(graph, "sparse_initializer", ()))
    for node in graph.node:
        for attribute in node.attribute:
            tensors += attribute.tensors
            tensors += [attribute.t] if attribute.HasField("t") else []
            sparse += attribute.sparse_tensors
            sparse += [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
    for each in sparse:
        tensors += [each.values, each.indices]
    return tensors


def _is_external(tensor: Any) -> bool:
    return bool(tensor.external_data) or tensor.data_location == 1  # TensorProto.EXTERNAL


def _external_data_problem(tensor: Any, folder: Path) -> str | None:
    """Why ``tensor``'s external data may not be read, or None (no external data, or a file inside ``folder``)."""
    if not _is_external(tensor):
        return None
    locations = [entry.value for entry in tensor.external_data if entry.key == "location"]
    if len(locations) != 1:
        return "marks its data external without one location"
    location = locations[0]
    if _outside(location, folder):
        return f"reads its external data from {_name(location)}, outside the artifact's folder"
    return None


def _outside(location: str, folder: Path) -> bool:
    """Whether ``location`` may name anything but a file inside ``folder``: absolute in POSIX or Windows terms,
    a ``..`` part (either separator), onnxruntime's memory-address tag, or a path resolving elsewhere."""
    if not location or "\x00" in location or _ORT_MEMORY_TAG in location:
        return True
    windows = PureWindowsPath(location)
    if PurePosixPath(location).is_absolute() or windows.drive or windows.root:
        return True
    if ".." in re.split(r"[\\/]", location):
        return True
    try:
        base = folder.resolve()
        return not (base / location).resolve().is_relative_to(base)
    except (OSError, RuntimeError, ValueError):  # a symlink loop or a name the OS refuses
        return True
