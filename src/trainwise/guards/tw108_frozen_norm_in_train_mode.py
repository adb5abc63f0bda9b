"""TW108 at run time: a frozen norm layer with running statistics left in train mode during training, so
its running mean and variance drift although its parameters are frozen."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwise.freezing import has_running_stats, is_pinned_eval
from trainwise.guards.check import Check, OncePerStep


def _deciding_params(modules: dict[str, nn.Module], name: str) -> list[nn.Parameter]:
    """The parameters that say whether norm layer ``name`` is frozen: its own, or (with none, as with
    ``affine=False``) those of its nearest ancestor that has any, as :func:`trainwise.freezing.pin_frozen_norm_layers`
    decides."""
    own = list(modules[name].parameters(recurse=False))
    while not own and name:
        name = name.rpartition(".")[0]
        own = list(modules[name].parameters())
    return own


def _frozen(params: list[nn.Parameter]) -> bool:
    return bool(params) and not any(p.requires_grad for p in params)


class FrozenNormInTrainMode(Check):
    """A norm layer with running statistics, all of whose deciding parameters are frozen, in train mode during
    a training forward (grad enabled, model in train mode). The frozen layers are listed at install and at each
    check interval; the scan runs on the first training forward after each optimizer step (every
    ``check_every`` training forwards without an optimizer) and confirms the layer is still frozen before
    reporting it, once per layer."""

    code = "TW108"

    def on_install(self) -> None:
        self._due = OncePerStep(self.guard)
        self._done: set[str] = set()
        self._refresh()

    def on_check(self) -> None:
        self._refresh()

    def before_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._due.ready() or not module.training or not torch.is_grad_enabled():
            return
        self._due.fire()
        for name, layer, params in self._frozen_layers:
            if layer.training and not is_pinned_eval(layer) and _frozen(params) and name not in self._done:
                self._done.add(name)
                self._report(name, layer)

    def close(self) -> None:
        self._frozen_layers = []

    def _refresh(self) -> None:
        modules = dict(self.guard.model.named_modules())
        self._frozen_layers: list[tuple[str, nn.Module, list[nn.Parameter]]] = []
        for name, layer in modules.items():
            if name in self._done or not has_running_stats(layer):
                continue
            params = _deciding_params(modules, name)
            if _frozen(params):
                self._frozen_layers.append((name, layer, params))
        self.guard.listen(self, "before_forward", bool(self._frozen_layers))  # none frozen: nothing to see until then

    def _report(self, name: str, layer: nn.Module) -> None:
        self.guard.report(
            self.code, name or "(the model)",
            f"{type(layer).__name__} `{name or '(the model)'}` is frozen but in train mode, so every training batch "
            f"overwrites its running statistics; freeze with trainwise.freeze() (or call "
            f"trainwise.freezing.pin_frozen_norm_layers(model)), or call .eval() on the frozen part after each "
            f"model.train().",
        )
