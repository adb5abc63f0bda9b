"""Export for deployment: artifacts that run without the model's source, verified against the eager model.

    report = trainwise.export(model, torch.randn(1, 1, 8, 8), "digits.pt2")   # torch.export, dynamic batch
    report = trainwise.export(model, example, "digits.torchscript", format="torchscript")
    report = trainwise.export(model, example, "digits.onnx", format="onnx")      # pip install trainwise[onnx]
    run = trainwise.load_exported("digits.pt2")                                  # no model class needed
    logits = run(torch.randn(5, 1, 8, 8))

Every export is made with the model in eval mode (each submodule's own mode is restored afterwards), written to a
staging folder, loaded back from disk and compared with the eager model at the example batch size and at two
others. Only an artifact within tolerance replaces the file at ``path``; a JSON sidecar ``<artifact>.json``
records the format, the inputs and outputs (``"batch"`` marks the dynamic dimension), versions and the parity
figures. Fundamental 11: a ``state_dict`` needs the training code, these artifacts do not.
"""

from __future__ import annotations

import ast
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
import re
import sys
import tempfile
import time
import traceback
import types
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from trainwise import __version__
from trainwise.checkpoint.io import atomic_write_json
from trainwise.errors import TrainwiseError
from trainwise.evaluation import restore_training_modes, training_modes

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
) -> ExportReport:
    """Export ``model`` in eval mode to ``path``, check the artifact against the eager model, write ``path.json``.

    ``example_inputs`` is a tensor or a tuple of tensors passed positionally to ``forward``; with
    ``dynamic_batch`` (the default) the first dimension of every input is the batch and may differ at run time.
    Parity is checked at the example batch size and at ``check_batch_sizes`` (default: two others); ``atol`` and
    ``rtol`` default to :data:`TOLERANCES` for each output's dtype. Raises :class:`ExportParityError` (and leaves
    any existing file at ``path`` untouched) when the artifact differs by more than that.
    """
    started = time.perf_counter()
    if format not in FORMATS:
        raise TrainwiseError(f"unknown export format {format!r}; use one of {', '.join(FORMATS)}.")
    if not isinstance(model, nn.Module):
        raise TrainwiseError(f"export() needs a torch.nn.Module, got {type(model).__name__}; pass the model itself.")
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
        output_specs = [{"name": n, **s} for n, s in zip(_output_names(len(expected)), output_specs)]
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as staging:
            staged = Path(staging) / target.name
            writer = {"torch.export": _write_torch_export, "torchscript": _write_torchscript, "onnx": _write_onnx}
            method = writer[format](model, capture, staged, dynamic_batch, names, len(expected))
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
    if isinstance(output, (tuple, list)):
        inner = sorted({type(item).__name__ for item in output if not isinstance(item, torch.Tensor)})
        kind = f"{kind} holding {', '.join(inner) or 'nothing'}"
    raise TrainwiseError(
        f"the model returns a {kind}, but an exported model returns a tensor or a tuple of tensors; make "
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


def _dynamic_shapes(inputs: tuple[torch.Tensor, ...], dynamic: bool) -> tuple[dict[int, Any], ...] | None:
    if not dynamic:
        return None
    batch = torch.export.Dim("batch")  # one symbol shared by every input: they have the same batch
    return tuple({0: batch} for _ in inputs)


def _write_torch_export(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, dynamic: bool, names: list[str], n_out: int
) -> str:
    try:
        program = torch.export.export(model, inputs, dynamic_shapes=_dynamic_shapes(inputs, dynamic))
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
    return "export"


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """Hide torch's "torch.jit.* is deprecated" warnings: the user asked for TorchScript (docs/export.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        yield


def _write_torchscript(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, dynamic: bool, names: list[str], n_out: int
) -> str:
    method = "script"
    with _quiet_jit():
        try:
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
        torch.jit.save(compiled, str(path))
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
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, dynamic: bool, names: list[str], n_out: int
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
                output_names=_output_names(n_out),
                dynamic_shapes=_dynamic_shapes(inputs, dynamic),
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
        f"{artifact} is a {what}, not an exported model; make an artifact from it with trainwise export "
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
#
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
_PT2_OPERATOR = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_]\w{0,200})\.([A-Za-z_]\w{0,200})")
_PT2_HOP = re.compile(r"torch\.ops\.higher_order\.(\w{1,200})")
_PT2_SYM_OPS = {  # what torch's serializer writes for the _SYM_OPS of torch._export.serde.serialize
    *(f"_operator.{name}" for name in (
        "add", "and_", "eq", "floordiv", "ge", "gt", "le", "lshift", "lt", "mod", "mul", "ne", "neg", "or_", "pos",
        "pow", "rshift", "sub", "truediv",
    )),
    "math.trunc", "torch._sym_sqrt", "torch.sym_float", "torch.sym_int", "torch.sym_ite", "torch.sym_max",
    "torch.sym_min", "torch.sym_not", "torch.sym_sqrt",
}  # fmt: skip
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


class _Refused(Exception):
    """An archive that must not reach torch.export.load: ``entry`` and a phrase saying what it holds."""

    def __init__(self, entry: str, what: str, *, unsafe: bool = True) -> None:
        super().__init__(entry, what)
        self.entry, self.what, self.unsafe = entry, what, unsafe


def _check_pt2(data: bytes, artifact: Path) -> None:
    """Raise TrainwiseError (one sentence naming the entry) unless ``data`` is a plain torch.export.save archive."""
    try:
        _check_pt2_archive(data)
    except _Refused as refused:
        if refused.unsafe:
            raise TrainwiseError(
                f"refusing to load {artifact}: {refused.entry} {refused.what}, a way for a crafted file to run "
                "code; export the model again with trainwise export."
            ) from None
        raise TrainwiseError(
            f"{artifact} is not a readable .pt2 archive ({refused.entry} {refused.what}); export the model again "
            "with trainwise export (or check that the file was copied completely)."
        ) from None
    except Exception as exc:  # zipfile, miniz and json on damaged bytes: nothing of the archive has run
        raise _unreadable(artifact, ".pt2 (torch.export)", exc) from None


def _check_pt2_archive(data: bytes) -> None:
    if not data:
        raise _Refused("the file", "is empty", unsafe=False)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise _Refused("the file", "is not a zip archive", unsafe=False) from None
    with archive:
        infos = archive.infolist()
        if not infos:
            raise _Refused("the archive", "has no entries", unsafe=False)
        root = infos[0].filename.split("/", 1)[0] if "/" in infos[0].filename else ""
        names: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = _pt2_entry_name(info.filename, root)
            if name in names:
                raise _Refused(info.filename, "appears twice in the archive")
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                raise _Refused(
                    info.filename, "is compressed or encrypted, which torch.export.save never writes", unsafe=False
                )
            names[name] = info
    for required in (*sorted(_PT2_ROOT_ENTRIES - {".data/serialization_id"}), _PT2_MODEL, _PT2_WEIGHTS_CONFIG,
                     _PT2_CONSTANTS_CONFIG, _PT2_SAMPLE_INPUTS):  # fmt: skip
        if required not in names:
            raise _Refused(required, "is missing", unsafe=False)
    # torch reads the archive with its own zip reader (miniz): it must see exactly the entries checked here.
    reader = torch._C.PyTorchFileReader(io.BytesIO(data))
    if set(reader.get_all_records()) != set(names):
        raise _Refused("the zip directory", "lists other entries than torch's own zip reader sees")

    def record(name: str) -> bytes:
        if reader.get_record_size(name) > _PT2_JSON_LIMIT:
            raise _Refused(name, "is too large", unsafe=False)
        return reader.get_record(name)

    if record("archive_format") != b"pt2":
        raise _Refused("archive_format", "does not say pt2", unsafe=False)
    if record("archive_version") != b"0":
        raise _Refused("archive_version", "is not 0, the version this check knows", unsafe=False)
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
        raise _Refused(repr(filename), what, unsafe=filename in _PT2_LEGACY)
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
        raise _Refused(repr(name), "is not an entry torch.export.save writes for a plain model", unsafe=False)
    raise _Refused(repr(name), what)


def _json_entry(record: Callable[[str], bytes], name: str) -> Any:
    try:
        return json.loads(record(name).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _Refused(name, f"is not JSON ({_first_line(exc)})", unsafe=False) from None


def _check_payload_config(
    record: Callable[[str], bytes], name: str, folder: str, prefix: str, sizes: dict[str, int]
) -> None:
    """Every entry a raw tensor (never ``use_pickle``) whose bytes are all in the archive."""
    config = _json_entry(record, name)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise _Refused(name, "has no config mapping", unsafe=False)
    dtypes: dict[str, Any] = {}
    for fqn, meta in entries.items():
        where = f"{name} entry {str(fqn)[:80]!r}"
        if not _is_safe_name(fqn):
            raise _Refused(where, "is not a plain attribute path, yet torch would set it on a module")
        if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
            raise _Refused(where, "has no path_name", unsafe=False)
        path = meta["path_name"]
        if meta.get("use_pickle") is not False:
            raise _Refused(where, f"asks torch to unpickle {folder}{path[:80]} with weights_only=False (use_pickle)")
        if not path.startswith(prefix) or f"{folder}{path}" not in sizes:
            raise _Refused(where, f"points to {folder}{path[:80]!r}, which is not a tensor file of the archive")
        dtype, nbytes = _check_tensor_meta(meta.get("tensor_meta"), where)
        if dtypes.setdefault(path, dtype) is not dtype:
            raise _Refused(where, "reads a shared tensor file with another dtype", unsafe=False)
        if nbytes > sizes[f"{folder}{path}"]:
            raise _Refused(where, "describes a tensor larger than its file", unsafe=False)


def _check_tensor_meta(meta: Any, where: str) -> tuple[torch.dtype, int]:
    """The dtype and the bytes the strided tensor spans (0 when empty); plain integers only, no expressions."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    if not isinstance(meta, dict):
        raise _Refused(where, "has no tensor_meta", unsafe=False)
    dtype = _SERIALIZE_TO_TORCH_DTYPE.get(meta.get("dtype")) if isinstance(meta.get("dtype"), int) else None
    if dtype is None:
        raise _Refused(where, "has an unknown dtype", unsafe=False)

    def ints(value: Any) -> list[int]:
        items = value if isinstance(value, list) else None
        if items is None or len(items) > 64:
            raise _Refused(where, "has malformed sizes or strides", unsafe=False)
        numbers = [item.get("as_int") if isinstance(item, dict) and len(item) == 1 else None for item in items]
        if not all(type(number) is int and 0 <= number < 1 << 62 for number in numbers):
            raise _Refused(where, "has sizes or strides that are not plain non-negative integers", unsafe=False)
        return numbers  # type: ignore[return-value]

    sizes, strides, (offset,) = ints(meta.get("sizes")), ints(meta.get("strides")), ints([meta.get("storage_offset")])
    if len(sizes) != len(strides):
        raise _Refused(where, "has a different number of sizes and strides", unsafe=False)
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
        raise _Refused(
            _PT2_SAMPLE_INPUTS, "fails the weights-only unpickler, so torch would unpickle it with weights_only=False"
        ) from None
    if not (isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict)):
        raise _Refused(_PT2_SAMPLE_INPUTS, "is not an (args, kwargs) pair", unsafe=False)
    stack = [sample]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if not (isinstance(key, str) and key.isidentifier()):
                    raise _Refused(
                        _PT2_SAMPLE_INPUTS, f"has the keyword {str(key)[:80]!r}, which torch pastes into code"
                    )
                stack.append(value)
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif not (item is None or isinstance(item, (torch.Tensor, bool, int, float))):
            raise _Refused(_PT2_SAMPLE_INPUTS, f"holds a {type(item).__name__}", unsafe=False)


