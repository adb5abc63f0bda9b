""":func:`export`: the model in eval mode, its inputs and outputs named, the eager reference outputs, and the
three writers (torch.export, TorchScript, ONNX); the artifact replaces the target only once parity holds."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import inspect
import linecache
import logging
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainwise._version import __version__
from trainwise.errors import TrainwiseError, first_line, with_article
from trainwise.evaluation import restore_training_modes, training_modes
from trainwise.exporting.common import FORMATS, SUFFIXES, ExportWarning, Format, _quiet_jit, _require
from trainwise.exporting.pt2_check import Refused, check_archive
from trainwise.exporting.sidecar import SIDECAR_VERSION, _sidecar_path, refuse_replacing_another_file
from trainwise.exporting.verify import ExportReport, _verify
from trainwise.files import atomic_write_json, write_failure

_ONNX_WEIGHTS_INLINE_LIMIT = 1 << 30  # bytes of weights kept inside the .onnx file (protobuf caps files at 2 GiB)
_FIRST_CAUSES = 8  # how deep to look into an exception's __cause__ chain


def export(
    model: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    path: str | os.PathLike[str],
    format: Format = "torch.export",
    *,
    dynamic_batch: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
    check_batch_sizes: Sequence[int] | None = None,
    outputs: str | Sequence[str] | None = None,
    dims: Mapping[str, Mapping[int, str | None]] | None = None,
) -> ExportReport:
    """Export ``model`` in eval mode to ``path``, check the artifact against the eager model, write ``path.json``.

    ``example_inputs`` is a tensor or a tuple of tensors passed positionally to ``forward``; with
    ``dynamic_batch`` (the default) the first dimension of every input is the batch and may differ at run time.
    Parity is checked at the example batch size and at ``check_batch_sizes`` (default: two others); ``atol`` and
    ``rtol`` default to :data:`TOLERANCES` for each output's dtype. Raises :class:`ExportParityError` (and leaves
    any existing file at ``path`` untouched) when the artifact differs by more than that.

    ``outputs`` exports the named fields of a model that returns a ``ModelOutput`` (Hugging Face), a dict or a
    dataclass: ``outputs="logits"`` makes the artifact return that tensor, several names a tuple in that order.

    Integer inputs of two or more dimensions (token ids, attention masks) have their dimension 1 free too, as
    ``"sequence"`` (one size shared by all of them, up to the model's ``config.max_position_embeddings`` when it
    has one), and parity is checked at two other lengths. ``dims`` frees or fixes any other dimension by input
    name: ``dims={"input_ids": {1: None}}`` fixes the sequence length to the example's, ``dims={"image": {2:
    "height", 3: "width"}}`` frees two (a name shared by several dimensions is one size); dimension 0 is the
    batch's (``dynamic_batch``).
    """
    started = time.perf_counter()
    if format not in FORMATS:
        raise TrainwiseError(f"unknown export format {format!r}; use one of {', '.join(FORMATS)}.")
    if not isinstance(model, nn.Module):
        raise TrainwiseError(f"export() needs a torch.nn.Module, got {type(model).__name__}; pass the model itself.")
    selected = _output_selection(outputs)
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise TrainwiseError(f"{name} must be a finite number of 0 or more, got {value!r}.")
    inputs = _input_tuple(example_inputs)
    target = Path(path)
    if target.is_dir():
        raise TrainwiseError(f"{target} is a folder; pass the artifact's file name, e.g. {target / 'model'}.pt2.")
    if not target.parent.is_dir():
        raise write_failure(target, errno.ENOENT)
    refuse_replacing_another_file(target, SUFFIXES[format])  # the sidecar's name may be a user's file
    if format == "onnx":
        _require("onnx", "ONNX export")
        _require("onnxscript", "ONNX export")
    names = _input_names(model, len(inputs))
    if selected:
        model = _SelectOutputs(model, selected)  # the user's model is its submodule: its modes are restored below
    if dynamic_batch:
        batch: int | None = _example_batch(inputs, names)
        sizes = _batch_sizes(batch, check_batch_sizes)
    else:
        batch = inputs[0].shape[0] if inputs[0].dim() else None  # reported only; every shape is fixed
        sizes = _batch_sizes(None, check_batch_sizes)
    free = _free_dims(names, inputs, dynamic_batch, dims)
    limits = {"sequence": _max_positions(model)}

    modes = training_modes(model)
    try:
        model.eval()  # dropout off, BatchNorm on its running statistics; restored in finally
        expected, single = _eager(model, inputs, names)
        example_sizes = _symbol_sizes(free, inputs)
        if batch is not None:
            example_sizes.setdefault("batch", batch)  # reported even when fixed
        checks = [Check(example_sizes, inputs, expected, f" at batch size {batch}" if dynamic_batch else "")]
        for size in sizes:
            resized = _resize_batch(inputs, size)
            checks.append(Check({**example_sizes, "batch": size}, resized, _eager(model, resized, names)[0],
                                f" at batch size {size}"))
        for symbol, length in example_sizes.items():
            if symbol == "batch":
                continue
            for other in _other_lengths(length, limits.get(symbol)):
                resized = _resize_dims(inputs, free, symbol, other)
                checks.append(Check({**example_sizes, symbol: other}, resized, _eager(model, resized, names)[0],
                                    f" at {symbol} length {other}"))
        # A size of 1 makes torch.export specialise the dimension to the constant 1 (its "0/1 specialisation"),
        # so the graph is captured from a size of 2 built from the example instead.
        capture = _resize_batch(inputs, 2) if dynamic_batch and batch == 1 else inputs
        for symbol, length in example_sizes.items():
            if symbol != "batch" and length == 1:
                capture = _resize_dims(capture, free, symbol, 2)
        input_specs = _specs(names, inputs, free)
        output_specs = _output_specs(checks)
        output_names = list(selected) or _output_names(len(expected))
        output_specs = [{"name": n, **s} for n, s in zip(output_names, output_specs)]
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as staging:
            staged = Path(staging) / target.name
            writer = {"torch.export": _write_torch_export, "torchscript": _write_torchscript, "onnx": _write_onnx}
            shapes = _dynamic_shapes(model, capture, free, limits)
            method = writer[format](model, capture, staged, shapes, names, output_names)
            restore_training_modes(model, modes)  # the artifact is written; the model is no longer needed
            metadata = {
                "trainwise_export": SIDECAR_VERSION,
                "format": format,
                "artifact": target.name,
                "method": method,
                "dynamic_batch": dynamic_batch,
                "dims": {name: {str(d): sym for d, sym in sorted(spec.items())} for name, spec in zip(names, free)
                         if spec},
                "single_output": single,
                "inputs": input_specs,
                "outputs": output_specs,
                "device": str(_model_device(model) or torch.device("cpu")),
                "versions": _versions(format),
            }
            report = _verify(staged, metadata, checks, atol=atol, rtol=rtol)
            report.path, report.sidecar = target, _sidecar_path(target)
            metadata["parity"] = {
                key: getattr(report, key)
                for key in ("verified", "runtime", "atol", "rtol", "max_abs_diff", "max_rel_diff")
            }
            metadata["parity"]["batch_sizes"] = list(report.batch_sizes)
            metadata["parity"]["lengths"] = {k: list(v) for k, v in report.lengths.items()}
            for produced in sorted(Path(staging).iterdir()):  # the artifact (and ONNX external data, if any)
                os.replace(produced, target.parent / produced.name)
    finally:
        restore_training_modes(model, modes)
    atomic_write_json(report.sidecar, metadata, sort_keys=False)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _input_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, dict):
        raise TrainwiseError(
            "example_inputs is a dict; pass the forward() arguments positionally as a tuple of tensors."
        )
    if isinstance(example_inputs, (tuple, list)) and example_inputs:
        for position, item in enumerate(example_inputs):
            if not isinstance(item, torch.Tensor):
                raise TrainwiseError(
                    f"example input {position} is of type {type(item).__name__}; pass a tensor or a tuple of tensors "
                    "(convert arrays with torch.as_tensor)."
                )
        return tuple(example_inputs)
    raise TrainwiseError(
        f"example_inputs must be a tensor or a non-empty tuple of tensors, got {type(example_inputs).__name__}; "
        "pass e.g. torch.randn(1, 3, 32, 32)."
    )


def _input_names(model: nn.Module, count: int) -> list[str]:
    """forward()'s positional parameter names (``x``, ``src``, ``input``), else ``input_0``, ``input_1``..."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= count:
        return positional[:count]
    return ["input" if count == 1 else f"input_{i}" for i in range(count)]


