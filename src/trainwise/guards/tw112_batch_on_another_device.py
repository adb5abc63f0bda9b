"""TW112: a batch tensor on another device than the model's parameters, said in place of torch's own error."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from trainwise.guards.check import Check

_MAX_DEPTH = 4  # nesting of tuples, lists and dicts searched inside one argument


class BatchOnAnotherDevice(Check):
    """A tensor argument of the model's forward (or one inside tuples, lists and dicts) on another device than
    the model's first parameter: fails with the field's name (``batch["attention_mask"]``) and the fix.

    Where the guard wraps ``model.forward`` (the plain case) it judges only a forward that raised: no cost on
    the calls that work, and no report for a model that moves its inputs itself. Elsewhere (hooks: a compiled
    model, ``forwards=``, the AutoGuard) it looks before each checked forward, since a hook cannot see the
    error. It reads the first parameter's device and each tensor's; what looks wrong is confirmed against
    every parameter's device (a model split over devices takes inputs on any of them). CPU scalars (0-dim)
    mix with any device in torch and pass, as do CPU integer tensors whose name says they hold lengths
    (``pack_padded_sequence`` wants those on the CPU).
    """

    code = "TW112"

    def on_install(self) -> None:
        model = self.guard.model
        self._refresh()
        try:
            signature = inspect.signature(model.forward)
            self._names = [
                p.name for p in signature.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        except (TypeError, ValueError):
            self._names = []
        if self.guard.wraps_forward_call:
            self.guard.listen(self, "before_forward", False)  # judged from the forward's error instead

    def on_forward_error(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], error: Exception
    ) -> None:
        self.before_forward(module, args, kwargs)

    def _refresh(self) -> None:
        """Cache the first parameter (with the module and key that hold it), its device and every device."""
        params = list(self.guard.model.named_parameters())
        self._param: torch.Tensor | None = params[0][1] if params else None
        self._device = params[0][1].device if params else None
        self._devices = frozenset(p.device for _, p in params)
        self._owner: dict[str, Any] = {}
        self._key = ""
        if params:
            path, _, self._key = params[0][0].rpartition(".")
            self._owner = self.guard.model.get_submodule(path)._parameters

    def before_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._param is None:
            return
        param = self._owner.get(self._key)
        if param is None or param.device != self._device:  # the model moved (.to() may replace parameters)
            self._refresh()
        devices = self._devices
        for i, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                if value.device not in devices:
                    self._mismatch(self._arg_name(i), value)
            elif isinstance(value, (tuple, list, dict)):
                self._walk(value, devices, self._arg_name(i), 1)
        for key, value in kwargs.items():
            if isinstance(value, torch.Tensor):
                if value.device not in devices:
                    self._mismatch(key, value)
            elif isinstance(value, (tuple, list, dict)):
                self._walk(value, devices, key, 1)

    def _walk(self, value: Any, devices: frozenset[torch.device], name: str, depth: int) -> None:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(item, torch.Tensor):
                if item.device not in devices:
                    self._mismatch(_item_name(name, key), item)
            elif depth < _MAX_DEPTH and isinstance(item, (tuple, list, dict)):
                self._walk(item, devices, _item_name(name, key), depth + 1)

    def _arg_name(self, index: int) -> str:
        return self._names[index] if index < len(self._names) else f"args[{index}]"

    def _mismatch(self, name: str, tensor: torch.Tensor) -> None:
        """Fail unless torch accepts the tensor there, or the model has parameters on its device after all."""
        if tensor.device.type == "cpu" and (
            tensor.dim() == 0 or ("len" in name.lower() and not tensor.is_floating_point())
        ):
            return
        self._refresh()  # the model may have new parameters since the last look
        if self._param is None or tensor.device in self._devices:
            return
        device = self._device
        self.guard.fail(
            self.code, name,
            f"{name} is on {tensor.device}, the model on {device}; move the batch with "
            f"trainwise.move_to_device(batch, {str(device)!r}) before calling the model.",
        )


def _item_name(name: str, key: Any) -> str:
    """``batch["attention_mask"]`` for a dict key, ``inputs[0]`` for a position."""
    return f'{name}["{key}"]' if isinstance(key, str) else f"{name}[{key!r}]"
