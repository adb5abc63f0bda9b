"""The user's module and optimizer inside the wrappers that training adds: DDP, DataParallel and torch.compile
around a module; Accelerate's ``AcceleratedOptimizer`` and Lightning's ``LightningOptimizer`` around an
optimizer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_DATA_PARALLEL = (nn.DataParallel, nn.parallel.DistributedDataParallel)
_MAX_WRAPPERS = 8  # optimizer wrappers followed, at most


def is_compiled_module(model: Any) -> bool:
    """Whether ``model`` is the module ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    return type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module)


def model_layers(model: nn.Module) -> list[nn.Module]:
    """``model`` and each module it wraps (``.module`` of DDP/DataParallel, ``._orig_mod`` of torch.compile),
    outermost first: the last is the user's module."""
    layers = [model]
    while True:
        if isinstance(model, _DATA_PARALLEL):
            model = model.module
        elif is_compiled_module(model):
            model = model._orig_mod
        else:
            return layers
        layers.append(model)


def unwrap_model(model: nn.Module) -> nn.Module:
    """Strip ``DistributedDataParallel``/``DataParallel`` (``.module``) and ``torch.compile`` (``._orig_mod``)."""
    while True:  # model_layers(model)[-1], without the list: this runs on every step
        if isinstance(model, _DATA_PARALLEL):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def optimizer_layers(optimizer: Any) -> list[Any]:
    """``optimizer`` and each optimizer it wraps, outermost first, following ``.optimizer`` (Accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``, most other wrappers) down to the last torch
    optimizer found: the one that really steps. Without one inside, ``[optimizer]``."""
    chain = [optimizer]
    while len(chain) < _MAX_WRAPPERS:
        inner = getattr(chain[-1], "optimizer", None)
        if inner is None or any(inner is seen for seen in chain):
            break
        chain.append(inner)
    last = max((i for i, layer in enumerate(chain) if isinstance(layer, torch.optim.Optimizer)), default=0)
    return chain[:last + 1]


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's, Lightning's or any wrapper whose ``.optimizer`` is one (the one
    whose ``step`` runs the optimizer's hooks); anything else unchanged."""
    return optimizer_layers(optimizer)[-1]