def _output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def _output_selection(outputs: Any) -> tuple[str, ...]:
    """``outputs=`` as a tuple of field names; () when it is None."""
    if outputs is None:
        return ()
    names = (outputs,) if isinstance(outputs, str) else tuple(outputs) if isinstance(outputs, (tuple, list)) else ()
    if not names or not all(isinstance(name, str) and 0 < len(name) <= 200 for name in names):
        raise TrainwiseError(
            f"outputs must name the fields to export, e.g. outputs='logits' (or a tuple of names), got "
            f"{repr(outputs)[:80]}."
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TrainwiseError(f"outputs names {', '.join(map(repr, twice))} more than once; name each field once.")
    return names


class _OutputsError(TrainwiseError):
    """``outputs=`` names a field that the model's output does not have as a tensor."""


class _SelectOutputs(nn.Module):
    """``model`` whose forward returns the named fields of its output (a ModelOutput, dict or dataclass): the
    tensor itself for one name, a tuple for several. What :func:`export` exports for ``outputs=``."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        output = self.model(*inputs)
        picked = tuple(_field(output, name) for name in self.names)
        return picked[0] if len(picked) == 1 else picked


def _field(output: Any, name: str) -> torch.Tensor:
    if isinstance(output, Mapping):  # a ModelOutput is one too; a field that is None is not among its keys
        value = output.get(name)
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        value = getattr(output, name, None)
    else:
        raise _OutputsError(
            f"outputs= selects fields of a ModelOutput, dict or dataclass, but the model returns "
            f"{with_article(type(output).__name__)}; drop outputs= and return a tensor or a tuple of tensors from "
            "forward()."
        )
    if not isinstance(value, torch.Tensor):
        kind = type(output).__name__
        what = "has no field" if value is None else f"has {with_article(type(value).__name__)}, not a tensor, as"
        fields = _tensor_fields(output)
        choice = f"one of {', '.join(map(repr, fields))}" if fields else "a field that holds a tensor"
        raise _OutputsError(f"the model's {kind} {what} {name!r}; pass outputs= {choice}.")
    return value


def _tensor_fields(output: Any) -> list[str]:
    """The names of the tensor fields of a ModelOutput, dict or dataclass instance; [] for anything else."""
    if isinstance(output, Mapping):
        return [key for key, value in output.items() if isinstance(key, str) and isinstance(value, torch.Tensor)]
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [f.name for f in dataclasses.fields(output) if isinstance(getattr(output, f.name, None), torch.Tensor)]
    return []


def _example_batch(inputs: tuple[torch.Tensor, ...], names: list[str]) -> int:
    sizes = set()
    for name, tensor in zip(names, inputs):
        if tensor.dim() == 0:
            raise TrainwiseError(
                f"example input {name!r} is a scalar, so it has no batch dimension; give it one or pass "
                "dynamic_batch=False."
            )
        sizes.add(tensor.shape[0])
    if len(sizes) > 1:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, inputs))
        raise TrainwiseError(
            f"with dynamic_batch=True every input's first dimension is the batch, but they differ ({shapes}); "
            "make them agree or pass dynamic_batch=False."
        )
    (size,) = sizes
    if size == 0:
        raise TrainwiseError("the example inputs have a batch of 0; pass at least one sample.")
    return size


def _batch_sizes(batch: int | None, requested: Sequence[int] | None) -> list[int]:
    """The batch sizes checked besides the example's: two others by default (1 among them when possible)."""
    if batch is None:
        if requested:
            raise TrainwiseError("check_batch_sizes needs dynamic_batch=True; drop it or make the batch dynamic.")
        return []
    if requested is not None:
        sizes = [int(size) for size in requested]
        if any(size < 1 for size in sizes):
            raise TrainwiseError(f"check_batch_sizes must be 1 or more, got {sizes}.")
        return [size for size in dict.fromkeys(sizes) if size != batch]
    candidates = [1, batch + 1, 2 * batch + 1]
    return [size for size in dict.fromkeys(candidates) if size != batch][:2]


def _resize_batch(inputs: tuple[torch.Tensor, ...], size: int) -> tuple[torch.Tensor, ...]:
    """Inputs with ``size`` rows: the example's rows repeated, floats perturbed so that rows are not all equal.

    Repeating keeps integer inputs valid (token ids stay in the vocabulary); the perturbation is seeded, so the
    global RNG is untouched and the check repeats exactly.
    """
    generator = torch.Generator().manual_seed(size)
    resized = []
    with torch.no_grad():
        for tensor in inputs:
            index = torch.arange(size, device=tensor.device) % tensor.shape[0]
            rows = tensor.detach().index_select(0, index).clone()
            if rows.is_floating_point() and size > tensor.shape[0]:
                scale = rows.float().std().nan_to_num(0.0).clamp(min=1e-3).item() * 0.1
                noise = torch.randn(rows.shape, generator=generator, dtype=torch.float32) * scale
                extra = slice(tensor.shape[0], None)  # the example's own rows stay exactly as given
                rows[extra] += noise[extra].to(device=rows.device, dtype=rows.dtype)
            resized.append(rows)
    return tuple(resized)


def _model_device(model: nn.Module) -> torch.device | None:
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return None


def _model_dtype(model: nn.Module) -> torch.dtype | None:
    for tensor in model.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _eager(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], names: list[str]
) -> tuple[tuple[torch.Tensor, ...], bool]:
    """The eager outputs (detached, as a tuple) and whether forward() returned a single tensor."""
    try:
        with torch.no_grad():
            output = model(*inputs)
    except _OutputsError:
        raise
    except Exception as exc:
        described = ", ".join(f"{n}: {_tensor_text(t)}" for n, t in zip(names, inputs))
        dtype, device = _model_dtype(model), _model_device(model)
        held = f" (its parameters are {str(dtype).removeprefix('torch.')} on {device})" if dtype else ""
        reason = first_line(exc)
        raise TrainwiseError(
            f"the model fails on the example inputs ({described}) with {type(exc).__name__}: {reason}; pass "
            f"example inputs of the shape, dtype and device that forward() expects{held}."
        ) from exc
    if isinstance(output, torch.Tensor):
        return (output.detach(),), True
    if isinstance(output, (tuple, list)) and output and all(isinstance(item, torch.Tensor) for item in output):
        return tuple(item.detach() for item in output), False
    kind = type(output).__name__
    fields = _tensor_fields(output)
    if fields:
        several = " (or several names for a tuple of them)" if len(fields) > 1 else ""
        raise TrainwiseError(
            f"the model returns {with_article(kind)} with the tensor fields {', '.join(fields)}, but an exported model "
            f"returns a tensor or a tuple of tensors; pass outputs={fields[0]!r} to export that field{several}."
        )
    if isinstance(output, (tuple, list)):
        inner = sorted({type(item).__name__ for item in output if not isinstance(item, torch.Tensor)})
        kind = f"{kind} holding {', '.join(inner) or 'nothing'}"
    raise TrainwiseError(
        f"the model returns {with_article(kind)}, but an exported model returns a tensor or a tuple of tensors; make "
        "forward() return that (or wrap the model in a module whose forward() does)."
    )


