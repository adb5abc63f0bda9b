"""The user's module inside the wrappers that training adds (DDP, DataParallel, FSDP1, torch.compile)."""

from __future__ import annotations

from torch import nn

_DATA_PARALLEL = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def unwrap_model(model: nn.Module) -> nn.Module:
    """Strip ``DistributedDataParallel``/``DataParallel`` (``.module``) and ``torch.compile`` (``._orig_mod``)."""
    while True:
        if isinstance(model, _DATA_PARALLEL):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model