def _check_program(program: Any) -> None:
    """Walk models/model.json: every string that reaches code is a plain name, operator, expression or guard."""
    if not isinstance(program, dict):
        raise _Refused(_PT2_MODEL, "is not a JSON object", unsafe=False)
    guards = program.get("guards_code", [])
    if not (isinstance(guards, list) and all(isinstance(guard, str) for guard in guards)):
        raise _Refused(_PT2_MODEL, "has a guards_code that is not a list of strings", unsafe=False)
    for guard in guards:
        if not _is_plain_guard(guard):
            raise _Refused(
                f"{_PT2_MODEL} guards_code {guard[:80]!r}", "is not a plain shape check, yet torch would exec it"
            )
    stack: list[tuple[str, Any]] = [("", program)]
    while stack:
        key, value = stack.pop()
        if key in _PT2_FREE_TEXT or key == "guards_code":
            continue
        if key == "expr_str":
            if not (isinstance(value, str) and _is_plain_sympy(value)):
                raise _Refused(
                    f"{_PT2_MODEL} expr_str {str(value)[:80]!r}",
                    "is not a plain sympy expression, yet torch would eval it",
                )
        elif key in ("in_spec", "out_spec", "context") and isinstance(value, str):
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                raise _Refused(_PT2_MODEL, f"has a {key} that is not JSON", unsafe=False) from None
            stack.append(("", parsed))
        elif key in ("target", "as_operator"):  # only graph nodes have a target
            _check_target(value)
        elif key in ("as_custom_obj", "custom_obj", "custom_obj_values") and value:
            raise _Refused(_PT2_MODEL, "uses a custom (torchbind) object that torch would rebuild from a pickle")
        elif isinstance(value, dict):
            for child_key, child in value.items():
                if not _is_safe_name(child_key):
                    raise _Refused(
                        _PT2_MODEL, f"has the name {child_key[:80]!r}, which torch would paste into Python code"
                    )
                stack.append((child_key, child))
        elif isinstance(value, list):
            stack.extend((key, child) for child in value)
        elif isinstance(value, str) and not _is_safe_name(value):
            raise _Refused(_PT2_MODEL, f"has the name {value[:80]!r}, which torch would paste into Python code")


