"""Batch conventions: split a batch into inputs and targets, call a model on inputs, count items."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from trainwise.errors import TrainwiseError

INPUT_KEYS = ("inputs", "input", "x", "features", "image", "images", "pixel_values", "input_ids")
TARGET_KEYS = ("targets", "target", "y", "labels", "label")


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` from a 2-tuple/list, or a dict/dataclass with the usual key names."""
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        if len(batch) == 2:
            return batch[0], batch[1]
        raise TrainwiseError(
            f"a batch tuple must be (inputs, targets), got {len(batch)} items; pass "
            "split_batch=... to the Trainer to say which are which."
        )
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    elif hasattr(batch, "_fields"):
        batch = batch._asdict()
    if isinstance(batch, Mapping):
        input_key = next((k for k in INPUT_KEYS if k in batch), None)
        target_key = next((k for k in TARGET_KEYS if k in batch), None)
        if input_key is not None and target_key is not None:
            return batch[input_key], batch[target_key]
        raise TrainwiseError(
            f"cannot tell inputs from targets in a batch with keys {sorted(map(str, batch))}; name them "
            f"'inputs' and 'targets' or pass split_batch=... to the Trainer."
        )
    raise TrainwiseError(
        f"a batch of type {type(batch).__name__} has no targets; yield (inputs, targets) tuples or dicts, "
        "or pass split_batch=... to the Trainer."
    )


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple, ``model(inputs)`` otherwise."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def count_items(targets: Any, *, count: str = "samples", ignore_index: int = -100) -> torch.Tensor | int:
    """Samples in a batch (a host int), or tokens whose target is not ``ignore_index`` (a device tensor)."""
    if count == "tokens":
        if not isinstance(targets, torch.Tensor):
            raise TrainwiseError("count='tokens' needs targets that are a tensor of token ids.")
        return (targets != ignore_index).sum()
    if isinstance(targets, torch.Tensor):
        if targets.dim() == 0:
            return 1
        return targets.shape[0]
    if isinstance(targets, (list, tuple)) and targets:
        return count_items(targets[0], count=count, ignore_index=ignore_index)
    if isinstance(targets, Mapping) and targets:
        return count_items(next(iter(targets.values())), count=count, ignore_index=ignore_index)
    raise TrainwiseError(
        f"cannot count the samples in targets of type {type(targets).__name__}; use tensor targets."
    )


def is_classification(outputs: Any, targets: Any) -> bool:
    """Logits of shape (..., classes) against integer class targets of shape (...)."""
    return (
        isinstance(outputs, torch.Tensor)
        and isinstance(targets, torch.Tensor)
        and outputs.is_floating_point()
        and not targets.is_floating_point()
        and not targets.is_complex()
        and targets.dtype != torch.bool
        and outputs.dim() >= 2
        and outputs.shape[:-1] == targets.shape
    )
