"""Loading an artifact as a callable, without the model's source: :func:`load_exported`. A checkpoint given
instead is refused by name, a ``.pt2`` passes :mod:`~trainwise.exporting.pt2_check` before torch reads it, an
``.onnx`` passes :mod:`~trainwise.exporting.onnx_check` before onnxruntime does, and TorchScript (a program) is
loaded only with ``trust_code=True``."""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainwise.errors import TrainwiseError, first_line, with_article
from trainwise.exporting.common import (
    FORMATS,
    ONNX_INSTALL,
    Format,
    _quiet_jit,
    _require,
    _shape_text,
)
from trainwise.exporting.onnx_check import check_model, has_external_data
from trainwise.exporting.pt2_check import Refused, check_archive
from trainwise.exporting.sidecar import _read_sidecar, _sidecar_path

_SUFFIX_FORMATS = {".pt2": "torch.export", ".torchscript": "torchscript", ".ts": "torchscript", ".onnx": "onnx"}


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
    trust_code: bool = False,
) -> ExportedModel:
    """Load an artifact written by :func:`export` (or any .pt2, TorchScript or .onnx file) as a callable.

    The format comes from ``format``, else the sidecar ``path.json``, else the file suffix (.pt2, .torchscript or
    .ts, .onnx). ``device`` moves a torch.export or TorchScript artifact (``"cpu"`` loads a GPU export on a
    machine without one) and picks onnxruntime's CUDA provider for ``"cuda"``. No model class is imported.

    A ``.pt2`` is checked before torch reads it and refused (TrainwiseError naming the entry) unless it holds only
    what ``torch.export.save`` writes for a plain model: no pickles that torch would load with
    ``weights_only=False``, no native code, aten operators only and no Python source in names, shape expressions
    or guards, so loading one from elsewhere runs no code (``trust_code`` changes nothing there). A TorchScript
    file is a program that torch runs as it loads it: it is refused unless ``trust_code=True`` (say so only for a
    file you trust like code). An ONNX graph is checked with the ``onnx`` package first and refused, unless
    ``trust_code=True``, when a node needs a custom operator library or external data lies outside the
    artifact's folder (docs/security.md). A damaged artifact or sidecar is one sentence too, and a checkpoint
    given in place of an artifact (a ``torch.save`` or safetensors file, whatever its name) is refused
    with :class:`NotAnArtifactError`, read with ``weights_only=True`` only to say what it is.
    """
    artifact = Path(path)
    if not artifact.is_file():
        raise TrainwiseError(
            f"no exported model at {artifact}; check the path (trainwise export, or trainwise.export() in Python, "
            "writes one)."
        )
    return _load(artifact, format, device, _read_sidecar(artifact), trust_code=trust_code)


def _load(
    artifact: Path,
    format: str | None,
    device: str | torch.device | None,
    metadata: dict[str, Any],
    *,
    trust_code: bool,
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
    if format == "torchscript" and not trust_code:  # before torch reads a byte of it
        raise TrainwiseError(
            f"refusing to load {artifact}: a TorchScript file is a program that torch runs as it loads it; pass "
            "trust_code=True if it comes from a source you trust like code, or export the model as .pt2 (the "
            "default format), which trainwise checks and loads without running code."
        )
    try:
        target = None if device is None else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise TrainwiseError(f"device {device!r} is not a torch device; pass e.g. 'cpu' or 'cuda'.") from None
    if format == "torch.export":
        return _load_torch_export(artifact, metadata, target)
    if format == "torchscript":
        return _load_torchscript(artifact, metadata, target)
    return _load_onnx(artifact, metadata, target, trust_code=trust_code)


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
        f"{artifact} is {with_article(what)}, not an exported model; make an artifact from it with trainwise export "
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
    reason = first_line(exc).split(". ")[0][:160]  # runtimes append advice in further sentences
    return TrainwiseError(
        f"{artifact} is not a readable {kind} file ({type(exc).__name__}: {reason}); export the model again with "
        "trainwise export (or check that the file was copied completely)."
    )


def _load_torchscript(artifact: Path, metadata: dict[str, Any], device: torch.device | None) -> ExportedModel:
    # A TorchScript file is a program: torch.jit.load compiles its code and runs its __setstate__ methods. Only a
    # caller who said trust_code=True gets here (docs/security.md); only unreadable files become one sentence.
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


def _load_onnx(
    artifact: Path, metadata: dict[str, Any], device: torch.device | None, *, trust_code: bool
) -> ExportedModel:
    ort = _require("onnxruntime", "Running an ONNX artifact")
    providers = ["CPUExecutionProvider"]
    if device is not None and device.type == "cuda":
        providers.insert(0, "CUDAExecutionProvider")
    source: str | bytes = str(artifact)
    options = ort.SessionOptions()
    if not trust_code:
        source = _check_onnx(artifact)
        options.add_session_config_entry("session.load_model_format", "ONNX")  # never the unchecked .ort format
    try:
        session = ort.InferenceSession(source, sess_options=options, providers=providers)
    except Exception as exc:
        raise _unreadable(artifact, "ONNX", exc) from None
    names = [node.name for node in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(names):
            raise TrainwiseError(f"{artifact.name} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}.")
        feed = {name: tensor.detach().cpu().numpy() for name, tensor in zip(names, inputs)}
        return tuple(torch.from_numpy(np.asarray(out)) for out in session.run(None, feed))

    return ExportedModel(artifact, "onnx", metadata, run, f"onnxruntime {ort.__version__}", device)


def _check_onnx(artifact: Path) -> str | bytes:
    """Parse ``artifact`` with the ``onnx`` package and refuse it (one sentence) when :func:`check_model` finds a
    custom operator domain or external data outside its folder; return what onnxruntime should load: the checked
    bytes, or the path when external data must be found next to it (onnxruntime resolves it from the path)."""
    try:
        onnx = importlib.import_module("onnx")
    except ImportError:
        raise TrainwiseError(
            f"refusing to load {artifact} unchecked: checking an ONNX graph before onnxruntime runs it needs the "
            f"onnx package, which is not installed; {ONNX_INSTALL}, or pass trust_code=True if the file comes from "
            "a source you trust like code."
        ) from None
    try:
        data = artifact.read_bytes()
    except OSError as exc:
        raise TrainwiseError(f"cannot read {artifact} ({exc.strerror or exc}); check the file's permissions.") from None
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError on anything that is not a ModelProto
        raise _unreadable(artifact, "ONNX", exc) from None
    problem = check_model(model, artifact.parent)
    if problem:
        raise TrainwiseError(
            f"refusing to load {artifact}: {problem}; pass trust_code=True if the file comes from a source you trust "
            "like code, or export the model again with trainwise export."
        )
    return str(artifact) if has_external_data(model) else data


def _check_pt2(data: bytes, artifact: Path) -> None:
    """Raise TrainwiseError (one sentence naming the entry) unless ``data`` is a plain torch.export.save archive
    (trainwise.exporting.pt2_check says what that means)."""
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
        fits = len(shape) == len(expected) and all(
            isinstance(want, str) or want == got for want, got in zip(expected, shape))  # a name: a free size
        if not fits:
            hint = " (add the batch dimension: x[None] for one sample)" if len(shape) == len(expected) - 1 else ""
            raise TrainwiseError(
                f"input {spec['name']!r} of {artifact.name} must have shape {_shape_text(expected)}, got "
                f"{_shape_text(shape)}; reshape it{hint}."
            )
