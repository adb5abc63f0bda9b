"""TW103 at run time: the model evaluated (under ``no_grad``/``inference_mode``) with dropout or BatchNorm in
train mode, i.e. ``model.eval()`` forgotten."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwise.freezing import has_running_stats, is_pinned_eval
from trainwise.guards.check import Check, OncePerStep


def _acts_differently(module: nn.Module) -> bool:
    """A module whose output depends on its mode: dropout with ``p > 0`` (on its own, in attention or between
    RNN layers) and norm layers with running statistics."""
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return module.p > 0
    if isinstance(module, (nn.MultiheadAttention, nn.RNNBase)):
        return float(module.dropout) > 0 and (not isinstance(module, nn.RNNBase) or module.num_layers > 1)
    return has_running_stats(module)


class EvaluationInTrainMode(Check):
    """A forward of the guarded model with grad disabled (an evaluation) while a dropout or running-statistics
    norm layer of it is in train mode. The modules are listed at install and at each check interval; the scan
    runs on the first grad-disabled forward after each optimizer step (every ``check_every`` such forwards
    without an optimizer), so a training forward costs one ``torch.is_grad_enabled()`` call."""

    code = "TW103"

    def on_install(self) -> None:
        self._due = OncePerStep(self.guard)
        self._refresh()

    def on_check(self) -> None:
        self._refresh()

    def before_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled():
            return
        if not self._due.ready():
            return
        self._due.fire()
        self._scan()

    def close(self) -> None:
        self._modules = []

    def _refresh(self) -> None:
        modules = self.guard.model.named_modules()
        self._modules: list[tuple[str, nn.Module]] = [(name, m) for name, m in modules if _acts_differently(m)]
        self.guard.listen(self, "before_forward", bool(self._modules))  # no dropout or norm module: nothing to see

    def _scan(self) -> None:
        training = [(name, m) for name, m in self._modules if m.training and not is_pinned_eval(m)]
        if not training:
            return
        name, first = training[0]
        where = name or "(the model)"
        others = f" and {len(training) - 1} more dropout or norm module(s)" if len(training) > 1 else ""
        self.guard.report(
            self.code, where,
            f"the model is evaluated (gradients off) with {type(first).__name__} `{where}`{others} in train mode, "
            f"so dropout stays on and BatchNorm uses and updates batch statistics; call model.eval() before "
            f"evaluating and model.train() after.",
        )
