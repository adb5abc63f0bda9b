"""trainwise: train PyTorch models with the fundamentals right by construction.

Primitives a hand-written loop can take one at a time, a small Trainer built only from them, and checks.
"""

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

# Names resolve on first use (PEP 562), so that `import trainwise` (and the doctor) never pays for torch.
_EXPORTS = {
    "Accuracy": "trainwise.metrics",
    "DeviceChoice": "trainwise.device",
    "EarlyStopping": "trainwise.early_stopping",
    "FitResult": "trainwise.trainer",
    "GradientAccumulator": "trainwise.accumulation",
    "Mean": "trainwise.metrics",
    "MetricSet": "trainwise.metrics",
    "NonFiniteLossError": "trainwise.errors",
    "NonFiniteLossGuard": "trainwise.guards",
    "OverfittingReport": "trainwise.diagnosis",
    "PrecisionPolicy": "trainwise.device",
    "Trainer": "trainwise.trainer",
    "TrainerConfig": "trainwise.config",
    "TrainwiseError": "trainwise.errors",
    "UnoptimizedParameterWarning": "trainwise.guards",
    "accumulation_steps": "trainwise.accumulation",
    "call_model": "trainwise.batches",
    "check_optimizer_covers": "trainwise.guards",
    "count_items": "trainwise.batches",
    "detect_overfitting": "trainwise.diagnosis",
    "evaluating": "trainwise.evaluation",
    "extend_optimizer": "trainwise.freezing",
    "freeze": "trainwise.freezing",
    "frozen_norm_layers": "trainwise.freezing",
    "get_rng_state": "trainwise.seeding",
    "loader_generator": "trainwise.seeding",
    "move_to_device": "trainwise.device",
    "param_groups": "trainwise.freezing",
    "plot_learning_curves": "trainwise.plots",
    "prepare_loader": "trainwise.seeding",
    "resolve_device": "trainwise.device",
    "resolve_precision": "trainwise.device",
    "seed_everything": "trainwise.seeding",
    "seed_worker": "trainwise.seeding",
    "seeded_loader": "trainwise.seeding",
    "set_rng_state": "trainwise.seeding",
    "split_batch": "trainwise.batches",
    "unfreeze": "trainwise.freezing",
    "unwrap_model": "trainwise.wrappers",
}

__all__ = [
    "Accuracy",
    "DeviceChoice",
    "EarlyStopping",
    "FitResult",
    "GradientAccumulator",
    "Mean",
    "MetricSet",
    "NonFiniteLossError",
    "NonFiniteLossGuard",
    "OverfittingReport",
    "PrecisionPolicy",
    "Trainer",
    "TrainerConfig",
    "TrainwiseError",
    "UnoptimizedParameterWarning",
    "__version__",
    "accumulation_steps",
    "call_model",
    "check_optimizer_covers",
    "count_items",
    "detect_overfitting",
    "evaluating",
    "extend_optimizer",
    "freeze",
    "frozen_norm_layers",
    "get_rng_state",
    "loader_generator",
    "move_to_device",
    "param_groups",
    "plot_learning_curves",
    "prepare_loader",
    "resolve_device",
    "resolve_precision",
    "seed_everything",
    "seed_worker",
    "seeded_loader",
    "set_rng_state",
    "split_batch",
    "unfreeze",
    "unwrap_model",
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


if TYPE_CHECKING:  # for type checkers and IDEs
    from trainwise.accumulation import GradientAccumulator, accumulation_steps
    from trainwise.batches import call_model, count_items, split_batch
    from trainwise.config import TrainerConfig
    from trainwise.device import (
        DeviceChoice,
        PrecisionPolicy,
        move_to_device,
        resolve_device,
        resolve_precision,
    )
    from trainwise.errors import NonFiniteLossError, TrainwiseError
    from trainwise.evaluation import evaluating
    from trainwise.guards import NonFiniteLossGuard, UnoptimizedParameterWarning, check_optimizer_covers
    from trainwise.metrics import Accuracy, Mean, MetricSet
    from trainwise.seeding import (
        get_rng_state,
        loader_generator,
        prepare_loader,
        seed_everything,
        seed_worker,
        seeded_loader,
        set_rng_state,
    )
    from trainwise.trainer import FitResult, Trainer
