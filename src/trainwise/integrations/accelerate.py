"""Accelerate: ``guard = guard(accelerator, model, optimizer)`` after ``accelerator.prepare``, ``guard.close()``
at the end (or ``with guard(...):``).

The prepared objects go to :class:`~trainwise.guards.Guard` as they are (a DDP or compiled model, the
``AcceleratedOptimizer``: the guard checks the module and the torch optimizer inside); each finding is a
``GuardWarning`` as with ``trainwise.guard``, and its count per code goes to ``accelerator.log`` (the trackers
of ``init_trackers``: TensorBoard, W&B, MLflow...) at the guard's optimizer step, when found.

Imports ``accelerate`` when imported.
"""

from __future__ import annotations

import collections
from typing import Any

from trainwise.errors import TrainwiseError
from trainwise.guards.core import Action, Guard, GuardFinding
from trainwise.integrations._findings import PREFIX

try:
    import accelerate
except ImportError:
    raise ImportError("trainwise.integrations.accelerate needs Hugging Face Accelerate: "
                      "pip install accelerate") from None


def guard(accelerator: Any, model: Any, optimizer: Any = None, *, action: Action = "warn", check_every: int = 50,
          checks: list[str] | None = None, forward_every: int = 1, log: bool = True) -> Guard:
    """Watch the model and optimizer ``accelerator.prepare`` returned (see :func:`trainwise.guard`), each finding's
    count per code also sent to ``accelerator.log`` as ``trainwise/TW108`` (``log=False``: not sent)."""
    if not isinstance(accelerator, accelerate.Accelerator):
        raise TrainwiseError(f"guard(accelerator, model, optimizer) takes the Accelerator first, got "
                             f"{type(accelerator).__name__}.")
    places: collections.Counter[str] = collections.Counter()  # a finding is a new place for its code

    def send(finding: GuardFinding) -> None:
        places[finding.code] += 1
        accelerator.log({f"{PREFIX}{finding.code}": float(places[finding.code])}, step=finding.step)

    return Guard(model, optimizer, action=action, check_every=check_every, checks=checks,
                 forward_every=forward_every, on_finding=send if log else None)
