"""Checkpoints: atomic saves, exact resume, and loading any checkpoint safely (fundamental 8).

- :mod:`~trainwise.checkpoint.io`: atomic torch saves, format detection, ``weights_only`` loading.
- :mod:`~trainwise.checkpoint.state`: the full training state from live objects, restored in place.
- ``ResumableLoader``, a DataLoader that resumes in the middle of an epoch, lives in :mod:`trainwise.data`.
- :mod:`~trainwise.checkpoint.training`: a training loop's checkpoints across processes (DDP, FSDP shards).
- :mod:`~trainwise.checkpoint.manager`: a run's checkpoints, the last N and the best kept.
- :mod:`~trainwise.checkpoint.weights`: ``load_weights`` with its report, ``save_weights``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562), so importing the package imports no torch. A dotted value is a module outside
# the package: `atomic_write` lives in `trainwise.files` (general file safety), kept here as public API.
_EXPORTS = {
    "atomic_torch_save": "io",
    "atomic_write": "trainwise.files",
    "detect_format": "io",
    "safe_load": "io",
    "ResumableLoader": "trainwise.data.resumable",
    "CheckpointManager": "manager",
    "find_resume_checkpoint": "manager",
    "capture_state": "state",
    "load_checkpoint": "state",
    "read_checkpoint": "state",
    "restore_state": "state",
    "save_checkpoint": "state",
    "finish_checkpoint_writes": "training",
    "read_resume_checkpoint": "training",
    "restore_training_checkpoint": "training",
    "save_training_checkpoint": "training",
    "LoadReport": "weights",
    "WeightsMismatchError": "weights",
    "load_weights": "weights",
    "save_weights": "weights",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainwise.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module if "." in module else f"trainwise.checkpoint.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "CheckpointManager",
    "LoadReport",
    "ResumableLoader",
    "WeightsMismatchError",
    "atomic_torch_save",
    "atomic_write",
    "capture_state",
    "detect_format",
    "find_resume_checkpoint",
    "finish_checkpoint_writes",
    "load_checkpoint",
    "load_weights",
    "read_checkpoint",
    "read_resume_checkpoint",
    "restore_state",
    "restore_training_checkpoint",
    "safe_load",
    "save_checkpoint",
    "save_training_checkpoint",
    "save_weights",
]
