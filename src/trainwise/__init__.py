"""trainwise: train PyTorch models with the fundamentals right by construction.

Primitives a hand-written loop can take one at a time, a small Trainer built only from them, and checks. The top
level holds what a first week needs; the rest lives in its namespace (``trainwise.data``, ``trainwise.checkpoint``,
``trainwise.distributed``, ``trainwise.exporting``, ``trainwise.guards``, ...), each loaded on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from trainwise._version import __version__

if TYPE_CHECKING:  # the one list of the top level: type checkers read it, and _exports() parses it
    from trainwise.accumulation import GradientAccumulator, accumulation_steps
    from trainwise.callbacks import Callback, TrainingState
    from trainwise.checkpoint.manager import CheckpointManager
    from trainwise.checkpoint.state import load_checkpoint, save_checkpoint
    from trainwise.checkpoint.weights import load_weights, save_weights
    from trainwise.config import TrainerConfig
    from trainwise.data.batches import MicroBatch, forward_micro_batch, mark_last
    from trainwise.data.loaders import data_kind, evaluation_loader, training_loader
    from trainwise.data.samplers import set_sampler_epoch
    from trainwise.device import move_to_device, resolve_device, resolve_precision
    from trainwise.distributed import global_metric_values
    from trainwise.errors import NonFiniteLossError, TrainwiseError
    from trainwise.evaluation import evaluate, evaluating
    from trainwise.exporting import export, load_exported
    from trainwise.freezing import freeze, param_groups, unfreeze
    from trainwise.guards.core import Guard, guard
    from trainwise.interrupts import Preempted
    from trainwise.metrics import Accuracy, Mean, MetricSet
    from trainwise.optimizers import build_optimizer
    from trainwise.results import FitResult
    from trainwise.runlog import read_log
    from trainwise.seeding import seed_everything
    from trainwise.step import TrainStep
    from trainwise.trainer import Trainer
    from trainwise.wrappers import unwrap_model, unwrap_optimizer

# The top level's names, as a literal list (tests/test_smoke.py holds it to the imports above).
__all__ = [
    "Accuracy",
    "Callback",
    "CheckpointManager",
    "FitResult",
    "GradientAccumulator",
    "Guard",
    "Mean",
    "MetricSet",
    "MicroBatch",
    "NonFiniteLossError",
    "Preempted",
    "TrainStep",
    "Trainer",
    "TrainerConfig",
    "TrainingState",
    "TrainwiseError",
    "__version__",
    "accumulation_steps",
    "build_optimizer",
    "data_kind",
    "evaluate",
    "evaluating",
    "evaluation_loader",
    "export",
    "forward_micro_batch",
    "freeze",
    "global_metric_values",
    "guard",
    "load_checkpoint",
    "load_exported",
    "load_weights",
    "mark_last",
    "move_to_device",
    "param_groups",
    "read_log",
    "resolve_device",
    "resolve_precision",
    "save_checkpoint",
    "save_weights",
    "seed_everything",
    "set_sampler_epoch",
    "training_loader",
    "unfreeze",
    "unwrap_model",
    "unwrap_optimizer",
]

# Names that were at the top level before it was made small: still found there, with a DeprecationWarning
# naming their namespace (name -> the public module to import them from).
_MOVED = {
    "AdaptiveMicroBatches": "trainwise.oom",
    "is_out_of_memory": "trainwise.oom",
    "StepBoundaryInterrupt": "trainwise.interrupts",
    "Logger": "trainwise.tracking",
    "MLflowLogger": "trainwise.tracking",
    "TensorBoardLogger": "trainwise.tracking",
    "DeviceChoice": "trainwise.device",
    "PrecisionPolicy": "trainwise.device",
    "DiskWriteError": "trainwise.errors",
    "EarlyStopping": "trainwise.early_stopping",
    "ExportReport": "trainwise.exporting",
    "GuardError": "trainwise.guards",
    "GuardFinding": "trainwise.guards",
    "GuardWarning": "trainwise.guards",
    "NonFiniteLossGuard": "trainwise.guards",
    "UnoptimizedParameterWarning": "trainwise.guards",
    "check_finite_everywhere": "trainwise.guards",
    "check_optimizer_covers": "trainwise.guards",
    "LoadReport": "trainwise.checkpoint",
    "WeightsMismatchError": "trainwise.checkpoint",
    "find_resume_checkpoint": "trainwise.checkpoint",
    "finish_checkpoint_writes": "trainwise.checkpoint",
    "read_resume_checkpoint": "trainwise.checkpoint",
    "restore_training_checkpoint": "trainwise.checkpoint",
    "save_training_checkpoint": "trainwise.checkpoint",
    "safe_load": "trainwise.checkpoint",
    "OverfittingReport": "trainwise.diagnosis",
    "detect_overfitting": "trainwise.diagnosis",
    "ResumableLoader": "trainwise.data",
    "SampleKey": "trainwise.data",
    "SeededBatchSampler": "trainwise.data",
    "SeededDataset": "trainwise.data",
    "ShardSampler": "trainwise.data",
    "ShardedBatchSampler": "trainwise.data",
    "call_model": "trainwise.data",
    "count_items": "trainwise.data",
    "loader_generator": "trainwise.data",
    "padding_batches": "trainwise.data",
    "prepare_loader": "trainwise.data",
    "seed_worker": "trainwise.data",
    "seeded_loader": "trainwise.data",
    "seeded_sampling": "trainwise.data",
    "split_batch": "trainwise.data",
    "RunLock": "trainwise.runlog",
    "extend_optimizer": "trainwise.freezing",
    "frozen_norm_layers": "trainwise.freezing",
    "pin_frozen_norm_layers": "trainwise.freezing",
    "get_rng_state": "trainwise.seeding",
    "set_rng_state": "trainwise.seeding",
    "init_distributed": "trainwise.distributed",
    "is_main_process": "trainwise.distributed",
    "same_last_batch": "trainwise.distributed",
    "shard_model": "trainwise.distributed",
    "sharded_to_single_file": "trainwise.distributed",
    "plot_learning_curves": "trainwise.plots",
    "write_learning_curves_svg": "trainwise.plots",
}

_names: dict[str, str] | None = None


def _exports() -> dict[str, str]:
    """name -> module of the top level, read once from the ``TYPE_CHECKING`` imports of this file (on first use,
    so that ``import trainwise``, and the doctor, pay for neither this nor torch)."""
    global _names
    if _names is None:
        import ast

        source = __loader__.get_source(__name__)  # also from a zip; None where only bytecode ships
        if source is None:
            raise ImportError("trainwise's top-level names are read from the source of trainwise/__init__.py, "
                              "which this installation lacks; install trainwise with its .py files.")
        tree = ast.parse(source)
        block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
                     "TYPE_CHECKING")
        _names = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
                  for alias in node.names}
    return _names


def __getattr__(name: str) -> Any:
    module = _exports().get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _MOVED:
        import warnings

        warnings.warn(f"trainwise.{name} moved to {_MOVED[name]}.{name}; import it from there (the top level keeps "
                      "the names a first week needs).", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"trainwise.{name}") is not None:
        return importlib.import_module(f"trainwise.{name}")  # a namespace: trainwise.data, trainwise.checkpoint...
    raise AttributeError(f"module 'trainwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return ["__version__", *sorted(_exports())]
