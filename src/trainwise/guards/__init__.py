"""Runtime guards: checks made while training runs, without a host sync per step.

- :mod:`~trainwise.guards.loss`: the non-finite loss guard and the optimizer-coverage check the Trainer uses.
- :mod:`~trainwise.guards.core`: :func:`guard`, hooks on a model and optimizer that report the doctor's codes
  while any loop runs; each code's check is a ``twNNN_*.py`` module here (docs/guards.md).
"""

from trainwise.guards.core import Check, Guard, GuardError, GuardFinding, GuardWarning, guard
from trainwise.guards.loss import (
    NonFiniteLossGuard,
    UnoptimizedParameterWarning,
    check_finite_everywhere,
    check_optimizer_covers,
)

__all__ = [
    "Check",
    "Guard",
    "GuardError",
    "GuardFinding",
    "GuardWarning",
    "NonFiniteLossGuard",
    "UnoptimizedParameterWarning",
    "check_finite_everywhere",
    "check_optimizer_covers",
    "guard",
]
