"""Runtime guards: checks made while training runs, without a host sync per step."""

from __future__ import annotations

import warnings

import torch

from trainwise.errors import NonFiniteLossError


class NonFiniteLossGuard:
    """Remember each step's loss on the device; once per interval, find the first NaN/inf step.

    ``observe`` keeps a detached reference (no kernel, no host sync); ``check`` stacks what it kept, reads
    one flag back and raises :class:`NonFiniteLossError` naming the first bad step.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._steps: list[int] = []
        self._losses: list[torch.Tensor] = []

    def observe(self, loss: torch.Tensor, step: int) -> None:
        self._steps.append(step)
        self._losses.append(loss.detach())

    def first_bad(self) -> tuple[int, float] | None:
        """``(step, value)`` of the first non-finite loss observed since the last reset, or None."""
        if not self._losses:
            return None
        losses = torch.stack([loss.reshape(()).float() for loss in self._losses])
        bad = ~torch.isfinite(losses)
        if not bool(bad.any()):  # the one host sync
            self.reset()
            return None
        index = int(bad.nonzero()[0, 0])
        return self._steps[index], float(losses[index])

    def check(self) -> None:
        found = self.first_bad()
        if found is None:
            return
        step, value = found
        raise NonFiniteLossError(
            f"the training loss became {value} at step {step}; lower the learning rate, clip gradients "
            "(max_grad_norm) or use nonfinite='skip' to skip such steps.",
            step=step,
        )

    def reset(self) -> None:
        self._steps.clear()
        self._losses.clear()


class UnoptimizedParameterWarning(UserWarning):
    """A trainable parameter is in no optimizer group: it will never be updated."""


def check_optimizer_covers(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Warn about parameters that require grad but are in no optimizer group; return their names.

    Typical causes: layers kept in a plain Python list (invisible to ``parameters()`` when the optimizer was
    built) or an optimizer built before a layer was added or unfrozen.
    """
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in in_optimizer]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        warnings.warn(
            f"{len(missing)} trainable parameter(s) are in no optimizer group and will never be updated "
            f"({shown}); build the optimizer from the model's current trainable parameters.",
            UnoptimizedParameterWarning,
            stacklevel=3,
        )
    return missing
