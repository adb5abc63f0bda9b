"""What a runtime check is: ``Check``, the base class of each code's check (one ``twNNN_*.py`` module per code),
and ``OncePerStep``, the schedule of the checks that scan on a forward. The guard in ``core.py`` runs them; the
check modules and ``registry.py`` need only this, not the guard."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from trainwise.guards.core import Guard


# Checks that sample steps (TW102, TW105, TW109) wake on few: a sampled step runs code the loop itself never runs,
# which inside a tight step costs several times what it costs alone (benchmarks/trainer_costs.py, probes). The
# first step is always sampled; then the gap grows with the run, so a short run is looked at often and a long one
# pays for about one sample in SAMPLE_LAST_GAP steps.
SAMPLE_FIRST_GAP = 32
SAMPLE_LAST_GAP = 256


def sample_gap(step: int, *, odd: bool = False) -> int:
    """Steps from a sample taken at optimizer step ``step`` to the next: 32 at first, then ``step`` (the samples
    double apart: steps 0, 32, 64, 128, 256, then every 256), so every sampled step is a multiple of 8, whose
    forwards ``forward_every=8`` (the Trainer's) hooks. ``odd``: one more when even, for a check that judges pairs
    of steps (a loop that does something on every other step then shows on both parities)."""
    gap = min(SAMPLE_LAST_GAP, max(SAMPLE_FIRST_GAP, step))
    return gap | 1 if odd else gap


class Check:
    """One code's runtime check. Subclasses set ``code`` and override the events they need; the guard calls
    only the overridden ones, and none while the check has muted it (``guard.listen(self, event, False)``: it
    has nothing to do there for now). ``after_forward`` may return a replacement for the model's output (or None)."""

    code: ClassVar[str] = ""
    # about what optimizer steps apply, though it has no step event (TW113 reads the weights at the checks): a
    # second optimizer of the model runs it too, and a finding at close is placed at the step
    about_steps: ClassVar[bool] = False

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def on_install(self) -> None:
        """Once, when the guard starts (the model and optimizer as they are now)."""

    def before_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each forward of the guarded model (not of its submodules)."""

    def after_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        """After each forward of the guarded model; return a replacement output, or None to keep it."""
        return None

    def on_forward_error(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], error: Exception
    ) -> None:
        """When the guarded model's forward raised ``error`` (only where the guard wraps ``model.forward``, see
        ``guard.wraps_forward_call``): a check may judge the call from it, at no cost to the calls that work,
        and raise its finding (``guard.fail``) in place of torch's message."""

    def after_eval_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        """After each forward of the guarded model in eval mode (``module.training`` False), after
        ``after_forward``: a check about evaluation costs no call on the training forwards."""

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Before each ``optimizer.step()`` (``guard.step`` is the number of steps taken so far)."""

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """After each ``optimizer.step()`` (``guard.step`` already counts it)."""

    def on_check(self) -> None:
        """Every ``check_every`` steps and at ``close`` (``guard.closing``): where a check may read values
        from the device."""

    def take_over(self, previous: Check) -> None:
        """Carry on from ``previous``, this code's check in a guard of the same model that this check's guard
        replaces during the optimizer's first step (``trainwise run`` meets an optimizer that is a local of a
        function only then, after the model's first forwards): what it saw of the forwards before this step."""

    def close(self) -> None:
        """Drop whatever the check holds (hooks of its own, references)."""


class OncePerStep:
    """When a forward-time scan is due: on the first call after each step (the guard's step count moved since
    the last scan), or while no step is taken (no optimizer, no backward) every ``check_every``-th call
    without an optimizer. ``ready()`` counts the
    call and says whether the scan is due; ``fire()`` marks it done until the next step. Nothing runs per
    step for it: a check that uses it needs no ``after_step``."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.every = guard.check_every if guard.optimizer is None else 0
        self.seen = 0
        self.fired_at = -1  # the guard's step count at the last scan

    def ready(self) -> bool:
        if self.guard.step != self.fired_at:
            return True
        if not self.every:
            return False
        self.seen += 1
        return self.seen % self.every == 0

    def fire(self) -> None:
        self.fired_at = self.guard.step