def _is_safe_name(text: str) -> bool:
    return bool(_PT2_SAFE_NAME.fullmatch(text)) and not _PT2_DUNDER.search(text)


def _check_target(target: Any) -> None:
    """aten and prims operators (not the file-touching ones), a few control-flow operators, and symbolic math."""
    if not isinstance(target, str):
        raise _Refused(_PT2_MODEL, "has a node without an operator name", unsafe=False)
    if target in _PT2_SYM_OPS:
        return
    hop = _PT2_HOP.fullmatch(target)
    if hop and hop.group(1) in _PT2_HIGHER_ORDER:
        return
    match = _PT2_OPERATOR.fullmatch(target)
    if match is None or "__" in target:
        raise _Refused(f"{_PT2_MODEL} node {target[:80]!r}", "calls something other than a PyTorch operator")
    namespace, op, overload = match.groups()
    if _PT2_DENIED_OPS.fullmatch(op):
        raise _Refused(
            f"{_PT2_MODEL} node {target!r}", "calls an operator that touches files or skips its own safety checks"
        )
    try:
        resolved = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except (AttributeError, RuntimeError):
        resolved = None
    if not isinstance(resolved, torch._ops.OpOverload):
        raise _Refused(f"{_PT2_MODEL} node {target!r}", "is not an operator of this torch", unsafe=False)


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


def _is_plain_sympy(text: str) -> bool:
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


def _is_plain_guard(text: str) -> bool:
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
