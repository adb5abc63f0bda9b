"""Parity: the staged artifact, loaded back from disk, against the eager model's outputs at every checked batch
size, within :data:`TOLERANCES`; :class:`ExportReport` holds the figures."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from trainwise.errors import TrainwiseError, first_line
from trainwise.exporting.common import ONNX_INSTALL, ExportWarning, _installed, _shape_text
from trainwise.exporting.load import _load
from trainwise.exporting.sidecar import _sidecar_path

# (atol, rtol) by output dtype; a difference passes where |actual - expected| <= atol + rtol * |expected|.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


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
    lengths: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # other free dimensions checked

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["path"], data["sidecar"] = str(self.path), str(self.sidecar)
        data["batch_sizes"] = list(self.batch_sizes)
        data["lengths"] = {k: list(v) for k, v in self.lengths.items()}
        return data

    def __str__(self) -> str:
        if not self.verified:
            parity = "parity NOT verified (onnxruntime is not installed)"
        else:
            others = "".join(f" and {name} lengths {', '.join(map(str, sizes))}"
                             for name, sizes in self.lengths.items())
            parity = (
                f"parity at batch sizes {', '.join(map(str, self.batch_sizes))}{others}: max abs diff "
                f"{self.max_abs_diff:.3g}, max rel diff {self.max_rel_diff:.3g} "
                f"(atol {self.atol:g}, rtol {self.rtol:g})"
            )
        shapes = ", ".join(f"{spec['name']} {_shape_text(spec['shape'])} {spec['dtype']}" for spec in self.inputs)
        label = {"script": "torchscript, scripted", "trace": "torchscript, TRACED"}.get(self.method, self.format)
        return f"wrote {self.path} ({label}; inputs {shapes}); {parity}"


def _verify(
    staged: Path,
    metadata: dict[str, Any],
    checks: list[Any],
    *,
    atol: float | None,
    rtol: float | None,
) -> ExportReport:
    format = metadata["format"]
    first = checks[0].expected[0]
    default_atol, default_rtol = TOLERANCES.get(first.dtype, (0.0, 0.0))
    report = ExportReport(
        path=staged,
        sidecar=_sidecar_path(staged),
        format=format,
        method=metadata["method"],
        dynamic_batch=metadata["dynamic_batch"],
        inputs=metadata["inputs"],
        outputs=metadata["outputs"],
        batch_sizes=tuple(dict.fromkeys(c.sizes["batch"] for c in checks if "batch" in c.sizes)),
        lengths={name: tuple(dict.fromkeys(c.sizes[name] for c in checks)) for name in checks[0].sizes
                 if name != "batch"},
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
    # The staged file is the one the writer just made, in a private staging folder (mode 0700) created by this
    # export, so its bytes are ours: trusted even when TorchScript. The sidecar is written only once parity holds.
    loaded = _load(staged, format, None, metadata, trust_code=True)
    report.runtime = loaded.runtime
    worst_abs = worst_rel = 0.0
    for check in checks:
        inputs, expected, at = check.inputs, check.expected, check.where
        try:
            actual = loaded.run_tuple(*inputs)
        except Exception as exc:
            raise ExportParityError(
                f"the {format} artifact fails{at} with {type(exc).__name__}: {first_line(exc)}, so the export "
                "froze a shape the eager model keeps free; fix that dimension (dynamic_batch=False, or dims= for "
                "another) or use format='torch.export'.",
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
                    f"eager model returns {tuple(want.shape)}; fix that dimension (dynamic_batch=False, or dims= "
                    "for another) or use format='torch.export'.",
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
