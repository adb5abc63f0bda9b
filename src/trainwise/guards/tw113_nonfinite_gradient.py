"""TW113: optimizer steps that applied a non-finite (inf or NaN) gradient, naming the parameter and the steps."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainwise.guards.check import Check

_LOW = (torch.float16, torch.bfloat16, torch.float32)


class NonFiniteGradient(Check):
    """The first parameter whose weights turned inf or NaN, and the interval of steps that did it.

    Nothing runs per step: a step that applies an inf or NaN gradient leaves the weights it updates inf or NaN
    (SGD, Adam and their kin; clipping turns inf into NaN), and they stay so. So every ``check_every`` steps,
    with the read the guard makes there anyway, ``on_check`` takes the float32 norm of every parameter
    (``torch._foreach_norm``, one call) and names the first that is not finite and the steps since the last
    check (``check_every=1`` names the exact step, at one host sync a step). Steps a ``GradScaler`` skips
    (``step()`` not called, or a fused optimizer's ``found_inf``) leave the weights finite and so unreported.
    Weights already non-finite when the guard starts (a broken checkpoint) are reported as such. Without an
    optimizer (an update written out, ``p.data.add_(p.grad, alpha=-lr)``) the model's trainable parameters are
    read, the steps counted by backward passes.
    """

    code = "TW113"
    about_steps = True

    def on_install(self) -> None:
        self._done = False
        self._groups = -1
        self._checked_at = 0  # the guard's step at the last check: the interval starts after it
        self._params: list[torch.Tensor] = []
        optimizer = self.guard.optimizer
        if optimizer is not None:
            self._load(optimizer.param_groups)
        elif self.guard.steps_at_backward:  # a loop that updates the weights itself: the trainable ones
            self._load([{"params": [p for p in self.guard.model.parameters() if p.requires_grad]}])
        if self._params:
            self._judge(before_training=True)

    def _load(self, groups: list[dict[str, Any]]) -> None:
        """Cache the parameters of the optimizer's groups and their names (again when a group is added)."""
        names = {id(p): name for name, p in self.guard.model.named_parameters()}
        self._params = [p for group in groups for p in group["params"]]
        self._names = [
            names.get(id(p), f"param_groups[{g}][{i}]")
            for g, group in enumerate(groups) for i, p in enumerate(group["params"])
        ]
        self._groups = len(groups)
        # float32 norms keep float16 ones from overflowing; float64 or complex weights keep their own dtype
        self._dtype = torch.float32 if all(p.dtype in _LOW for p in self._params) else None

    def on_check(self) -> None:
        optimizer = self.guard.optimizer
        if self._done or not self._params:
            return
        if optimizer is not None and len(optimizer.param_groups) != self._groups:
            self._load(optimizer.param_groups)
        self._judge(before_training=False)

    def _judge(self, *, before_training: bool) -> None:
        first, last = self._checked_at + 1, self.guard.step
        self._checked_at = last
        if not self._params or (last < first and not before_training):
            return
        with torch.no_grad():
            norms = torch._foreach_norm(self._params, 2.0, dtype=self._dtype)
            device = norms[0].device
            try:
                stacked = torch.stack(norms)
            except RuntimeError:  # parameters on several devices (a model split across them)
                stacked = torch.stack([n if n.device == device else n.to(device) for n in norms])
            # the norms are >= 0, so their sum is finite exactly when each is (barring a float32 overflow of the
            # sum, which the per-norm look below clears): two operations and the one host sync of the interval
            if math.isfinite(stacked.sum().item()):
                return
            finite = torch.isfinite(stacked)
            if bool(finite.all()):
                return
        flags = finite.cpu().tolist()
        name = self._names[flags.index(False)]
        count = flags.count(False)
        others = f" (and {count - 1} more of the {len(flags)} parameters)" if count > 1 else ""
        self._done = True
        if before_training:
            when = "were already inf or NaN when the guard started (a broken checkpoint or initialisation)"
            fix = "load finite weights before training"
        else:
            steps = f"at step {last}" if first == last else f"at one of steps {first}-{last}"
            who = "the optimizer" if self.guard.optimizer is not None else "an update"
            when = f"turned inf or NaN: {who} applied an inf or NaN gradient {steps}"
            fix = ("find the overflowing loss or layer (check_every=1 names the exact step and the first parameter), "
                   "lower the learning rate, clip with torch.nn.utils.clip_grad_norm_, or train float16 with a "
                   "torch.amp.GradScaler")
        self.guard.report(self.code, name, f"the weights of {name}{others} {when}; {fix}.", step=last)
