"""TW109 at run time: an optimizer step after a backward through a float16 autocast forward, with no GradScaler."""

from __future__ import annotations

import sys
from typing import Any

import torch

from trainwise.guards.check import Check, sample_gap

_DEVICE_TYPES = ("cuda", "cpu")
_MAX_DEPTH = 16  # frames searched above the step hook: scaler.step -> _maybe_opt_step -> optimizer wrappers


def called_from_grad_scaler() -> bool:
    """Whether an enabled ``GradScaler.step`` (any subclass: ``torch.amp``, ``torch.cuda.amp``, FSDP's
    ``ShardedGradScaler``) is on the call stack; a few frame reads, so call it only when it matters."""
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in ("step", "_maybe_opt_step") and "grad_scaler" in code.co_filename:
            scaler = frame.f_locals.get("self")
            return bool(getattr(scaler, "_enabled", True))
        frame = frame.f_back
    return False


# one C call that says whether any autocast is on (torch.nn.RNN uses it too); without it, the two per device
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def _float16_autocast() -> bool:
    """Whether autocast is on with float16 for CUDA or the CPU right now."""
    if not _any_autocast():
        return False
    for device_type in _DEVICE_TYPES:
        if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) is torch.float16:
            return True
    return False


class Float16WithoutScaler(Check):
    """A step whose gradients came through a float16 autocast forward, not taken by ``GradScaler.step``.

    Only the steps TW102 samples are looked at (steps 0, 32, 64, 128, 256, then one in 256: the same wakes): a
    loop that runs float16 without a scaler does it every step. On those, each training forward notes autocast's
    dtype (two C calls), and the step looks for a scaler on the stack only after a float16 one; nothing runs on
    the other steps, not even for a correct float16 loop with its scaler."""

    code = "TW109"

    def on_install(self) -> None:
        self._fp16 = False  # the last forward with grad enabled on this sampled step ran under float16 autocast
        self._done = False
        self.guard.listen(self, "before_step", False)  # called at a sampled step only after a float16 forward
        if self.guard.optimizer is None:  # no optimizer step to judge
            if self.guard.steps_at_backward:  # the first step's forwards noted for a guard that takes over
                self.guard.at_step(1, self._stop)
            else:
                self.guard.listen(self, "before_forward", False)
            return
        self._sample(first=True)

    def take_over(self, previous: Check) -> None:
        # the forward before the optimizer's first step ran under the replaced guard: its autocast is judged now
        if isinstance(previous, Float16WithoutScaler) and previous._fp16 and not self._done:
            self._fp16 = True
            self.guard.listen(self, "before_step", True)

    def _sample(self, *, first: bool = False) -> None:
        if self._done:
            return
        if not first:
            self.guard.listen(self, "before_forward", True)
        step = self.guard.step
        self.guard.at_step(step + 1, self._stop)
        self.guard.at_step(step + sample_gap(step), self._sample)

    def _stop(self) -> None:
        self._fp16 = False
        self.guard.listen(self, "before_forward", False)
        self.guard.listen(self, "before_step", False)

    def before_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled():  # evaluation under no_grad does not decide what the step applies
            fp16 = _float16_autocast()
            if fp16 != self._fp16 and not self._done:
                self.guard.listen(self, "before_step", fp16)
            self._fp16 = fp16

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._fp16 or self._done or called_from_grad_scaler():
            return
        self._done = True
        self.guard.listen(self, "before_step", False)
        self.guard.report(
            self.code, type(optimizer).__name__,
            "the gradients come from a float16 autocast forward but no GradScaler scales the loss, so small "
            "gradients underflow to zero; use scaler = torch.amp.GradScaler() with scaler.scale(loss).backward() "
            "and scaler.step(optimizer), or autocast with dtype=torch.bfloat16.",
        )
