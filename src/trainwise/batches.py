"""Batch conventions: split a batch into inputs and target, call a model, read its loss and logits, count items.

The rules, in the order they apply (docs/hand-written-loop.md has them with examples):

- A tuple or list batch is ``(inputs, target)``. A dict (or dataclass, or namedtuple) batch's target is its
  first key among ``labels``, ``label``, ``target``, ``targets``, ``y``; every other key is an input.
- Dict inputs go to the model as keyword arguments; a key that ``forward`` does not take is an error, never
  dropped. A single-key dict goes positionally to a ``forward`` that does not name it. A tuple goes
  positionally, anything else as the one argument.
- The target also goes to the model as ``labels=`` when ``forward`` names a ``labels`` parameter (as
  Hugging Face models do), and never otherwise.
- The loss is ``loss_fn(logits, target)`` when a ``loss_fn`` was given; else the model's own loss when it
  returned one (``.loss``, ``["loss"]``, or the first item of a tuple when it received labels); else
  cross-entropy on the logits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from trainwise.device import move_to_device
from trainwise.errors import TrainwiseError
from trainwise.wrappers import unwrap_model

TARGET_KEYS = ("labels", "label", "target", "targets", "y")  # the first present is the target
_SPLIT_FIX = "or pass split_batch=lambda batch: (inputs, target) to the Trainer"


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(inputs, target)`` from a 2-tuple/list, or from a dict/dataclass/namedtuple (target by key name)."""
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        if len(batch) == 2:
            return batch[0], batch[1]
        raise TrainwiseError(
            f"a batch tuple must be (inputs, target), got {len(batch)} items; yield a dict with a 'labels' key "
            f"{_SPLIT_FIX}."
        )
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    elif hasattr(batch, "_fields"):
        batch = batch._asdict()
    if isinstance(batch, Mapping):
        target_key = next((k for k in TARGET_KEYS if k in batch), None)
        if target_key is None:
            raise TrainwiseError(
                f"a batch with keys {sorted(map(str, batch))} has no target; name it "
                f"{', '.join(map(repr, TARGET_KEYS))} {_SPLIT_FIX}."
            )
        inputs = {k: v for k, v in batch.items() if k != target_key}
        if not inputs:
            raise TrainwiseError(f"a batch with only the key {target_key!r} has no inputs for the model.")
        return inputs, batch[target_key]
    raise TrainwiseError(
        f"a batch of type {type(batch).__name__} has no target; yield (inputs, target) tuples or dicts "
        f"{_SPLIT_FIX}."
    )


@dataclasses.dataclass(frozen=True)
class _Signature:
    names: frozenset[str]  # parameters that can be passed by keyword
    any_keyword: bool  # forward(**kwargs)
    takes_labels: bool  # a parameter named labels (not **kwargs)
    positional: int  # parameters that can be passed positionally (-1: *args)
    text: str


_SIGNATURES: dict[Any, _Signature] = {}


def _signature(model: Any) -> _Signature:
    module = unwrap_model(model) if isinstance(model, torch.nn.Module) else model
    forward = getattr(module, "forward", module)
    key = getattr(forward, "__func__", forward)
    found = _SIGNATURES.get(key)
    if found is None:
        try:
            parameters = list(inspect.signature(forward).parameters.values())
        except (TypeError, ValueError):  # a builtin: no signature to read, call it as it is
            found = _Signature(frozenset(), True, False, -1, "(...)")
        else:
            kinds = inspect.Parameter
            keyword = (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
            found = _Signature(
                names=frozenset(p.name for p in parameters if p.kind in keyword),
                any_keyword=any(p.kind is kinds.VAR_KEYWORD for p in parameters),
                takes_labels=any(p.name == "labels" and p.kind is not kinds.VAR_KEYWORD for p in parameters),
                positional=-1 if any(p.kind is kinds.VAR_POSITIONAL for p in parameters) else sum(
                    p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) for p in parameters),
                text=str(inspect.signature(forward)),
            )
        with contextlib.suppress(TypeError):  # unhashable callables are read every time
            _SIGNATURES[key] = found
    return found


def takes_labels(model: Any) -> bool:
    """Whether the model's ``forward`` names a ``labels`` parameter (then it gets the target as ``labels=``)."""
    return _signature(model).takes_labels


def call_model(model: Any, inputs: Any, *, labels: Any = None) -> Any:
    """Call ``model`` on a batch's inputs (see the module docstring), with ``labels=`` when it takes them."""
    return _call(model, inputs, labels, _signature(model))


def _call(model: Any, inputs: Any, labels: Any, signature: _Signature) -> Any:
    extra = {"labels": labels} if labels is not None and signature.takes_labels else {}
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in signature.names] if not signature.any_keyword else []
        if not unknown:
            return model(**inputs, **extra)
        if len(inputs) == 1 and signature.positional != 0:
            return model(next(iter(inputs.values())), **extra)
        name = type(model).__name__
        raise TrainwiseError(
            f"{name}.forward{signature.text} does not take the batch keys {', '.join(map(repr, unknown))}; "
            f"rename or remove them in the data, {_SPLIT_FIX[3:]}."
        )
    if isinstance(inputs, tuple):
        return model(*inputs, **extra)
    return model(inputs, **extra)


