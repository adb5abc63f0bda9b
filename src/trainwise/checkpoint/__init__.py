"""Checkpoints: atomic saves, exact resume, and loading any checkpoint safely (fundamental 8).

- :mod:`~trainwise.checkpoint.io`: atomic writes, format detection, ``weights_only`` loading.
- :mod:`~trainwise.checkpoint.state`: the full training state from live objects, restored in place.
- :mod:`~trainwise.checkpoint.loader`: a DataLoader that resumes in the middle of an epoch.
- :mod:`~trainwise.checkpoint.manager`: a run's checkpoints, the last N and the best kept.
- :mod:`~trainwise.checkpoint.weights`: ``load_weights`` with its report, ``save_weights``.
"""

from trainwise.checkpoint.io import atomic_torch_save, atomic_write, detect_format, safe_load
from trainwise.checkpoint.loader import ResumableLoader
from trainwise.checkpoint.manager import CheckpointManager, find_resume_checkpoint
from trainwise.checkpoint.state import (
    capture_state,
    load_checkpoint,
    read_checkpoint,
    restore_state,
    save_checkpoint,
)
from trainwise.checkpoint.weights import LoadReport, WeightsMismatchError, load_weights, save_weights

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
    "load_checkpoint",
    "load_weights",
    "read_checkpoint",
    "restore_state",
    "safe_load",
    "save_checkpoint",
    "save_weights",
]
