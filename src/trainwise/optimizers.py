"""The optimizer and scheduler of a run, from an instance or a factory, checked before the first step."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from trainwise.errors import TrainwiseError
from trainwise.freezing import fold_equal_groups, param_groups
from trainwise.guards.loss import check_optimizer_covers

OptimizerArg = torch.optim.Optimizer | Callable[[list[Any]], torch.optim.Optimizer] | None


def build_optimizer(
    model: torch.nn.Module,
    optimizer: OptimizerArg = None,
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    lr_by_pattern: dict[str, float] | None = None,
    check_coverage: bool = True,
    fold_groups: bool = True,
) -> torch.optim.Optimizer:
    """``optimizer`` itself, or a factory called with the trainable parameter groups (no weight decay on
    biases and norms, ``lr_by_pattern``), default AdamW (torch's fused kernel where every parameter allows it);
    a trainable parameter it misses is warned about (``check_coverage``; the runtime guard's TW107 says the same
    when it runs). A factory's optimizer that gave the no-decay groups the same values as the others (it has no
    weight decay) gets them folded back (:func:`fold_equal_groups`, unless ``fold_groups=False``)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise TrainwiseError("the model has no trainable parameters; unfreeze some (requires_grad=True) before fit().")
    groups = param_groups(model, lr_by_pattern=lr_by_pattern)  # trainable only
    if optimizer is None:
        optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, **_fused_if_supported(groups))
    elif not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise TrainwiseError(
                f"optimizer must be a torch optimizer or a factory of one, got {type(optimizer).__name__}."
            )
        _check_factory_signature(
            "optimizer", optimizer, "the parameter groups", "lambda params: torch.optim.SGD(params, lr=0.1)"
        )
        optimizer = optimizer(groups)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TrainwiseError(
                f"the optimizer factory returned a {type(optimizer).__name__}, not a torch optimizer."
            )
        if fold_groups:
            fold_equal_groups(optimizer, model)
    if check_coverage:
        check_optimizer_covers(model, optimizer)
    return optimizer


def _fused_if_supported(groups: list[dict[str, Any]]) -> dict[str, bool]:
    """``fused=True`` when every parameter is a plain floating-point tensor on a device with torch's fused AdamW
    kernel: one kernel per group instead of a dozen per tensor (about 5x less optimizer time on CPU). Sharded
    (DTensor, FSDP's flat) parameters keep torch's default."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # a torch without the helper: its default
        return {}
    params = [p for group in groups for p in group["params"]]
    if params and all(type(p) is torch.nn.Parameter and p.is_floating_point() and p.device.type in devices
                      for p in params):
        return {"fused": True}
    return {}


def build_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> Any:
    """``scheduler`` itself (anything with ``step``), or a factory called with the optimizer, or None."""
    if scheduler is None or hasattr(scheduler, "step"):
        return scheduler
    if callable(scheduler):
        _check_factory_signature(
            "scheduler", scheduler, "the optimizer", "lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=10)"
        )
        return scheduler(optimizer)
    raise TrainwiseError(f"scheduler must be a scheduler or a factory of one, got {type(scheduler).__name__}.")


def _check_factory_signature(what: str, factory: Callable[..., Any], takes: str, example: str) -> None:
    """Refuse a factory that cannot be called with one argument, before it is called."""
    try:
        inspect.signature(factory).bind(None)
    except TypeError:
        name = getattr(factory, "__name__", type(factory).__name__)
        raise TrainwiseError(
            f"the {what} factory {name}{inspect.signature(factory)} must take one argument, {takes}, "
            f"like {example}."
        ) from None
    except ValueError:  # a builtin without a signature: the call itself will tell
        pass
