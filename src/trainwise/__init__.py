"""trainwise: train PyTorch models with the fundamentals right by construction.

Primitives a hand-written loop can take one at a time, a small Trainer built only from them, and checks.
"""

import importlib
from typing import TYPE_CHECKING, Any

from trainwise._version import __version__

# Names resolve on first use (PEP 562), so that `import trainwise` (and the doctor) never pays for torch.
_EXPORTS = {
    "is_out_of_memory": "trainwise.oom",
    "AdaptiveMicroBatches": "trainwise.oom",
    "StepBoundaryInterrupt": "trainwise.interrupts",
    "Preempted": "trainwise.interrupts",
    "MLflowLogger": "trainwise.tracking",
    "TensorBoardLogger": "trainwise.tracking",
    "Logger": "trainwise.tracking",
    "TrainingState": "trainwise.callbacks",
    "Callback": "trainwise.callbacks",
    "Accuracy": "trainwise.metrics",
    "CheckpointManager": "trainwise.checkpoint.manager",
    "DeviceChoice": "trainwise.device",
    "DiskWriteError": "trainwise.errors",
    "EarlyStopping": "trainwise.early_stopping",
    "ExportReport": "trainwise.exporting",
    "FitResult": "trainwise.results",
    "GradientAccumulator": "trainwise.accumulation",
    "TrainStep": "trainwise.step",
    "Guard": "trainwise.guards.core",
    "GuardError": "trainwise.guards.core",
    "GuardFinding": "trainwise.guards.core",
    "GuardWarning": "trainwise.guards.core",
    "LoadReport": "trainwise.checkpoint.weights",
    "Mean": "trainwise.metrics",
    "MetricSet": "trainwise.metrics",
    "MicroBatch": "trainwise.data.batches",
    "NonFiniteLossError": "trainwise.errors",
    "NonFiniteLossGuard": "trainwise.guards.loss",
    "OverfittingReport": "trainwise.diagnosis",
    "PrecisionPolicy": "trainwise.device",
    "ResumableLoader": "trainwise.data.resumable",
    "RunLock": "trainwise.runlog",
    "SampleKey": "trainwise.data.seeding",
    "SeededBatchSampler": "trainwise.data.seeding",
    "SeededDataset": "trainwise.data.seeding",
    "ShardSampler": "trainwise.data.samplers",
    "ShardedBatchSampler": "trainwise.data.samplers",
    "Trainer": "trainwise.trainer",
    "TrainerConfig": "trainwise.config",
    "TrainwiseError": "trainwise.errors",
    "UnoptimizedParameterWarning": "trainwise.guards.loss",
    "WeightsMismatchError": "trainwise.checkpoint.weights",
    "accumulation_steps": "trainwise.accumulation",
    "build_optimizer": "trainwise.optimizers",
    "call_model": "trainwise.data.batches",
    "check_finite_everywhere": "trainwise.guards.loss",
    "check_optimizer_covers": "trainwise.guards.loss",
    "count_items": "trainwise.data.batches",
    "data_kind": "trainwise.data.loaders",
    "detect_overfitting": "trainwise.diagnosis",
    "evaluate": "trainwise.evaluation",
    "evaluating": "trainwise.evaluation",
    "evaluation_loader": "trainwise.data.loaders",
    "export": "trainwise.exporting",
    "extend_optimizer": "trainwise.freezing",
    "find_resume_checkpoint": "trainwise.checkpoint.manager",
    "forward_micro_batch": "trainwise.data.batches",
    "freeze": "trainwise.freezing",
    "frozen_norm_layers": "trainwise.freezing",
    "get_rng_state": "trainwise.seeding",
    "global_metric_values": "trainwise.distributed",
    "guard": "trainwise.guards.core",
    "init_distributed": "trainwise.distributed",
    "is_main_process": "trainwise.distributed",
    "load_checkpoint": "trainwise.checkpoint.state",
    "load_exported": "trainwise.exporting",
    "load_weights": "trainwise.checkpoint.weights",
    "loader_generator": "trainwise.data.seeding",
    "mark_last": "trainwise.data.batches",
    "move_to_device": "trainwise.device",
    "padding_batches": "trainwise.data.samplers",
    "param_groups": "trainwise.freezing",
    "pin_frozen_norm_layers": "trainwise.freezing",
    "plot_learning_curves": "trainwise.plots",
    "write_learning_curves_svg": "trainwise.plots",
    "prepare_loader": "trainwise.data.seeding",
    "read_log": "trainwise.runlog",
    "read_resume_checkpoint": "trainwise.checkpoint.training",
    "resolve_device": "trainwise.device",
    "resolve_precision": "trainwise.device",
    "restore_training_checkpoint": "trainwise.checkpoint.training",
    "safe_load": "trainwise.checkpoint.io",
    "same_last_batch": "trainwise.distributed",
    "save_checkpoint": "trainwise.checkpoint.state",
    "save_training_checkpoint": "trainwise.checkpoint.training",
    "finish_checkpoint_writes": "trainwise.checkpoint.training",
    "save_weights": "trainwise.checkpoint.weights",
    "seed_everything": "trainwise.seeding",
    "seed_worker": "trainwise.data.seeding",
    "seeded_loader": "trainwise.data.seeding",
    "seeded_sampling": "trainwise.data.seeding",
    "set_rng_state": "trainwise.seeding",
    "set_sampler_epoch": "trainwise.data.samplers",
    "shard_model": "trainwise.distributed",
    "sharded_to_single_file": "trainwise.distributed",
    "split_batch": "trainwise.data.batches",
    "training_loader": "trainwise.data.loaders",
    "unfreeze": "trainwise.freezing",
    "unwrap_model": "trainwise.wrappers",
    "unwrap_optimizer": "trainwise.wrappers",
}

