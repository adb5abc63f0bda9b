"""Evaluation mode done right: ``eval()`` plus ``inference_mode()``, and every module's own mode restored."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


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