def _tensor_text(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


@dataclasses.dataclass
class Check:
    """One parity check: the free dimensions' sizes, the inputs, the eager outputs, and where (for messages)."""

    sizes: dict[str, int]
    inputs: tuple[torch.Tensor, ...]
    expected: tuple[torch.Tensor, ...]
    where: str


def _free_dims(names: list[str], inputs: tuple[torch.Tensor, ...], dynamic_batch: bool,
               dims: Mapping[str, Mapping[int, str | None]] | None) -> list[dict[int, str]]:
    """For each input, its free dimensions and their names: the batch (dimension 0, with ``dynamic_batch``), the
    sequence of integer inputs (dimension 1, when they all have the same length there), then ``dims``."""
    free: list[dict[int, str]] = [{0: "batch"} if dynamic_batch and t.dim() else {} for t in inputs]
    tokens = [i for i, t in enumerate(inputs) if t.dim() >= 2 and not t.is_floating_point() and not t.is_complex()]
    if tokens and len({inputs[i].shape[1] for i in tokens}) == 1:
        for i in tokens:
            free[i][1] = "sequence"
    if dims is None:
        return free
    if not isinstance(dims, Mapping):
        raise TrainwiseError(f"dims must map input names to {{dimension: name or None}}, got {type(dims).__name__}.")
    for name, spec in dims.items():
        if name not in names:
            raise TrainwiseError(f"dims names the input {str(name)[:80]!r}; the inputs are {', '.join(names)}.")
        position = names.index(name)
        rank = inputs[position].dim()
        if not isinstance(spec, Mapping):
            raise TrainwiseError(f"dims[{name!r}] must map dimensions to a name or None, e.g. {{1: None}}.")
        for dim, symbol in spec.items():
            if type(dim) is not int or not 0 < dim < rank:
                raise TrainwiseError(
                    f"dims[{name!r}] names dimension {dim!r}, but {name!r} has dimensions 1 to {rank - 1} besides the "
                    "batch (dimension 0 is dynamic_batch's)."
                )
            if symbol is None:
                free[position].pop(dim, None)
            elif isinstance(symbol, str) and symbol.isidentifier() and len(symbol) <= 40 and symbol != "batch":
                free[position][dim] = symbol
            else:
                raise TrainwiseError(
                    f"dims[{name!r}][{dim}] must be a name such as 'sequence' (a Python identifier other than "
                    f"'batch') or None, got {str(symbol)[:40]!r}."
                )
    return free


def _symbol_sizes(free: list[dict[int, str]], inputs: tuple[torch.Tensor, ...]) -> dict[str, int]:
    """Each free dimension's name and its size in the example; one name with two sizes is refused."""
    sizes: dict[str, int] = {}
    for spec, tensor in zip(free, inputs):
        for dim, symbol in spec.items():
            size = tensor.shape[dim]
            if sizes.setdefault(symbol, size) != size:
                raise TrainwiseError(
                    f"the free dimension {symbol!r} is {sizes[symbol]} in one example input and {size} in another; "
                    "give them the same size, or name them differently with dims=."
                )
    return sizes


def _max_positions(model: nn.Module) -> int | None:
    """The longest sequence the model takes, when its configuration says (``config.max_position_embeddings``)."""
    for candidate in (model, getattr(model, "model", None)):
        value = getattr(getattr(candidate, "config", None), "max_position_embeddings", None)
        if type(value) is int and value > 1:
            return value
    return None


def _other_lengths(length: int, limit: int | None) -> list[int]:
    """Two other sizes of a free dimension to check parity at: longer and shorter, within the model's limit."""
    candidates = [length + 3, max(2, length // 2), length + 1]
    return [n for n in dict.fromkeys(candidates) if n != length and (limit is None or n <= limit)][:2]


def _resize_dims(inputs: tuple[torch.Tensor, ...], free: list[dict[int, str]], symbol: str,
                 size: int) -> tuple[torch.Tensor, ...]:
    """Inputs whose dimensions named ``symbol`` have ``size``: the example's entries along them repeated in
    turn (token ids stay in the vocabulary, masks stay masks)."""
    resized = []
    with torch.no_grad():
        for spec, tensor in zip(free, inputs):
            for dim, name in spec.items():
                if name == symbol:
                    index = torch.arange(size, device=tensor.device) % tensor.shape[dim]
                    tensor = tensor.detach().index_select(dim, index)
            resized.append(tensor)
    return tuple(resized)


def _specs(names: list[str], tensors: Sequence[torch.Tensor], free: list[dict[int, str]]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "shape": [spec.get(i, size) for i, size in enumerate(tensor.shape)],
            "dtype": str(tensor.dtype).removeprefix("torch."),
        }
        for name, tensor, spec in zip(names, tensors, free)
    ]


def _output_specs(checks: list[Check]) -> list[dict[str, Any]]:
    """Output shapes, with a free dimension's name where a dimension followed its size across the checks."""
    specs = []
    symbols = [s for s in checks[0].sizes if len({c.sizes.get(s) for c in checks}) > 1]
    for position, tensor in enumerate(checks[0].expected):
        shape: list[int | str] = list(tensor.shape)
        for dim in range(len(shape)):
            for symbol in symbols:
                if all(c.expected[position].dim() > dim and c.expected[position].shape[dim] == c.sizes[symbol]
                       for c in checks):
                    shape[dim] = symbol
                    break
        specs.append({"shape": shape, "dtype": str(tensor.dtype).removeprefix("torch.")})
    return specs


def _versions(format: str) -> dict[str, str]:
    versions = {"trainwise": __version__, "torch": torch.__version__, "python": sys.version.split()[0]}
    if format == "onnx":
        for package in ("onnx", "onnxscript", "onnxruntime"):
            with contextlib.suppress(ImportError):
                versions[package] = importlib.import_module(package).__version__
    return versions


def _dynamic_shapes(model: nn.Module, inputs: tuple[torch.Tensor, ...], free: list[dict[int, str]],
                    limits: Mapping[str, int | None]) -> tuple[Any, ...] | None:
    """The free dimensions of every input as ``torch.export.Dim`` symbols (one per name, shared by the inputs
    that have it, bounded by ``limits``), laid out as forward()'s parameters take the inputs: a
    ``forward(self, *inputs)`` (the ``outputs=`` wrapper's) takes them all as one argument. None: all fixed."""
    if not any(free):
        return None
    symbols: dict[str, Any] = {}
    for spec in free:
        for name in spec.values():
            if name not in symbols:
                limit = limits.get(name)
                symbols[name] = torch.export.Dim(name, max=limit) if limit else torch.export.Dim(name)
    shapes: list[Any] = [{dim: symbols[name] for dim, name in spec.items()} or None for spec in free]
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return tuple(shapes)
    for position, parameter in enumerate(parameters[: len(shapes)]):
        if parameter.kind is parameter.VAR_POSITIONAL:
            return (*shapes[:position], tuple(shapes[position:]))
        if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            break
    return tuple(shapes)


def _write_torch_export(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, shapes: Any, names: list[str], outputs: list[str]
) -> str:
    try:
        program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    except Exception as exc:
        raise _explain(exc, "torch.export") from exc
    # torch.export.save pickles tensor subclasses and custom objects, and load_exported refuses pickles (a .pt2
    # from elsewhere could hold any code there), so such an artifact could never be loaded: say so now.
    pickled = [
        name
        for name, value in {**program.state_dict, **program.constants}.items()
        if not (isinstance(value, torch.Tensor) and type(value.data) is torch.Tensor)  # torch's own rule
    ]
    if pickled:
        kinds = sorted({type(program.state_dict.get(n, program.constants.get(n))).__name__ for n in pickled})
        raise TrainwiseError(
            f"torch.export would pickle {', '.join(pickled[:5])} ({', '.join(kinds)}, not plain tensors), and "
            "load_exported refuses .pt2 files with pickles because they can run code; make them plain tensors "
            "(e.g. tensor.as_subclass(torch.Tensor)) or use format='torchscript'."
        )
    torch.export.save(program, str(path))
    try:  # the check load_exported makes: a refusal now names what to do, not "export again"
        check_archive(path.read_bytes())
    except Refused as refused:
        if refused.fix:  # an operator of another library: exporting again would write it again
            fix = (
                "use format='torchscript' (a program, trusted like code), calling the operator through torch.ops "
                "so that TorchScript records it, or write it with torch's own operators"
            )
        else:
            fix = "use format='torchscript' meanwhile, and please report this as a trainwise bug"
        raise TrainwiseError(
            f"torch.export wrote a .pt2 that load_exported would refuse ({refused.entry} {refused.what}); {fix}."
        ) from None
    return "export"


def _write_torchscript(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, shapes: Any, names: list[str], outputs: list[str]
) -> str:
    method = "script"
    with _quiet_jit():
        try:
            if isinstance(model, _SelectOutputs):
                raise TrainwiseError("outputs= is exported by tracing: the field selection cannot be scripted")
            compiled = torch.jit.script(model)
        except Exception as exc:
            warnings.warn(
                f"TorchScript scripting failed ({type(exc).__name__}: {first_line(exc)}), so the model was "
                "traced instead: tracing freezes data-dependent control flow (an if or loop on tensor values) "
                "at the branch the example inputs took; use format='torch.export' if the model has any.",
                ExportWarning,
                stacklevel=3,
            )
            method = "trace"
            try:
                compiled = torch.jit.trace(model, inputs)
            except Exception as trace_exc:
                raise TrainwiseError(
                    f"TorchScript can neither script ({first_line(exc)}) nor trace ({first_line(trace_exc)}) "
                    "this model; use format='torch.export'."
                ) from trace_exc
        try:
            torch.jit.save(compiled, str(path))
        except Exception as exc:  # e.g. a traced call of a Python function, which TorchScript cannot store
            reason = first_line(exc).split(". ")[0]
            raise TrainwiseError(
                f"TorchScript cannot save the {'scripted' if method == 'script' else 'traced'} model "
                f"({type(exc).__name__}: {reason}); use format='torch.export'."
            ) from exc
    return method


# Loggers that speak on a successful ONNX export: torch's registration (a warning per missing torchvision op)
# and onnxscript's constant folding ("Evaluation failed: cannot reshape array ...", for a node it leaves as it is).
_ONNX_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnxscript.optimizer._constant_folding")


@contextlib.contextmanager
def _quiet_onnx_logs() -> Iterator[None]:
    """Silence what the ONNX exporter says on a success (a failure is raised, and explained in one sentence)."""
    loggers = [logging.getLogger(name) for name in _ONNX_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _write_onnx(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, shapes: Any, names: list[str], outputs: list[str]
) -> str:
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    try:
        with _quiet_onnx_logs(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch-internal deprecations, nothing to act on
            warnings.simplefilter("ignore", FutureWarning)
            # free dimensions that share a name are one axis: torch says it renames none of them
            warnings.filterwarnings("ignore", message=r".*axis name: .* will not be used", category=UserWarning)
            torch.onnx.export(
                model,
                inputs,
                str(path),
                input_names=names,
                output_names=outputs,
                dynamic_shapes=shapes,
                dynamo=True,
                external_data=weights > _ONNX_WEIGHTS_INLINE_LIMIT,  # one self-contained file when it fits
                verbose=False,
            )
    except Exception as exc:
        raise _explain(exc, "onnx") from exc
    import onnx

    onnx.checker.check_model(str(path))
    return "dynamo"


def _explain(exc: BaseException, format: str) -> TrainwiseError:
    """One sentence for an export failure: the construct that failed, where, and the format that would work."""
    chain, seen = [], exc
    while seen is not None and len(chain) < _FIRST_CAUSES:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
    where = _user_frame(chain)
    if "GuardOnDataDependentSymNode" in text or "data-dependent" in text or "data dependent" in text:
        return TrainwiseError(
            f"{format} cannot export data-dependent control flow (a branch or loop on tensor values{where}); "
            "export with format='torchscript', whose scripting keeps the branch, or rewrite it with torch.cond."
        )
    if "specialized it to be a constant" in text or "specialized to be a constant" in text:
        return TrainwiseError(
            f"the model fixes a dimension that was to stay free to a constant{where} (a view or reshape with a "
            "literal batch size or length, for example); use -1 or x.shape[...] there, or fix that dimension: "
            "dynamic_batch=False for the batch, dims={name: {1: None}} for a sequence."
        )
    other = "torchscript" if format != "torchscript" else "torch.export"
    return TrainwiseError(
        f"{format} export failed{where} with {type(chain[-1]).__name__}: {first_line(chain[-1])}; try "
        f"format={other!r}."
    )


def _user_frame(chain: list[BaseException]) -> str:
    """`` at file:line (`code`)`` for the innermost frame outside torch and this module, if any."""
    skip = (str(Path(torch.__file__).parent), __file__, "<")
    for exc in chain:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)]
        if frames:
            frame = frames[-1]
            code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
            return f" at {frame.filename}:{frame.lineno}" + (f" `{code}`" if code else "")
    return ""
