"""Device and precision policy: pick the device and the autocast dtype, say why, move any batch there."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import torch

from trainwise.errors import TrainwiseError

_NULL_CONTEXT = contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """The chosen device and the reason it was chosen."""

    device: torch.device
    reason: str


def resolve_device(device: str | torch.device = "auto") -> DeviceChoice:
    """Resolve ``"auto"`` to cuda, then mps, then cpu; check that an explicit device exists."""
    if isinstance(device, torch.device):
        device = str(device)
    if device == "auto":
        if torch.cuda.is_available():
            return DeviceChoice(torch.device("cuda"), f"CUDA available ({torch.cuda.get_device_name(0)})")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return DeviceChoice(torch.device("mps"), "Apple MPS available, no CUDA")
        return DeviceChoice(torch.device("cpu"), "no CUDA or MPS device found")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise TrainwiseError(
            f"unknown device {device!r}; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'."
        ) from exc
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise TrainwiseError(f"device {device!r} was asked for but CUDA is not available; use device='auto'.")
    if chosen.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise TrainwiseError(f"device {device!r} was asked for but MPS is not available; use device='auto'.")
    return DeviceChoice(chosen, "asked for explicitly")


def move_to_device(batch: Any, device: torch.device | str, *, non_blocking: bool | None = None) -> Any:
    """Move every tensor in a batch (tensor, tuple, list, dict, dataclass, namedtuple, nested) to ``device``.

    Copies are non-blocking for pinned CPU tensors going to CUDA, where that overlaps the copy with compute.
    Non-tensor leaves (str, int, float, None) pass through; any other object is a user error.
    """
    if type(device) is not torch.device:
        device = torch.device(device)
    if type(batch) is torch.Tensor and batch.device == device:
        return batch  # the common cases on CPU: nothing to move, skip the walk
    if type(batch) in (tuple, list) and all(type(t) is torch.Tensor and t.device == device for t in batch):
        return batch
    return _move(batch, device, non_blocking, path="batch")


def _move(obj: Any, device: torch.device, non_blocking: bool | None, path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        nb = non_blocking
        if nb is None:
            nb = device.type == "cuda" and obj.device.type == "cpu" and obj.is_pinned()
        return obj.to(device, non_blocking=nb)
    if obj is None or isinstance(obj, (str, bytes, int, float, bool, complex)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: _move(getattr(obj, f.name), device, non_blocking, f"{path}.{f.name}")
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(v, device, non_blocking, f"{path}.{k}") for k, v in zip(obj._fields, obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(v, device, non_blocking, f"{path}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, Mapping):
        moved = {k: _move(v, device, non_blocking, f"{path}[{k!r}]") for k, v in obj.items()}
        try:
            return type(obj)(moved)
        except TypeError:
            return moved
    if hasattr(obj, "to") and callable(obj.to):  # e.g. a BatchEncoding-like object
        return obj.to(device)
    if hasattr(obj, "__array__"):
        raise TrainwiseError(
            f"{path} is a {type(obj).__name__}, not a tensor; convert it with torch.as_tensor in the "
            "dataset or collate_fn."
        )
    raise TrainwiseError(
        f"{path} has unsupported type {type(obj).__name__}; batches may hold tensors in tuples, lists, "
        "dicts or dataclasses, so convert it in the dataset or collate_fn."
    )


def pin_memory_default(device: torch.device) -> bool:
    """Pinned host memory only pays off when batches are copied to a CUDA device."""
    return device.type == "cuda"


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return True  # CPU autocast supports bf16 on every build we target
    if device.type == "mps":
        return hasattr(torch.backends, "mps") and torch.backends.mps.is_available() and torch.__version__ >= "2.6"
    return False


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
    """What autocast dtype to use on a device, whether a GradScaler is needed, and why."""

    name: Literal["bf16", "fp16", "fp32"]
    device: torch.device
    reason: str

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.name]

    @property
    def needs_scaler(self) -> bool:
        """fp16 underflows small gradients without loss scaling; bf16 has fp32's range and needs none."""
        return self.name == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast for the forward pass and loss (not for backward or the optimizer step)."""
        if self.name == "fp32":
            return _NULL_CONTEXT
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler for fp16, None otherwise."""
        if not self.needs_scaler:
            return None
        return torch.amp.GradScaler(self.device.type)


def resolve_precision(precision: str = "auto", device: torch.device | str = "cpu") -> PrecisionPolicy:
    """``auto``: bf16 autocast on CUDA devices that support it, fp32 elsewhere (CPU autocast rarely pays)."""
    device = torch.device(device)
    if precision not in ("auto", "bf16", "fp16", "fp32"):
        raise TrainwiseError(f"unknown precision {precision!r}; use 'auto', 'bf16', 'fp16' or 'fp32'.")
    if precision == "auto":
        if device.type == "cuda" and _bf16_supported(device):
            return PrecisionPolicy("bf16", device, "CUDA device supports bfloat16 (fp32 range, no scaler)")
        if device.type == "cuda":
            return PrecisionPolicy("fp16", device, "CUDA device without bfloat16: fp16 with a GradScaler")
        return PrecisionPolicy("fp32", device, f"{device.type} device: autocast would not speed training up")
    if precision == "bf16" and not _bf16_supported(device):
        raise TrainwiseError(
            f"bf16 is not supported on {device}; use precision='fp16' (with a scaler) or 'fp32'."
        )
    if precision == "fp16" and device.type == "cpu" and torch.__version__ < "2.3":
        raise TrainwiseError("fp16 autocast on CPU needs torch>=2.3; use precision='bf16' or 'fp32'.")
    reasons = {
        "bf16": "asked for: bfloat16 autocast, no scaler needed",
        "fp16": "asked for: float16 autocast with a GradScaler",
        "fp32": "asked for: full float32",
    }
    return PrecisionPolicy(precision, device, reasons[precision])  # type: ignore[arg-type]
