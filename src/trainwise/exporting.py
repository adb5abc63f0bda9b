"""Export for deployment: artifacts that run without the model's source, verified against the eager model.

    report = trainwise.export(model, torch.randn(1, 1, 8, 8), "digits.pt2")   # torch.export, dynamic batch
    report = trainwise.export(model, example, "digits.torchscript", format="torchscript")
    report = trainwise.export(model, example, "digits.onnx", format="onnx")      # pip install trainwise[onnx]
    report = trainwise.export(bert, (ids, mask), "bert.pt2", outputs="logits")   # a field of a ModelOutput
    run = trainwise.load_exported("digits.pt2")                                  # no model class needed
    logits = run(torch.randn(5, 1, 8, 8))

Every export is made with the model in eval mode (each submodule's own mode is restored afterwards), written to a
staging folder, loaded back from disk and compared with the eager model at the example batch size and at two
others. Only an artifact within tolerance replaces the file at ``path``; a JSON sidecar ``<artifact>.json``
records the format, the inputs and outputs (``"batch"`` marks the dynamic dimension), versions and the parity
figures. Fundamental 11: a ``state_dict`` needs the training code, these artifacts do not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import linecache
import logging
import math
import os
import sys
import tempfile
import time
import traceback
import types
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from trainwise._version import __version__
from trainwise.checkpoint.io import atomic_write_json
from trainwise.errors import TrainwiseError
from trainwise.evaluation import restore_training_modes, training_modes
from trainwise.export_check import Refused, check_archive
from trainwise.export_check import is_plain_guard as _is_plain_guard  # noqa: F401  (imported from here by tests)
from trainwise.export_check import is_plain_sympy as _is_plain_sympy  # noqa: F401

Format = Literal["torch.export", "torchscript", "onnx"]
FORMATS: tuple[str, ...] = ("torch.export", "torchscript", "onnx")
SUFFIXES = {"torch.export": ".pt2", "torchscript": ".torchscript", "onnx": ".onnx"}  # what the CLI writes
_SUFFIX_FORMATS = {".pt2": "torch.export", ".torchscript": "torchscript", ".ts": "torchscript", ".onnx": "onnx"}
ONNX_INSTALL = "pip install trainwise[onnx]"
SIDECAR_VERSION = 1
_SIDECAR_LIMIT = 1 << 20  # bytes: export writes a few KiB
_SIDECAR_MAX_SPECS = 1024  # inputs or outputs
# (atol, rtol) by output dtype; a difference passes where |actual - expected| <= atol + rtol * |expected|.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}
_ONNX_WEIGHTS_INLINE_LIMIT = 1 << 30  # bytes of weights kept inside the .onnx file (protobuf caps files at 2 GiB)
_FIRST_CAUSES = 8  # how deep to look into an exception's __cause__ chain


class ExportWarning(UserWarning):
    """An export that works but may not mean what the user expects (TorchScript fell back to tracing)."""


class ExportParityError(TrainwiseError):
    """The exported artifact's outputs differ from the eager model's; nothing was written at the target path."""

    def __init__(self, message: str, *, report: ExportReport) -> None:
        super().__init__(message)
        self.report = report


@dataclasses.dataclass
class ExportReport:
    """What :func:`export` wrote and how closely the artifact reproduces the eager model.

    ``max_abs_diff`` and ``max_rel_diff`` are the largest differences over every output and every batch size in
    ``batch_sizes`` (relative: ``|actual - expected| / |expected|``, the denominator clamped at the dtype's eps).
    ``verified`` is False only for ONNX without onnxruntime installed: then nothing was run and the figures are
    ``None``.
    """

    path: Path
    sidecar: Path
    format: str
    method: str  # export (torch.export), script or trace (TorchScript), dynamo (torch.onnx.export(dynamo=True))
    dynamic_batch: bool
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    batch_sizes: tuple[int, ...]
    atol: float
    rtol: float
    max_abs_diff: float | None
    max_rel_diff: float | None
    verified: bool
    runtime: str  # what ran the artifact for the parity check
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["path"], data["sidecar"] = str(self.path), str(self.sidecar)
        data["batch_sizes"] = list(self.batch_sizes)
        return data

    def __str__(self) -> str:
        if not self.verified:
            parity = "parity NOT verified (onnxruntime is not installed)"
        else:
            parity = (
                f"parity at batch sizes {', '.join(map(str, self.batch_sizes))}: max abs diff "
                f"{self.max_abs_diff:.3g}, max rel diff {self.max_rel_diff:.3g} "
                f"(atol {self.atol:g}, rtol {self.rtol:g})"
            )
        shapes = ", ".join(f"{spec['name']} {_shape_text(spec['shape'])} {spec['dtype']}" for spec in self.inputs)
        label = {"script": "torchscript, scripted", "trace": "torchscript, TRACED"}.get(self.method, self.format)
        return f"wrote {self.path} ({label}; inputs {shapes}); {parity}"


# -- export ----------------------------------------------------------------------------------------------


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
) -> ExportReport:
    """Export ``model`` in eval mode to ``path``, check the artifact against the eager model, write ``path.json``.

    ``example_inputs`` is a tensor or a tuple of tensors passed positionally to ``forward``; with
    ``dynamic_batch`` (the default) the first dimension of every input is the batch and may differ at run time.
    Parity is checked at the example batch size and at ``check_batch_sizes`` (default: two others); ``atol`` and
    ``rtol`` default to :data:`TOLERANCES` for each output's dtype. Raises :class:`ExportParityError` (and leaves
    any existing file at ``path`` untouched) when the artifact differs by more than that.

    ``outputs`` exports the named fields of a model that returns a ``ModelOutput`` (Hugging Face), a dict or a
    dataclass: ``outputs="logits"`` makes the artifact return that tensor, several names a tuple in that order.
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
        raise TrainwiseError(f"folder {target.parent} does not exist; create it first or choose another path.")
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

    modes = training_modes(model)
    try:
        model.eval()  # dropout off, BatchNorm on its running statistics; restored in finally
        expected, single = _eager(model, inputs, names)
        checks: list[tuple[int | None, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = [
            (batch, inputs, expected)
        ]
        for size in sizes:
            resized = _resize_batch(inputs, size)
            checks.append((size, resized, _eager(model, resized, names)[0]))
        # A batch of 1 makes torch.export specialise the dimension to the constant 1 (its "0/1 specialisation"),
        # so the graph is captured from a batch of 2 built from the example instead.
        capture = _resize_batch(inputs, 2) if dynamic_batch and batch == 1 else inputs
        input_specs = _specs(names, inputs, dynamic_batch)
        output_specs = _output_specs(checks, dynamic_batch)
        output_names = list(selected) or _output_names(len(expected))
        output_specs = [{"name": n, **s} for n, s in zip(output_names, output_specs)]
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as staging:
            staged = Path(staging) / target.name
            writer = {"torch.export": _write_torch_export, "torchscript": _write_torchscript, "onnx": _write_onnx}
            method = writer[format](model, capture, staged, dynamic_batch, names, output_names)
            restore_training_modes(model, modes)  # the artifact is written; the model is no longer needed
            metadata = {
                "trainwise_export": SIDECAR_VERSION,
                "format": format,
                "artifact": target.name,
                "method": method,
                "dynamic_batch": dynamic_batch,
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
            f"{_a(type(output).__name__)}; drop outputs= and return a tensor or a tuple of tensors from forward()."
        )
    if not isinstance(value, torch.Tensor):
        kind = type(output).__name__
        what = "has no field" if value is None else f"has {_a(type(value).__name__)}, not a tensor, as"
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


_VOWEL_SOUND_LETTERS = "AEFHILMNORSX"  # the letters whose names start with a vowel sound: an MLP, an LSTM, a CNN


def _a(word: str) -> str:
    """``word`` after its indefinite article, chosen by sound: an ImageClassifierOutput, a SequenceClassifierOutput,
    an int, a dict, an MLP, a USBDevice, a UnionType."""
    if word[:2].isupper() and word[:2].isalpha():  # an acronym is spelled out letter by letter
        return f"{'an' if word[0] in _VOWEL_SOUND_LETTERS else 'a'} {word}"
    lower = word.lower()
    if lower.startswith(("uni", "use", "usu", "uti", "eu", "one")):
        return f"a {word}"
    if lower.startswith(("hour", "honest", "honor", "heir")):
        return f"an {word}"
    return f"{'an' if lower[:1] in tuple('aeiou') else 'a'} {word}"


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
        reason = _first_line(exc)
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
            f"the model returns {_a(kind)} with the tensor fields {', '.join(fields)}, but an exported model returns "
            f"a tensor or a tuple of tensors; pass outputs={fields[0]!r} to export that field{several}."
        )
    if isinstance(output, (tuple, list)):
        inner = sorted({type(item).__name__ for item in output if not isinstance(item, torch.Tensor)})
        kind = f"{kind} holding {', '.join(inner) or 'nothing'}"
    raise TrainwiseError(
        f"the model returns {_a(kind)}, but an exported model returns a tensor or a tuple of tensors; make "
        "forward() return that (or wrap the model in a module whose forward() does)."
    )


def _tensor_text(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def _shape_text(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _specs(names: list[str], tensors: Sequence[torch.Tensor], dynamic: bool) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "shape": ["batch" if dynamic and i == 0 else size for i, size in enumerate(tensor.shape)],
            "dtype": str(tensor.dtype).removeprefix("torch."),
        }
        for name, tensor in zip(names, tensors)
    ]


def _output_specs(checks: list[Any], dynamic: bool) -> list[dict[str, Any]]:
    """Output shapes, with ``"batch"`` where a dimension followed the input batch size across the checks."""
    specs = []
    for position, tensor in enumerate(checks[0][2]):
        shape: list[int | str] = list(tensor.shape)
        if dynamic and len(checks) > 1:
            for dim in range(len(shape)):
                if all(c[2][position].dim() > dim and c[2][position].shape[dim] == c[0] for c in checks):
                    shape[dim] = "batch"
        specs.append({"shape": shape, "dtype": str(tensor.dtype).removeprefix("torch.")})
    return specs


def _versions(format: str) -> dict[str, str]:
    versions = {"trainwise": __version__, "torch": torch.__version__, "python": sys.version.split()[0]}
    if format == "onnx":
        for package in ("onnx", "onnxscript", "onnxruntime"):
            with contextlib.suppress(ImportError):
                versions[package] = importlib.import_module(package).__version__
    return versions


# -- the three writers -------------------------------------------------------------------------------------


def _dynamic_shapes(model: nn.Module, inputs: tuple[torch.Tensor, ...], dynamic: bool) -> tuple[Any, ...] | None:
    """Dimension 0 of every input is the batch, laid out as forward()'s parameters take the inputs: a
    ``forward(self, *inputs)`` (the ``outputs=`` wrapper's) takes them all as one argument."""
    if not dynamic:
        return None
    batch = torch.export.Dim("batch")  # one symbol shared by every input: they have the same batch
    shapes: list[Any] = [{0: batch} for _ in inputs]
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
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, dynamic: bool, names: list[str], outputs: list[str]
) -> str:
    try:
        program = torch.export.export(model, inputs, dynamic_shapes=_dynamic_shapes(model, inputs, dynamic))
    except Exception as exc:
        raise _explain(exc, "torch.export", dynamic) from exc
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


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """Hide torch's "torch.jit.* is deprecated" warnings: the user asked for TorchScript (docs/export.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        yield


def _write_torchscript(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, dynamic: bool, names: list[str], outputs: list[str]
) -> str:
    method = "script"
    with _quiet_jit():
        try:
            if isinstance(model, _SelectOutputs):
                raise TrainwiseError("outputs= is exported by tracing: the field selection cannot be scripted")
            compiled = torch.jit.script(model)
        except Exception as exc:
            warnings.warn(
                f"TorchScript scripting failed ({type(exc).__name__}: {_first_line(exc)}), so the model was "
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
                    f"TorchScript can neither script ({_first_line(exc)}) nor trace ({_first_line(trace_exc)}) "
                    "this model; use format='torch.export'."
                ) from trace_exc
        try:
            torch.jit.save(compiled, str(path))
        except Exception as exc:  # e.g. a traced call of a Python function, which TorchScript cannot store
            reason = _first_line(exc).split(". ")[0]
            raise TrainwiseError(
                f"TorchScript cannot save the {'scripted' if method == 'script' else 'traced'} model "
                f"({type(exc).__name__}: {reason}); use format='torch.export'."
            ) from exc
    return method


@contextlib.contextmanager
def _quiet_onnx_logs() -> Iterator[None]:
    """torch's ONNX exporter logs a warning per missing torchvision op on every export; silence that logger."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _write_onnx(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, dynamic: bool, names: list[str], outputs: list[str]
) -> str:
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    try:
        with _quiet_onnx_logs(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch-internal deprecations, nothing to act on
            warnings.simplefilter("ignore", FutureWarning)
            torch.onnx.export(
                model,
                inputs,
                str(path),
                input_names=names,
                output_names=outputs,
                dynamic_shapes=_dynamic_shapes(model, inputs, dynamic),
                dynamo=True,
                external_data=weights > _ONNX_WEIGHTS_INLINE_LIMIT,  # one self-contained file when it fits
                verbose=False,
            )
    except Exception as exc:
        raise _explain(exc, "onnx", dynamic) from exc
    import onnx

    onnx.checker.check_model(str(path))
    return "dynamo"


def _explain(exc: BaseException, format: str, dynamic: bool) -> TrainwiseError:
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
            f"the model fixes the batch dimension to a constant{where} (a view or reshape with a literal batch "
            "size, for example), so it cannot have a dynamic batch; use -1 or x.shape[0] there, or pass "
            "dynamic_batch=False."
        )
    other = "torchscript" if format != "torchscript" else "torch.export"
    return TrainwiseError(
        f"{format} export failed{where} with {type(chain[-1]).__name__}: {_first_line(chain[-1])}; try "
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


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__).rstrip(".")[:300]


