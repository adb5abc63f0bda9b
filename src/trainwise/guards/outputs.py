"""What the runtime guards read from a model's output: the tensors that carry its autograd graph."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import torch

MAX_TAGGED = 4  # tensors of one output looked at, at most

def tensors_with_graph(output: Any) -> list[torch.Tensor]:
    """The tensors of ``output`` (itself, or one level into a tuple, list, dict, ``ModelOutput`` or dataclass,
    then one more into the tuples and lists there: an LSTM's ``(output, (h, c))``) that have autograd history, at
    most ``MAX_TAGGED``; unusual outputs give none and are left alone."""
    if isinstance(output, torch.Tensor):
        return [output] if output.grad_fn is not None else []
    if isinstance(output, (tuple, list)):
        values: Any = output
    elif isinstance(output, Mapping):  # dicts and HF ModelOutput (an OrderedDict)
        values = output.values()
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        values = (getattr(output, field.name, None) for field in dataclasses.fields(output))
    else:
        return []
    found: list[torch.Tensor] = []
    inner: list[Any] = []  # tuples and lists inside, looked into once the first level has been
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None:
                found.append(value)
                if len(found) == MAX_TAGGED:
                    return found
        elif isinstance(value, (tuple, list)) and len(inner) < MAX_TAGGED:
            inner.append(value)
    for group in inner:
        for value in itertools.islice(group, MAX_TAGGED):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                found.append(value)
                if len(found) == MAX_TAGGED:
                    return found
    return found