def model_loss_and_logits(outputs: Any, *, labels_passed: bool = False) -> tuple[torch.Tensor | None, Any]:
    """``(loss, logits)`` from a model's outputs: a tensor (no loss), a dict or object with ``loss``/``logits``
    (``transformers`` outputs are both), or a tuple whose first item is the loss when the model got labels."""
    if isinstance(outputs, torch.Tensor):
        return None, outputs
    if isinstance(outputs, Mapping):
        return outputs.get("loss"), outputs.get("logits")
    if hasattr(outputs, "logits") or hasattr(outputs, "loss"):
        return getattr(outputs, "loss", None), getattr(outputs, "logits", None)
    if (
        labels_passed
        and isinstance(outputs, (tuple, list))
        and outputs
        and isinstance(outputs[0], torch.Tensor)
        and outputs[0].dim() == 0
    ):
        return outputs[0], outputs[1] if len(outputs) > 1 else None
    return None, None


@dataclasses.dataclass
class MicroBatch:
    """One forward pass: the loss to backpropagate, what it averages over, and what the metrics read."""

    loss: torch.Tensor | None  # None when ``count`` is 0: nothing to learn from (every target ignored)
    count: int | torch.Tensor  # items behind the loss (samples, or tokens whose target is not ignored)
    outputs: Any  # the logits (or the raw outputs when the model returned no structure)
    targets: Any
    reduction: str  # "mean" or "sum": how ``loss`` reduces over ``count``
    model_loss: bool  # the loss came from the model itself


def forward_micro_batch(
    model: Any,
    batch: Any,
    *,
    device: torch.device | str | None = None,
    split: Callable[[Any], tuple[Any, Any]] = split_batch,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    count: str = "samples",
    ignore_index: int = -100,
    reduction: str = "mean",
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> MicroBatch:
    """Split ``batch``, count its items (on the host when the batch is still there), move it to ``device``,
    call the model and compute the loss by the rule in the module docstring.

    A batch with no counted item (token counts where every target is ``ignore_index``) gets ``loss=None``:
    its mean would be 0/0. Call ``GradientAccumulator.backward_empty(outputs)`` for it instead of ``backward``.
    """
    inputs, targets = split(batch)
    items = count_items(targets, count=count, ignore_index=ignore_index)
    if isinstance(items, torch.Tensor):
        items = int(items)  # a CPU count costs nothing; a count on an accelerator is one sync, needed to
        # know that a micro-batch has no token before its loss (a mean over zero items) poisons the gradient
    if device is not None:
        inputs, targets = move_to_device(inputs, device), move_to_device(targets, device)
    signature = _signature(model)  # read once a step: it sits on every step's path
    labels_passed = signature.takes_labels
    with autocast():
        outputs = _call(model, inputs, targets, signature)
        own_loss, logits = model_loss_and_logits(outputs, labels_passed=labels_passed)
        if logits is None and loss_fn is not None:
            logits = outputs  # a loss_fn of the user's own reads whatever the model returned
        elif logits is None and own_loss is None:
            raise TrainwiseError(
                f"the model returned a {type(outputs).__name__} with neither a loss nor logits; return a tensor "
                "of logits or a dict or object with 'loss' and 'logits', or pass loss_fn=... that reads it."
            )
        if items == 0:
            loss = None
        elif loss_fn is not None:
            loss = loss_fn(logits, targets)
        elif own_loss is not None:
            loss, reduction = own_loss, "mean"  # transformers' losses are means over the counted items
        else:
            loss = default_loss(logits, targets, ignore_index=ignore_index)
    model_loss = loss_fn is None and own_loss is not None
    return MicroBatch(loss=loss, count=items, outputs=logits, targets=targets, reduction=reduction,
                      model_loss=model_loss)


def default_loss(logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
    """Cross-entropy, with classes last for (batch, tokens, classes) logits against (batch, tokens) targets
    (language models), and in dimension 1 otherwise (torch's convention, e.g. segmentation)."""
    if logits.dim() > 2 and isinstance(targets, torch.Tensor) and logits.shape[:-1] == targets.shape:
        logits, targets = logits.flatten(0, -2), targets.flatten()
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index)


def mark_last(batches: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """``(batch, is_last)`` for each batch, looking one batch ahead: the last batch of an epoch is known
    without ``len()``, so an accumulation window (and DDP's gradient sync) can end on it."""
    iterator = iter(batches)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


def count_items(targets: Any, *, count: str = "samples", ignore_index: int = -100) -> torch.Tensor | int:
    """Samples in a batch (a host int), or tokens whose target is not ``ignore_index`` (a tensor)."""
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


def wants_accuracy(setting: str, micro: MicroBatch) -> bool:
    """``accuracy="on"``, ``"off"``, or ``"auto"``: counted when the first micro-batch's outputs are class
    logits for its targets (one target per sample when the model computed its own loss)."""
    return setting == "on" or (
        setting == "auto" and is_classification(micro.outputs, micro.targets, per_sample=micro.model_loss)
    )


def is_classification(outputs: Any, targets: Any, *, per_sample: bool = False) -> bool:
    """Logits of shape (..., classes) against integer class targets of shape (...); with ``per_sample``,
    only one target per sample (a model's own loss may shift token targets, so they are not compared)."""
    return (
        isinstance(outputs, torch.Tensor)
        and isinstance(targets, torch.Tensor)
        and outputs.is_floating_point()
        and not targets.is_floating_point()
        and not targets.is_complex()
        and targets.dtype != torch.bool
        and outputs.dim() >= 2
        and outputs.shape[:-1] == targets.shape
        and (not per_sample or targets.dim() == 1)
    )