# -- parity --------------------------------------------------------------------------------------------------


def _verify(
    staged: Path,
    metadata: dict[str, Any],
    checks: list[tuple[int | None, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]],
    *,
    atol: float | None,
    rtol: float | None,
) -> ExportReport:
    format = metadata["format"]
    first = checks[0][2][0]
    default_atol, default_rtol = TOLERANCES.get(first.dtype, (0.0, 0.0))
    report = ExportReport(
        path=staged,
        sidecar=_sidecar_path(staged),
        format=format,
        method=metadata["method"],
        dynamic_batch=metadata["dynamic_batch"],
        inputs=metadata["inputs"],
        outputs=metadata["outputs"],
        batch_sizes=tuple(size for size, _, _ in checks if size is not None),
        atol=default_atol if atol is None else atol,
        rtol=default_rtol if rtol is None else rtol,
        max_abs_diff=None,
        max_rel_diff=None,
        verified=False,
        runtime="",
    )
    if format == "onnx" and not _installed("onnxruntime"):
        warnings.warn(
            f"the ONNX artifact was checked with onnx.checker but not run: onnxruntime is not installed, so "
            f"parity with the eager model is unverified; {ONNX_INSTALL} to check it.",
            ExportWarning,
            stacklevel=3,
        )
        report.runtime = "none (onnxruntime not installed)"
        return report
    loaded = _load(staged, format, None, metadata)  # the sidecar is written only once parity holds
    report.runtime = loaded.runtime
    worst_abs = worst_rel = 0.0
    for size, inputs, expected in checks:
        at = f" at batch size {size}" if size is not None else ""
        try:
            actual = loaded.run_tuple(*inputs)
        except Exception as exc:
            raise ExportParityError(
                f"the {format} artifact fails{at} with {type(exc).__name__}: {_first_line(exc)}, so the export "
                "froze a shape the eager model keeps free; pass dynamic_batch=False or use format='torch.export'.",
                report=report,
            ) from exc
        if len(actual) != len(expected):
            raise ExportParityError(
                f"the {format} artifact returns {len(actual)} outputs{at} where the eager model returns "
                f"{len(expected)}; return a flat tuple of tensors from forward().",
                report=report,
            )
        for position, (got, want) in enumerate(zip(actual, expected)):
            got, want = got.detach().cpu(), want.detach().cpu()
            if got.shape != want.shape:
                raise ExportParityError(
                    f"the {format} artifact returns shape {tuple(got.shape)} for output {position}{at} where the "
                    f"eager model returns {tuple(want.shape)}; pass dynamic_batch=False or use "
                    "format='torch.export'.",
                    report=report,
                )
            out_atol, out_rtol = TOLERANCES.get(want.dtype, (0.0, 0.0))
            out_atol = out_atol if atol is None else atol
            out_rtol = out_rtol if rtol is None else rtol
            abs_diff, rel_diff, ok = _difference(got, want, out_atol, out_rtol)
            worst_abs, worst_rel = max(worst_abs, abs_diff), max(worst_rel, rel_diff)
            report.max_abs_diff, report.max_rel_diff = worst_abs, worst_rel
            if not ok:
                raise ExportParityError(
                    f"the {format} artifact differs from the eager model by up to {abs_diff:.3g} (relative "
                    f"{rel_diff:.3g}) on output {position}{at}, above atol={out_atol:g}, rtol={out_rtol:g}; if "
                    "that is expected (reduced precision, fused kernels) pass a looser atol or rtol, otherwise "
                    f"try another format than {format!r}.",
                    report=report,
                )
    report.verified = True
    return report


