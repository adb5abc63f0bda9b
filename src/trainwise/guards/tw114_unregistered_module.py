"""TW114 at run time: a submodule, parameter or trainable tensor that its module holds without registering it
(in a plain list, tuple or dict attribute, or as a plain attribute), so ``parameters()``, ``.to()``,
``train()``/``eval()`` and ``state_dict()`` do not see it: the optimizer never updates it and checkpoints omit it."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import torch
from torch import nn

from trainwise.guards.check import Check

MAX_DEPTH = 4  # containers inside containers followed (self.heads = {"a": [nn.Linear(...)]} is depth 2)
MAX_ITEMS = 1024  # items of one container looked at: a long list of tokens or ids holds no module
_SKIPPED = (str, bytes, int, float, bool, complex, type(None), type, range, torch.dtype, torch.device)


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes every ``nn.Module`` keeps for itself (``_parameters``, ``_modules``, the hook dicts...)."""
    return frozenset(vars(nn.Module()))


@dataclasses.dataclass
class _Held:
    path: str  # from the attribute: "blocks[2]", "heads['a']", "scale"
    value: Any


class UnregisteredModule(Check):
    """Walks the registered module tree once, when the guard starts: every attribute of every module that is
    not one of its registered submodules, parameters or buffers, into plain lists, tuples, dicts and dataclass
    instances (up to ``MAX_DEPTH`` deep, ``MAX_ITEMS`` items each). It reports, once per attribute:

    - an ``nn.Module`` the model does not register anywhere that holds a parameter requiring grad the model does
      not register, or a dropout (``p > 0``) in train mode (``model.eval()`` will not reach it);
    - an ``nn.Parameter`` the model does not register;
    - a leaf tensor with ``requires_grad=True`` (``self.scale = torch.ones(1, requires_grad=True)``).

    Left alone, on purpose: what the model registers elsewhere too (an alias list of its own layers, a
    back-reference to a parent, ``nn.RNN``'s ``_flat_weights``); a frozen module hidden in a list (the usual way
    to keep a teacher out of ``state_dict``) and parameter-free modules without dropout (``nn.ReLU``), which
    lose nothing; plain tensors that do not require grad (constants, masks, caches, aliases of buffers such
    as transformers' ``original_inv_freq``: common and mostly deliberate, and a wrong device fails at the first
    forward with torch's own error); non-leaf tensors (outputs kept by a forward: TW102's business); other
    objects (a config, a trainer) are not entered. Nothing runs per step."""

    code = "TW114"

    def on_install(self) -> None:
        model = self.guard.model
        self._modules = {id(m) for m in model.modules()}
        self._registered = {id(t) for t in itertools.chain(model.parameters(), model.buffers())}
        internals = _module_internals()
        for name, module in model.named_modules():
            for attribute, value in vars(module).items():
                if attribute in internals or isinstance(value, _SKIPPED):
                    continue
                held: list[_Held] = []
                try:
                    self._walk(value, attribute, 0, held)
                except Exception:  # an object whose attributes raise when read: not this check's to judge
                    continue
                if held:
                    self._report(name, module, attribute, value, held)
        self._modules, self._registered = set(), set()

    def _walk(self, value: Any, path: str, depth: int, held: list[_Held]) -> None:
        if isinstance(value, _SKIPPED):
            return
        if isinstance(value, nn.Module):
            if id(value) not in self._modules and self._loses_something(value):
                held.append(_Held(path, value))
            return
        if isinstance(value, torch.Tensor):
            if id(value) in self._registered:
                return
            if isinstance(value, nn.Parameter) or (value.requires_grad and value.is_leaf):
                held.append(_Held(path, value))
            return
        if depth >= MAX_DEPTH:
            return
        if isinstance(value, dict):
            for key, item in itertools.islice(value.items(), MAX_ITEMS):
                self._walk(item, f"{path}[{key!r}]", depth + 1, held)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(itertools.islice(value, MAX_ITEMS)):
                self._walk(item, f"{path}[{index}]", depth + 1, held)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = object.__getattribute__(value, "__dict__")  # as stored: no property or __getattr__ runs
            for field in dataclasses.fields(value):
                if field.name in fields:
                    self._walk(fields[field.name], f"{path}.{field.name}", depth + 1, held)

    def _trains(self, module: nn.Module) -> bool:
        """A parameter that trains and that the model does not register."""
        return any(p.requires_grad and id(p) not in self._registered for p in module.parameters())

    def _loses_something(self, module: nn.Module) -> bool:
        """A parameter that trains and that the model does not register, or a dropout in train mode."""
        if self._trains(module):
            return True
        return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training
                   and id(m) not in self._modules for m in module.modules())

    def _report(self, owner: str, module: nn.Module, attribute: str, value: Any, held: list[_Held]) -> None:
        base = "model" + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in owner.split(".") if part)
        names = [f"`{base}.{h.path}`" for h in held]
        if len(names) > 3:
            shown = f"{', '.join(names[:3])} and {len(names) - 3} more"
        else:
            shown = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        kinds = sorted({_kind(h.value) for h in held})
        where = f"{owner}.{attribute}" if owner else attribute
        if held[0].path != attribute:  # in a container
            container = f"in a plain {type(value).__name__}"
            fix = _registering(value, held)
        elif isinstance(value, (nn.Module, nn.Parameter)):
            container = "as a plain attribute (set past nn.Module.__setattr__, with object.__setattr__ or __dict__)"
            fix = f"assign it as `self.{attribute} = ...` so that {type(module).__name__} registers it"
        else:
            container = "as a plain tensor attribute"
            fix = (f"make it `self.{attribute} = nn.Parameter(...)`, or register_buffer('{attribute}', ...) if it "
                   f"should not train")
        them = "it" if len(held) == 1 else "them"
        if any(not isinstance(h.value, nn.Module) or self._trains(h.value) for h in held):
            lost = (f"model.parameters(), .to() and state_dict() do not see {them}, so the optimizer never updates "
                    f"{them} and checkpoints omit {them}")
        else:  # dropout only
            they = "it keeps" if len(held) == 1 else "they keep"
            lost = f"model.eval() does not reach {them}, so {they} dropping out in evaluation"
        self.guard.report(
            self.code, where,
            f"{shown} ({', '.join(kinds)}) {'is' if len(held) == 1 else 'are'} held {container}, which nn.Module "
            f"does not register: {lost}; {fix}.",
        )


def _kind(value: Any) -> str:
    if isinstance(value, nn.Module):
        return type(value).__name__
    if isinstance(value, nn.Parameter):
        return "nn.Parameter"
    return "tensor with requires_grad=True"


def _registering(value: Any, held: list[_Held]) -> str:
    """The fix for what a plain container holds: nn.ModuleList/ModuleDict for modules, nn.ParameterList/
    ParameterDict for parameters and trainable tensors."""
    if dataclasses.is_dataclass(value):
        return (f"hold them as submodules or parameters of the module (nn.ModuleDict), not fields of a "
                f"{type(value).__name__}")
    is_dict = isinstance(value, dict)
    if all(isinstance(h.value, nn.Module) for h in held):
        return "use an nn.ModuleDict instead" if is_dict else "use an nn.ModuleList instead"
    if not any(isinstance(h.value, nn.Module) for h in held):
        return "use an nn.ParameterDict instead" if is_dict else "use an nn.ParameterList instead"
    return "hold the modules in an nn.ModuleList or nn.ModuleDict and the tensors as nn.Parameter"
