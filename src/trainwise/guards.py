"""Runtime guards: checks made while training runs, without a host sync per step."""

from __future__ import annotations

import warnings

import torch

from trainwise.errors import NonFiniteLossError


class NonFiniteLossGuard:
    """Record, on the device, the first step whose loss was NaN or infinite; check it once per interval.

    ``observe`` queues two small kernels and never waits for the device; ``check`` reads one number back
    and raises :class:`NonFiniteLossError` naming the first bad step.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._first_bad = torch.full((), -1, dtype=torch.int64, device=self.device)
        self._value = torch.zeros((), dtype=torch.float32, device=self.device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach().reshape(()).float()
        newly_bad = (~torch.isfinite(loss)) & (self._first_bad < 0)
        self._first_bad = torch.where(newly_bad, step, self._first_bad)
        self._value = torch.where(newly_bad, loss, self._value)

    def first_bad_step(self) -> int | None:
        step = int(self._first_bad)
        return None if step < 0 else step

    def check(self, *, hint: str = "") -> None:
        step = self.first_bad_step()
        if step is None:
            return
        value = float(self._value)
        raise NonFiniteLossError(
            f"the training loss became {value} at step {step}; lower the learning rate, clip gradients "
            f"(max_grad_norm) or use nonfinite='skip' to skip such steps{hint}.",
            step=step,
        )

    def reset(self) -> None:
        self._first_bad.fill_(-1)


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
