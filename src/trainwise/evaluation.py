"""Evaluation mode done right: ``eval()`` plus ``inference_mode()``, and every module's own mode restored."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from trainwise.errors import TrainwiseError


def training_modes(model: torch.nn.Module) -> dict[str, bool]:
    """The ``training`` flag of every submodule, by qualified name (``""`` is the model itself)."""
    return {name: module.training for name, module in model.named_modules(remove_duplicate=False)}


def restore_training_modes(model: torch.nn.Module, modes: dict[str, bool]) -> None:
    """Set each submodule's flag back; ``model.train()`` would also flip layers the user kept in eval."""
    for name, module in model.named_modules(remove_duplicate=False):
        if name in modes:
            module.training = modes[name]


@contextlib.contextmanager
def evaluating(model: torch.nn.Module, *, inference: bool = True) -> Iterator[torch.nn.Module]:
    """Run a block with the model in eval mode and autograd off, then restore every submodule's mode.

    ``inference=True`` uses ``torch.inference_mode()`` (fastest; its tensors can never enter autograd);
    ``inference=False`` uses ``torch.no_grad()`` for outputs that must later be used in a graph.
    """
    modes = training_modes(model)
    model.eval()
    grad_off = torch.inference_mode() if inference else torch.no_grad()
    try:
        with grad_off:
            yield model
    finally:
        restore_training_modes(model, modes)


def evaluate(
    model: torch.nn.Module,
    loader: Iterable[Any],
    forward: Callable[[torch.nn.Module, Any], Any],
    *,
    device: torch.device | str = "cpu",
    accuracy: str = "auto",
    ignore_index: int = -100,
) -> dict[str, float]:
    """Loss (and accuracy) over a whole loader under :func:`evaluating`, counted by sample (or token) and
    summed over every process. ``forward(model, batch)`` returns a :class:`~trainwise.data.MicroBatch`
    (as :func:`~trainwise.data.forward_micro_batch` does); ``accuracy`` is ``"auto"``, ``"on"`` or ``"off"``.

    Under FSDP every process must run as many forwards (each gathers parameters): a process with a shorter
    shard repeats its last batch and discards the result.
    """
    from trainwise.data.batches import wants_accuracy
    from trainwise.data.samplers import validation_padding
    from trainwise.distributed import any_rank, is_distributed
    from trainwise.metrics import MetricSet

    metrics = MetricSet(device)
    loss_metric = metrics.mean("loss")
    counted: bool | None = None
    padding = validation_padding(model, loader, device)
    last_batch = None
    with evaluating(model):
        for batch in loader:
            micro = forward(model, batch)
            last_batch = batch
            loss_metric.update_loss(micro.loss, micro.count, micro.reduction)
            counted = wants_accuracy(accuracy, micro) if counted is None else counted
            if counted:
                metrics.accuracy("accuracy", ignore_index=ignore_index).update(micro.outputs, micro.targets)
        for _ in range(padding):
            if last_batch is None:
                raise TrainwiseError(
                    "a process got no validation batch under FSDP; use a validation set with at least as many "
                    "batches as processes."
                )
            forward(model, last_batch)
    if is_distributed() and any_rank(bool(counted), device=device):
        metrics.accuracy("accuracy", ignore_index=ignore_index)  # the same metrics on every process
    metrics.all_reduce()
    return metrics.compute()
