"""trainwise: train PyTorch models with the fundamentals right by construction.

Primitives a hand-written loop can take one at a time, a small Trainer built only from them, and checks.
"""

__version__ = "0.1.0"

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

__all__ = [
    "Accuracy",
    "DeviceChoice",
    "FitResult",
    "GradientAccumulator",
    "Mean",
    "MetricSet",
    "NonFiniteLossError",
    "NonFiniteLossGuard",
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
    "evaluating",
    "get_rng_state",
    "loader_generator",
    "move_to_device",
    "prepare_loader",
    "resolve_device",
    "resolve_precision",
    "seed_everything",
    "seed_worker",
    "seeded_loader",
    "set_rng_state",
    "split_batch",
]