__all__ = [
    "Accuracy",
    "AdaptiveMicroBatches",
    "Callback",
    "CheckpointManager",
    "DeviceChoice",
    "DiskWriteError",
    "EarlyStopping",
    "ExportReport",
    "FitResult",
    "GradientAccumulator",
    "Guard",
    "GuardError",
    "GuardFinding",
    "GuardWarning",
    "LoadReport",
    "Logger",
    "MLflowLogger",
    "Mean",
    "MetricSet",
    "MicroBatch",
    "NonFiniteLossError",
    "NonFiniteLossGuard",
    "OverfittingReport",
    "PrecisionPolicy",
    "Preempted",
    "ResumableLoader",
    "RunLock",
    "SampleKey",
    "SeededBatchSampler",
    "SeededDataset",
    "ShardSampler",
    "ShardedBatchSampler",
    "StepBoundaryInterrupt",
    "TensorBoardLogger",
    "TrainStep",
    "Trainer",
    "TrainerConfig",
    "TrainingState",
    "TrainwiseError",
    "UnoptimizedParameterWarning",
    "WeightsMismatchError",
    "__version__",
    "accumulation_steps",
    "build_optimizer",
    "call_model",
    "check_finite_everywhere",
    "check_optimizer_covers",
    "count_items",
    "data_kind",
    "detect_overfitting",
    "evaluate",
    "evaluating",
    "evaluation_loader",
    "export",
    "extend_optimizer",
    "find_resume_checkpoint",
    "finish_checkpoint_writes",
    "forward_micro_batch",
    "freeze",
    "frozen_norm_layers",
    "get_rng_state",
    "global_metric_values",
    "guard",
    "init_distributed",
    "is_main_process",
    "is_out_of_memory",
    "load_checkpoint",
    "load_exported",
    "load_weights",
    "loader_generator",
    "mark_last",
    "move_to_device",
    "padding_batches",
    "param_groups",
    "pin_frozen_norm_layers",
    "plot_learning_curves",
    "prepare_loader",
    "read_log",
    "read_resume_checkpoint",
    "resolve_device",
    "resolve_precision",
    "restore_training_checkpoint",
    "safe_load",
    "same_last_batch",
    "save_checkpoint",
    "save_training_checkpoint",
    "save_weights",
    "seed_everything",
    "seed_worker",
    "seeded_loader",
    "seeded_sampling",
    "set_rng_state",
    "set_sampler_epoch",
    "shard_model",
    "sharded_to_single_file",
    "split_batch",
    "training_loader",
    "unfreeze",
    "unwrap_model",
    "unwrap_optimizer",
    "write_learning_curves_svg",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # for type checkers and IDEs; keep in step with _EXPORTS
    from trainwise.accumulation import GradientAccumulator, accumulation_steps
    from trainwise.callbacks import Callback, TrainingState
    from trainwise.checkpoint.io import safe_load
    from trainwise.checkpoint.manager import CheckpointManager, find_resume_checkpoint
    from trainwise.checkpoint.state import load_checkpoint, save_checkpoint
    from trainwise.checkpoint.training import (
        finish_checkpoint_writes,
        read_resume_checkpoint,
        restore_training_checkpoint,
        save_training_checkpoint,
    )
    from trainwise.checkpoint.weights import LoadReport, WeightsMismatchError, load_weights, save_weights
    from trainwise.config import TrainerConfig
    from trainwise.data.batches import MicroBatch, call_model, count_items, forward_micro_batch, mark_last, split_batch
    from trainwise.data.loaders import data_kind, evaluation_loader, training_loader
    from trainwise.data.resumable import ResumableLoader
    from trainwise.data.samplers import ShardedBatchSampler, ShardSampler, padding_batches, set_sampler_epoch
    from trainwise.data.seeding import (
        SampleKey,
        SeededBatchSampler,
        SeededDataset,
        loader_generator,
        prepare_loader,
        seed_worker,
        seeded_loader,
        seeded_sampling,
    )
    from trainwise.device import DeviceChoice, PrecisionPolicy, move_to_device, resolve_device, resolve_precision
    from trainwise.diagnosis import OverfittingReport, detect_overfitting
    from trainwise.distributed import (
        global_metric_values,
        init_distributed,
        is_main_process,
        same_last_batch,
        shard_model,
        sharded_to_single_file,
    )
    from trainwise.early_stopping import EarlyStopping
    from trainwise.errors import DiskWriteError, NonFiniteLossError, TrainwiseError
    from trainwise.evaluation import evaluate, evaluating
    from trainwise.exporting import ExportReport, export, load_exported
    from trainwise.freezing import (
        extend_optimizer,
        freeze,
        frozen_norm_layers,
        param_groups,
        pin_frozen_norm_layers,
        unfreeze,
    )
    from trainwise.guards.core import Guard, GuardError, GuardFinding, GuardWarning, guard
    from trainwise.guards.loss import (
        NonFiniteLossGuard,
        UnoptimizedParameterWarning,
        check_finite_everywhere,
        check_optimizer_covers,
    )
    from trainwise.interrupts import Preempted, StepBoundaryInterrupt
    from trainwise.metrics import Accuracy, Mean, MetricSet
    from trainwise.oom import AdaptiveMicroBatches, is_out_of_memory
    from trainwise.optimizers import build_optimizer
    from trainwise.plots import plot_learning_curves, write_learning_curves_svg
    from trainwise.results import FitResult
    from trainwise.runlog import RunLock, read_log
    from trainwise.seeding import get_rng_state, seed_everything, set_rng_state
    from trainwise.step import TrainStep
    from trainwise.tracking import Logger, MLflowLogger, TensorBoardLogger
    from trainwise.trainer import Trainer
    from trainwise.wrappers import unwrap_model, unwrap_optimizer
