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

- :mod:`~trainwise.exporting.writers`: :func:`export`, its inputs and outputs, the three writers.
- :mod:`~trainwise.exporting.verify`: the parity check and :class:`ExportReport`.
- :mod:`~trainwise.exporting.load`: :func:`load_exported` and :class:`ExportedModel`.
- :mod:`~trainwise.exporting.pt2_check`: the check between an untrusted ``.pt2`` and ``torch.export.load``.
- :mod:`~trainwise.exporting.onnx_check`: the check between an untrusted ``.onnx`` and onnxruntime.
- :mod:`~trainwise.exporting.sidecar`: the ``<artifact>.json`` sidecar, read back checked.
- :mod:`~trainwise.exporting.common`: the formats, the warning and the wording every part shares.

The package is named ``exporting`` so that ``trainwise.export`` stays the function.
"""

from __future__ import annotations

from trainwise.exporting.common import FORMATS, ONNX_INSTALL, SUFFIXES, ExportWarning, Format
from trainwise.exporting.load import ExportedModel, NotAnArtifactError, load_exported
from trainwise.exporting.sidecar import SIDECAR_VERSION
from trainwise.exporting.verify import TOLERANCES, ExportParityError, ExportReport
from trainwise.exporting.writers import export

__all__ = [
    "FORMATS",
    "ONNX_INSTALL",
    "SIDECAR_VERSION",
    "SUFFIXES",
    "TOLERANCES",
    "ExportParityError",
    "ExportReport",
    "ExportWarning",
    "ExportedModel",
    "Format",
    "NotAnArtifactError",
    "export",
    "load_exported",
]