def _difference(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> tuple[float, float, bool]:
    """(max absolute, max relative difference, within ``atol + rtol * |expected|`` everywhere)."""
    if actual.numel() == 0:
        return 0.0, 0.0, True
    a, e = actual.to(torch.float64), expected.to(torch.float64)
    both_nan = a.isnan() & e.isnan()
    same_inf = a.isinf() & (a == e)
    diff = (a - e).abs().masked_fill(both_nan | same_inf, 0.0).nan_to_num(nan=math.inf)
    eps = torch.finfo(expected.dtype).eps if expected.is_floating_point() else 1.0
    rel = diff / e.abs().nan_to_num(nan=0.0, posinf=math.inf).clamp(min=eps)
    ok = bool((diff <= atol + rtol * e.abs().nan_to_num(nan=0.0)).all())
    return float(diff.max()), float(rel.max()), ok


# -- loading -------------------------------------------------------------------------------------------------


class NotAnArtifactError(TrainwiseError):
    """:func:`load_exported` was given a checkpoint (``torch.save`` or safetensors weights), not an artifact.

    ``kind`` says which (``"trainwise training checkpoint"``, ``"state dict"``...), ``path`` is the file and
    ``shapes`` the shape of each weight found in it (``{}`` when none was), for a caller that names the export.
    """

    def __init__(self, message: str, *, path: Path, kind: str, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__(message)
        self.path, self.kind, self.shapes = path, kind, shapes


class ExportedModel:
    """A loaded artifact: call it with tensors (or NumPy arrays) like the original model.

    Returns a tensor when the model returned one, else a tuple of tensors. With a sidecar next to the artifact,
    the inputs are checked first against the recorded names, dtypes and shapes, so a mistake reads as one
    sentence rather than a runtime's internal error.
    """

    def __init__(
        self, path: Path, format: str, metadata: dict[str, Any], run: Callable[..., Any], runtime: str, device: Any
    ) -> None:
        self.path = path
        self.format = format
        self.metadata = metadata
        self.runtime = runtime
        self.device = device
        self._run = run

    @property
    def input_names(self) -> list[str]:
        return [spec["name"] for spec in self.metadata.get("inputs", [])]

    def __repr__(self) -> str:
        return f"ExportedModel({str(self.path)!r}, format={self.format!r})"

    def __call__(self, *inputs: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outputs = self.run_tuple(*inputs)
        if self.metadata.get("single_output", len(outputs) == 1) and len(outputs) == 1:
            return outputs[0]
        return outputs

    def run_tuple(self, *inputs: Any) -> tuple[torch.Tensor, ...]:
        """The outputs as a tuple, whatever the model returned."""
        tensors = tuple(torch.as_tensor(x) if isinstance(x, np.ndarray) else x for x in inputs)
        _check_inputs(tensors, self.metadata.get("inputs"), self.path)
        outputs = self._run(*tensors)
        if isinstance(outputs, torch.Tensor):
            return (outputs,)
        return tuple(outputs)


def load_exported(
    path: str | os.PathLike[str],
    *,
    format: Format | None = None,
    device: str | torch.device | None = None,
) -> ExportedModel:
    """Load an artifact written by :func:`export` (or any .pt2, TorchScript or .onnx file) as a callable.

    The format comes from ``format``, else the sidecar ``path.json``, else the file suffix (.pt2, .torchscript or
    .ts, .onnx). ``device`` moves a torch.export or TorchScript artifact (``"cpu"`` loads a GPU export on a
    machine without one) and picks onnxruntime's CUDA provider for ``"cuda"``. No model class is imported.

    A ``.pt2`` is checked before torch reads it and refused (TrainwiseError naming the entry) unless it holds only
    what ``torch.export.save`` writes for a plain model: no pickles that torch would load with
    ``weights_only=False``, no native code, aten operators only and no Python source in names, shape expressions
    or guards, so loading one from elsewhere runs no code. TorchScript and ONNX files are programs: load those only
    from sources you trust like code (docs/security.md). A damaged artifact or sidecar is one sentence too, and a
    checkpoint given in place of an artifact (a ``torch.save`` or safetensors file, whatever its name) is refused
    with :class:`NotAnArtifactError`, read with ``weights_only=True`` only to say what it is.
    """
    artifact = Path(path)
    if not artifact.is_file():
        raise TrainwiseError(
            f"no exported model at {artifact}; check the path (trainwise export, or trainwise.export() in Python, "
            "writes one)."
        )
    return _load(artifact, format, device, _read_sidecar(artifact))


def _load(
    artifact: Path, format: str | None, device: str | torch.device | None, metadata: dict[str, Any]
) -> ExportedModel:
    _refuse_checkpoint(artifact)
    by_suffix = _SUFFIX_FORMATS.get(artifact.suffix.lower())
    recorded = metadata.get("format")
    if format is None and recorded is not None and by_suffix is not None and recorded != by_suffix:
        # A sidecar must not turn a .pt2 (data) into a TorchScript or ONNX load (programs) behind the user's back.
        raise TrainwiseError(
            f"sidecar {_sidecar_path(artifact).name} says format {recorded!r} but the suffix {artifact.suffix!r} "
            f"says {by_suffix!r}; delete the sidecar or pass format= explicitly."
        )
    format = format or recorded or by_suffix
    if format not in FORMATS:
        raise TrainwiseError(
            f"cannot tell the format of {artifact} (no sidecar {_sidecar_path(artifact).name}, suffix "
            f"{artifact.suffix!r}); pass format= one of {', '.join(FORMATS)}."
        )
    try:
        target = None if device is None else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise TrainwiseError(f"device {device!r} is not a torch device; pass e.g. 'cpu' or 'cuda'.") from None
    if format == "torch.export":
        return _load_torch_export(artifact, metadata, target)
    if format == "torchscript":
        return _load_torchscript(artifact, metadata, target)
    return _load_onnx(artifact, metadata, target)


def _refuse_checkpoint(artifact: Path) -> None:
    """Raise :class:`NotAnArtifactError` when ``artifact`` is a checkpoint written by ``torch.save`` (or
    safetensors weights) rather than an exported model, whatever its name says.

    The first bytes and the zip directory tell a ``torch.save`` file from a ``.pt2`` or TorchScript archive (a
    TorchScript archive has ``code/``); what it holds is read with ``weights_only=True``, so nothing in it runs.
    """
    from trainwise.checkpoint.io import SAFETENSORS, TORCH_ZIP, detect_format, safe_load
    from trainwise.checkpoint.state import is_trainwise_checkpoint
    from trainwise.checkpoint.weights import find_weights, is_state_dict

    try:
        kind = detect_format(artifact)
    except TrainwiseError:  # not a checkpoint in any format: the artifact's own loader says what it is
        return
    if kind == TORCH_ZIP:
        try:
            with zipfile.ZipFile(artifact) as archive:
                names = archive.namelist()
        except Exception:  # a damaged zip: left to the loader's own sentence
            return
        root = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
        if (not root or f"{root}/data.pkl" not in names or f"{root}/constants.pkl" in names
                or any(not name.startswith(f"{root}/") or name.startswith(f"{root}/code/") for name in names)):
            return  # a .pt2 or TorchScript archive (or neither): not a torch.save file
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a name that says another format: the content decides here
            content = safe_load(artifact)
    except TrainwiseError:
        if kind == SAFETENSORS:  # only its first bytes looked like safetensors: the loader says what it is
            return
        content = None  # a torch.save file needing classes weights_only refuses: still not an artifact
    if is_trainwise_checkpoint(content):
        what = "trainwise training checkpoint"
    elif kind == SAFETENSORS:
        what = "safetensors weights file"
    elif is_state_dict(content):
        what = "state dict (a weights file)"
    else:
        what = "checkpoint saved with torch.save"
    found = find_weights(content) if content is not None else None
    shapes = {
        str(key): tuple(value.shape)
        for key, value in (found[1].items() if found else ())
        if isinstance(value, torch.Tensor)
    }
    raise NotAnArtifactError(
        f"{artifact} is {_a(what)}, not an exported model; make an artifact from it with trainwise export "
        f"{artifact} --model package.module:factory --example-shape N,... (or trainwise.export in Python).",
        path=artifact,
        kind=what,
        shapes=shapes,
    )


def _no_grad(function: Callable[..., Any]) -> Callable[..., Any]:
    def run(*inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            return function(*inputs)

    return run


def _unreadable(artifact: Path, kind: str, exc: BaseException) -> TrainwiseError:
    """One sentence for an artifact that its runtime cannot read (empty, truncated, not that format at all)."""
    reason = _first_line(exc).split(". ")[0][:160]  # runtimes append advice in further sentences
    return TrainwiseError(
        f"{artifact} is not a readable {kind} file ({type(exc).__name__}: {reason}); export the model again with "
        "trainwise export (or check that the file was copied completely)."
    )


def _load_torchscript(artifact: Path, metadata: dict[str, Any], device: torch.device | None) -> ExportedModel:
    # A TorchScript file is a program: torch.jit.load compiles its code and runs its __setstate__ methods. It is
    # trusted like code (docs/security.md); here only unreadable files are turned into one sentence.
    try:
        with _quiet_jit():
            module = torch.jit.load(str(artifact), map_location=device)
        module.eval()
    except Exception as exc:
        raise _unreadable(artifact, "TorchScript", exc) from None
    return ExportedModel(artifact, "torchscript", metadata, _no_grad(module), f"torch {torch.__version__}", device)


def _load_torch_export(artifact: Path, metadata: dict[str, Any], device: torch.device | None) -> ExportedModel:
    """Check the archive (see :func:`_check_pt2`), then load those same bytes with torch.export.load."""
    try:
        data = artifact.read_bytes()
    except OSError as exc:
        raise TrainwiseError(f"cannot read {artifact} ({exc.strerror or exc}); check the file's permissions.") from None
    _check_pt2(data, artifact)
    try:
        with _quiet_torch_export_load():
            program = torch.export.load(io.BytesIO(data))  # the checked bytes, not the file again
            if device is not None:
                from torch.export.passes import move_to_device_pass

                program = move_to_device_pass(program, device)
            module = program.module()
    except TrainwiseError:
        raise
    except Exception as exc:
        raise _unreadable(artifact, ".pt2 (torch.export)", exc) from None
    return ExportedModel(artifact, "torch.export", metadata, _no_grad(module), f"torch {torch.__version__}", device)


@contextlib.contextmanager
def _quiet_torch_export_load() -> Iterator[None]:
    """torch.export.load logs a multi-line traceback and warns before it raises; the error says it in one line."""
    loggers = [logging.getLogger(name) for name in ("torch.export", "torch._export")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _load_onnx(artifact: Path, metadata: dict[str, Any], device: torch.device | None) -> ExportedModel:
    ort = _require("onnxruntime", "Running an ONNX artifact")
    providers = ["CPUExecutionProvider"]
    if device is not None and device.type == "cuda":
        providers.insert(0, "CUDAExecutionProvider")
    try:
        session = ort.InferenceSession(str(artifact), providers=providers)
    except Exception as exc:
        raise _unreadable(artifact, "ONNX", exc) from None
    names = [node.name for node in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(names):
            raise TrainwiseError(f"{artifact.name} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}.")
        feed = {name: tensor.detach().cpu().numpy() for name, tensor in zip(names, inputs)}
        return tuple(torch.from_numpy(np.asarray(out)) for out in session.run(None, feed))

    return ExportedModel(artifact, "onnx", metadata, run, f"onnxruntime {ort.__version__}", device)


# -- untrusted .pt2 archives ---------------------------------------------------------------------------------


def _check_pt2(data: bytes, artifact: Path) -> None:
    """Raise TrainwiseError (one sentence naming the entry) unless ``data`` is a plain torch.export.save archive
    (trainwise.export_check says what that means)."""
    try:
        check_archive(data)
    except Refused as refused:
        if refused.unsafe:
            fix = refused.fix or "export the model again with trainwise export"
            raise TrainwiseError(
                f"refusing to load {artifact}: {refused.entry} {refused.what}, a way for a crafted file to run "
                f"code; {fix}."
            ) from None
        raise TrainwiseError(
            f"{artifact} is not a readable .pt2 archive ({refused.entry} {refused.what}); export the model again "
            "with trainwise export (or check that the file was copied completely)."
        ) from None
    except Exception as exc:  # zipfile, miniz and json on damaged bytes: nothing of the archive has run
        raise _unreadable(artifact, ".pt2 (torch.export)", exc) from None


def _check_inputs(inputs: tuple[Any, ...], specs: list[dict[str, Any]] | None, artifact: Path) -> None:
    for position, tensor in enumerate(inputs):
        if not isinstance(tensor, torch.Tensor):
            raise TrainwiseError(
                f"input {position} is of type {type(tensor).__name__}; pass tensors or NumPy arrays to {artifact.name}."
            )
    if not specs:
        return
    if len(inputs) != len(specs):
        names = ", ".join(spec["name"] for spec in specs)
        raise TrainwiseError(f"{artifact.name} takes {len(specs)} input(s) ({names}), got {len(inputs)}.")
    for tensor, spec in zip(inputs, specs):
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype != spec["dtype"]:
            raise TrainwiseError(
                f"input {spec['name']!r} of {artifact.name} must be {spec['dtype']}, got {dtype}; convert it "
                f"(tensor.to(torch.{spec['dtype']}) or array.astype('{spec['dtype']}'))."
            )
        shape = list(tensor.shape)
        expected = spec["shape"]
        fits = len(shape) == len(expected) and all(want == "batch" or want == got for want, got in zip(expected, shape))
        if not fits:
            hint = " (add the batch dimension: x[None] for one sample)" if len(shape) == len(expected) - 1 else ""
            raise TrainwiseError(
                f"input {spec['name']!r} of {artifact.name} must have shape {_shape_text(expected)}, got "
                f"{_shape_text(shape)}; reshape it{hint}."
            )


def _sidecar_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".json")


def _read_sidecar(artifact: Path) -> dict[str, Any]:
    """The sidecar's metadata, checked (it may come with an artifact from elsewhere); {} when there is none."""
    sidecar = _sidecar_path(artifact)
    if not sidecar.is_file():
        return {}
    try:
        if sidecar.stat().st_size > _SIDECAR_LIMIT:
            raise TrainwiseError(
                f"sidecar {sidecar} is over 1 MiB, far more than export writes; delete it or export again."
            )
        data = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise TrainwiseError(
            f"sidecar {sidecar} is unreadable ({type(exc).__name__}: {_first_line(exc)}); delete it or export again."
        ) from None
    problem = _sidecar_problem(data)
    if problem:
        raise TrainwiseError(f"sidecar {sidecar} is malformed ({problem}); delete it or export the model again.")
    return data


def _sidecar_problem(data: Any) -> str | None:
    """What is wrong with a sidecar's structure, as a clause; None when it is what :func:`export` writes."""
    if not isinstance(data, dict):
        return f"its top level is a JSON {type(data).__name__}, not an object"
    for key in ("format", "inputs", "outputs"):
        if key not in data:
            return f"the key {key!r} is missing"
    if data["format"] not in FORMATS:
        return f"format is {str(data['format'])[:40]!r}, not one of {', '.join(FORMATS)}"
    for key in ("single_output", "dynamic_batch"):
        if key in data and not isinstance(data[key], bool):
            return f"{key} must be true or false"
    for key in ("inputs", "outputs"):
        specs = data[key]
        if not isinstance(specs, list) or len(specs) > _SIDECAR_MAX_SPECS:
            return f"{key} must be a list of at most {_SIDECAR_MAX_SPECS} tensor specs"
        for position, spec in enumerate(specs):
            where = f"{key}[{position}]"
            if not isinstance(spec, dict):
                return f"{where} must be an object with name, shape and dtype"
            name, shape, dtype = spec.get("name"), spec.get("shape"), spec.get("dtype")
            if not isinstance(name, str) or not 0 < len(name) <= 200:
                return f"{where}.name must be a non-empty string"
            if not isinstance(dtype, str) or not isinstance(vars(torch).get(dtype), torch.dtype):
                return f"{where}.dtype must name a torch dtype such as 'float32'"
            sizes_ok = isinstance(shape, list) and len(shape) <= 64
            if not sizes_ok or not all(size == "batch" or (type(size) is int and size >= 0) for size in shape):
                return f"{where}.shape must be a list of sizes and 'batch'"
    return None


def _require(package: str, purpose: str) -> types.ModuleType:
    """Import an optional dependency, or say in one sentence how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise TrainwiseError(
            f"{purpose} needs the {package} package, which is not installed; {ONNX_INSTALL}."
        ) from None


def _installed(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True
