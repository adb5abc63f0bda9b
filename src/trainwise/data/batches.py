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
- ``count="auto"`` (the default) counts tokens when the first batch shows that the loss is a mean over tokens:
  the model's own loss on (batch, tokens) labels that it matches as a token cross-entropy (causal or not), or
  trainwise's cross-entropy on (batch, tokens, vocabulary) logits; samples otherwise (a ``loss_fn``, one
  label per sample, no target). The choice is made once per model (:func:`count_choice` says it and why).
- With ``count="tokens"`` the count is what the loss averages over. A model's own loss is measured once per
  model against the logits: cross-entropy over the labels as they are (masked LMs, token classifiers,
  encoder-decoders) or shifted by one (causal LMs, where position t predicts label t+1, so a sequence
  counts ``labels[..., 1:] != ignore_index``). A loss that is neither is refused: pass ``loss_fn``.
- A target of ``None`` (``split_batch=lambda batch: (batch, None)``, for losses without targets such as
  contrastive ones) counts the batch's samples from its inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from trainwise.data.samplers import PaddingBatch, padding_forward, padding_outputs, zero_rows
from trainwise.device import move_to_device
from trainwise.errors import TrainwiseError, with_article
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
                f"{', '.join(map(repr, TARGET_KEYS))} {_SPLIT_FIX} (for a loss without a target, "
                "split_batch=lambda batch: (batch, None) with loss_fn=...)."
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
    takes_labels: bool  # a parameter named labels, or **kwargs (a wrapper such as peft's PeftModel)
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
            found = _Signature(frozenset(), True, False, -1, "(...)")  # no labels: it may not take keywords
        else:
            kinds = inspect.Parameter
            keyword = (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
            found = _Signature(
                names=frozenset(p.name for p in parameters if p.kind in keyword),
                any_keyword=any(p.kind is kinds.VAR_KEYWORD for p in parameters),
                takes_labels=any(p.name == "labels" or p.kind is kinds.VAR_KEYWORD for p in parameters),
                positional=-1 if any(p.kind is kinds.VAR_POSITIONAL for p in parameters) else sum(
                    p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) for p in parameters),
                text=str(inspect.signature(forward)),
            )
        with contextlib.suppress(TypeError):  # unhashable callables are read every time
            _SIGNATURES[key] = found
    return found


def takes_labels(model: Any) -> bool:
    """Whether the model's ``forward`` takes ``labels`` (a parameter of that name, or ``**kwargs`` as wrappers
    such as peft's ``PeftModel`` have): then it gets the target as ``labels=`` and its own loss is used."""
    return _signature(model).takes_labels


def call_model(model: Any, inputs: Any, *, labels: Any = None) -> Any:
    """Call ``model`` on a batch's inputs (see the module docstring), with ``labels=`` when it takes them."""
    return _call(model, inputs, labels, _signature(model))


def _call(model: Any, inputs: Any, labels: Any, signature: _Signature) -> Any:
    extra = {"labels": labels} if labels is not None and signature.takes_labels else {}
    if type(inputs) is torch.Tensor:  # the common case first: isinstance(..., Mapping) runs Python code
        return model(inputs, **extra)
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
    count: str = "auto",
    ignore_index: int = -100,
    reduction: str = "mean",
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> MicroBatch:
    """Split ``batch``, count its items (on the host when the batch is still there), move it to ``device``,
    call the model and compute the loss by the rule in the module docstring.

    A batch with no counted item (token counts where every target is ``ignore_index``) gets ``loss=None``:
    its mean would be 0/0. Call ``GradientAccumulator.backward_empty(outputs)`` for it instead of ``backward``.
    So does a padding batch of real samples (``trainwise.data.PaddingBatch``), with count 0 and its
    outputs and targets cut to zero rows: it runs the model (collectives and shapes stay valid), adds nothing.
    """
    if isinstance(batch, PaddingBatch):  # real samples padding a rank's shard under DDP: trained with weight 0
        with padding_forward(model):
            micro = forward_micro_batch(model, batch.batch, device=device, split=split, loss_fn=loss_fn,
                                        count=count, ignore_index=ignore_index, reduction=reduction,
                                        autocast=autocast)
        # no loss, no count; zero rows for the metrics, still attached to the graph for backward_empty
        micro.outputs = padding_outputs(micro.outputs, micro.loss if micro.model_loss else None)
        micro.loss, micro.count, micro.targets = None, 0, zero_rows(micro.targets)
        return micro
    inputs, targets = split(batch)
    samples = None
    if count == "auto":
        chosen = _chosen_count(model)
        if chosen is not None:
            count = chosen
        elif targets is None or loss_fn is not None or not _token_labels(targets):
            count = _choose(model, "samples", _sample_reason(targets, loss_fn))
        else:  # token labels: the first forward tells whether the loss is a mean over them
            samples = count_items(targets)
    tokens, shifted = count != "samples", None
    shift = _measured_shift(model) if tokens and loss_fn is None else 0  # None: not measured yet
    if targets is None:
        items: Any = count_items(inputs) if not tokens else _no_target_tokens()
    else:
        items = count_items(targets, count="tokens" if tokens else count, ignore_index=ignore_index, shift=shift or 0)
        if shift is None:  # the first batch of a model not measured yet: the count of either convention
            shifted = count_items(targets, count="tokens", ignore_index=ignore_index, shift=1)
    if isinstance(items, torch.Tensor):
        items = int(items)  # a CPU count costs nothing; a count on an accelerator is one sync, needed to
        # know that a micro-batch has no token before its loss (a mean over zero items) poisons the gradient
    if device is not None:
        inputs, targets = move_to_device(inputs, device), move_to_device(targets, device)
    signature = _signature(model)
    with autocast() if autocast is not None else contextlib.nullcontext():
        outputs = _call(model, inputs, targets, signature)
        return micro_batch_of(model, inputs, outputs, targets, items, shifted, shift, signature.takes_labels,
                              loss_fn, ignore_index, reduction, samples=samples)


def micro_batch_of(model: Any, inputs: Any, outputs: Any, targets: Any, items: Any, shifted: Any, shift: int | None,
                   labels: bool, loss_fn: Callable[[Any, Any], torch.Tensor] | None, ignore_index: int,
                   reduction: str, *, samples: Any = None) -> MicroBatch:
    """The :class:`MicroBatch` of what ``model`` returned for ``inputs``: its loss by the rule in the module
    docstring (``items``: the counted items; ``shift``: the model's label shift, None until measured;
    ``labels``: whether the model takes ``labels=``; ``samples``: the batch's samples while ``count="auto"``
    is still to be chosen, from this forward)."""
    labels_passed = labels and targets is not None
    own_loss, logits = model_loss_and_logits(outputs, labels_passed=labels_passed)
    if logits is None and loss_fn is not None:
        logits = outputs  # a loss_fn of the user's own reads whatever the model returned
    elif logits is None and own_loss is None:
        raise TrainwiseError(
            f"the model returned {with_article(type(outputs).__name__)} with neither a loss nor logits; return a "
            "tensor of logits or a dict or object with 'loss' and 'logits', or pass loss_fn=... that reads it."
        )
    if samples is not None:  # count="auto", the model's first batch of token labels: tokens, or samples?
        found = _auto_count(model, own_loss, logits, targets, ignore_index)
        if found is None:
            items, shift = int(samples), 0
        else:
            if found and shift is None:
                items = int(shifted)
            shift = found
    if shift is None:
        if own_loss is None:
            shift = 0  # trainwise's cross-entropy: the labels as they are
        else:
            shift = label_shift(model, own_loss, logits, targets, ignore_index=ignore_index)
            if shift is not None:
                with contextlib.suppress(TypeError):  # a callable that takes no weak reference: measured again
                    _LABEL_SHIFT[model] = shift
        if shift:
            items = int(shifted)
    if items == 0:
        loss = None
    elif loss_fn is not None:
        loss = loss_fn(logits, targets)
    elif own_loss is not None:
        loss, reduction = own_loss, "mean"  # transformers' losses are means over the counted items
    else:
        if targets is None:
            raise TrainwiseError(
                "a batch without a target needs a loss: pass loss_fn=lambda outputs, targets: ... (targets "
                "is None), or return the loss from the model."
            )
        if isinstance(logits, torch.Tensor) and logits.dim() == 3 and model not in _CHECKED_FOR_UNSHIFTED:
            _warn_if_unshifted_language_model(model, inputs, logits, targets, ignore_index)
        loss = default_loss(logits, targets, ignore_index=ignore_index)
    return MicroBatch(loss=loss, count=items, outputs=logits, targets=targets, reduction=reduction,
                      model_loss=loss_fn is None and own_loss is not None)


@dataclasses.dataclass(frozen=True)
class BatchConventions:
    """What a batch is and how its loss is computed, declared once: :func:`forward_micro_batch`'s options as an
    object that applies them (``conventions(model, batch)``); the Trainer builds it from its configuration.

    Declared, so which way a batch takes is decided when they are built: with the default conventions (the
    batch split by :func:`split_batch`, trainwise's cross-entropy, samples counted, a mean), an ``(inputs,
    targets)`` pair of tensors with one class target per sample, for a model whose ``forward`` takes no
    ``labels``, is the model's call and one cross-entropy (:meth:`class_pair`). Every other batch, and every
    other convention, goes through :func:`forward_micro_batch`; both give the same :class:`MicroBatch`.
    """

    device: torch.device | str | None = None
    split: Callable[[Any], tuple[Any, Any]] = split_batch
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    count: str = "auto"
    ignore_index: int = -100
    reduction: str = "mean"
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    # the default conventions hold: a pair of tensors with class targets may take the short way (class_pair)
    pairs: bool = dataclasses.field(init=False, repr=False, compare=False)
    # the models seen to take no labels and to count samples: facts fixed once a model's first batch was seen
    _pair_models: weakref.WeakSet[Any] = dataclasses.field(init=False, repr=False, compare=False,
                                                           default_factory=weakref.WeakSet)

    def __post_init__(self) -> None:
        if self.device is not None:  # a torch.device: a batch already there compares equal and is not moved
            object.__setattr__(self, "device", torch.device(self.device))
        object.__setattr__(self, "pairs", self.split is split_batch and self.loss_fn is None
                           and self.count in ("auto", "samples") and self.reduction == "mean")

    def __call__(self, model: Any, batch: Any) -> MicroBatch:
        """The :class:`MicroBatch` of one batch under these conventions."""
        micro = self.class_pair(model, batch) if self.pairs else None
        if micro is not None:
            return micro
        return forward_micro_batch(model, batch, device=self.device, split=self.split, loss_fn=self.loss_fn,
                                   count=self.count, ignore_index=self.ignore_index, reduction=self.reduction,
                                   autocast=self.autocast)

    def class_pair(self, model: Any, batch: Any) -> MicroBatch | None:
        """An ``(inputs, targets)`` pair of tensors with one class target per sample, for a model that takes no
        ``labels`` and counts samples: the model's call and cross-entropy, as the general rules would do it.
        None, with nothing run, for any other batch or model (the general rules apply)."""
        if (type(batch) is not tuple and type(batch) is not list) or len(batch) != 2:
            return None
        inputs, targets = batch
        if type(inputs) is not torch.Tensor or type(targets) is not torch.Tensor or targets.dim() != 1:
            return None
        if not targets.shape[0] or not self._takes_class_pairs(model):
            return None
        if self.device is not None:
            inputs, targets = move_to_device(inputs, self.device), move_to_device(targets, self.device)
        with self.autocast() if self.autocast is not None else contextlib.nullcontext():
            outputs = model(inputs)
            if type(outputs) is not torch.Tensor or outputs.dim() != 2:  # not class logits: the general rules
                return micro_batch_of(model, inputs, outputs, targets, targets.shape[0], None, 0, False, None,
                                      self.ignore_index, "mean")
            loss = torch.nn.functional.cross_entropy(outputs, targets, ignore_index=self.ignore_index)
        return MicroBatch(loss=loss, count=targets.shape[0], outputs=outputs, targets=targets, reduction="mean",
                          model_loss=False)

    def _takes_class_pairs(self, model: Any) -> bool:
        """Whether ``model`` takes no ``labels`` (so never computes its own loss) and counts samples: with
        ``count="auto"``, once its first batch chose samples (the general rules choose, and keep why)."""
        if model in self._pair_models:
            return True
        if takes_labels(model) or (self.count == "auto" and _chosen_count(model) != "samples"):
            return False
        with contextlib.suppress(TypeError):  # a model that takes no weak reference is asked each time
            self._pair_models.add(model)
        return True


# label shift of each model's own token loss, measured on its first batch (0: labels as they are, 1: causal)
_LABEL_SHIFT: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_CHECKED_FOR_UNSHIFTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _measured_shift(module: Any) -> int | None:
    try:
        return _LABEL_SHIFT.get(module)
    except TypeError:
        return None


_LOSS_FN_FIX = "pass loss_fn=lambda logits, labels: ... that computes the loss trainwise should weight"


def label_shift(model: Any, loss: torch.Tensor, logits: Any, labels: Any, *, ignore_index: int = -100) -> int | None:
    """How a model's own token loss aligns its logits with ``labels``: 0 when position t predicts label t
    (masked LMs, token classifiers, encoder-decoders), 1 when it predicts label t+1 (causal LMs), None when
    this batch cannot tell (ask again on the next one).

    Measured, not assumed: the loss is compared with the cross-entropy of the logits against the labels as
    they are and shifted by one. A loss that matches neither (label smoothing, an auxiliary loss added, a
    sum) averages over something trainwise cannot count, and is refused.
    """
    if isinstance(model, torch.nn.Module):
        model = unwrap_model(model)
    name = type(model).__name__
    declared = _declared_shift(model)
    if not (isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor) and logits.dim() >= 2
            and logits.shape[:-1] == labels.shape and labels.dim() >= 1):
        if declared is not None:
            return declared
        raise TrainwiseError(
            f"count='tokens' needs the logits that {name}'s own loss averages over, and they do not line up "
            f"with the labels; {_LOSS_FN_FIX}."
        )
    with torch.no_grad():
        value = float(loss.detach().float())
        flat = logits.detach().float()
        counted, matches, compared = [], [], 0
        for shift in (0, 1):
            cut_labels = labels[..., shift:].to(flat.device)
            counted.append(int((cut_labels != ignore_index).sum()))
            if counted[-1] == 0 or not math.isfinite(value):
                continue  # nothing to compare on this alignment
            compared += 1
            cut_logits = flat[..., : flat.shape[-2] - shift, :]
            expected = float(torch.nn.functional.cross_entropy(
                cut_logits.flatten(0, -2), cut_labels.flatten(), ignore_index=ignore_index))
            if abs(value - expected) <= 1e-4 * max(1.0, abs(expected)):
                matches.append(shift)
    if len(matches) == 1:
        return matches[0]
    # a loss that matches neither alignment averages over something else (a router term added): what the model
    # declares is no proof then, only where the batch cannot tell
    if declared is not None and not (compared and not matches):
        return declared
    if not math.isfinite(value):  # a mean over no token: only an alignment that counts none gives it
        return 1 if counted[1] == 0 < counted[0] else None
    if matches or counted == [0, 0]:
        return None  # both alignments give this loss (or none has a token): decide on a later batch
    raise TrainwiseError(
        f"count='tokens' weights each micro-batch by its tokens, but {name}'s own loss ({value:.6g}) is not the "
        f"mean cross-entropy over its labels as they are or shifted by one, so trainwise cannot know what it "
        f"averages over; {_LOSS_FN_FIX}."
    )


# count="auto": the count chosen for each model, with the reason (see count_choice)
_COUNT_CHOICE: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()


def count_choice(model: Any) -> tuple[str, str] | None:
    """What ``count="auto"`` chose for ``model`` and why (``("tokens", "...")``), once its first batch was seen;
    None before."""
    key = unwrap_model(model) if isinstance(model, torch.nn.Module) else model
    try:
        return _COUNT_CHOICE.get(key)
    except TypeError:
        return None


def _chosen_count(model: Any) -> str | None:
    found = count_choice(model)
    return None if found is None else found[0]


def _choose(model: Any, count: str, reason: str) -> str:
    key = unwrap_model(model) if isinstance(model, torch.nn.Module) else model
    with contextlib.suppress(TypeError):  # a callable that takes no weak reference: chosen again each batch
        _COUNT_CHOICE[key] = (count, reason)
    return count


def _token_labels(targets: Any) -> bool:
    """Integer labels with a token dimension: (batch, tokens), not one label per sample."""
    return (isinstance(targets, torch.Tensor) and targets.dim() >= 2 and not targets.is_floating_point()
            and not targets.is_complex() and targets.dtype is not torch.bool)


def _sample_reason(targets: Any, loss_fn: Any) -> str:
    if loss_fn is not None:
        return "the loss is your loss_fn's, which trainwise cannot see averaging over tokens (pass count='tokens' " \
               "if it is a mean over them)"
    if targets is None:
        return "the batches have no target"
    return "the labels are one per sample"


def _auto_count(model: Any, own_loss: Any, logits: Any, targets: Any, ignore_index: int) -> int | None:
    """``count="auto"`` on a model's first batch of token labels: the label shift when the loss is a mean over
    its tokens (counted as tokens from here), else None (samples), the choice kept with its reason."""
    name = type(unwrap_model(model) if isinstance(model, torch.nn.Module) else model).__name__
    lined_up = (isinstance(logits, torch.Tensor) and logits.dim() == targets.dim() + 1
                and logits.shape[:-1] == targets.shape)
    if own_loss is None:
        if lined_up:
            _choose(model, "tokens", "cross-entropy over (batch, tokens, vocabulary) logits is a mean over the "
                                     "tokens whose label is not ignore_index")
            return 0
        _choose(model, "samples", "the logits are not one row per token label")
        return None
    try:
        shift = label_shift(model, own_loss, logits, targets, ignore_index=ignore_index)
    except TrainwiseError:
        shift = None
    if shift is None:
        _choose(model, "samples", f"{name}'s own loss is not a mean cross-entropy over its token labels as they "
                                  "are or shifted by one (pass count='tokens' with loss_fn= to weight by tokens)")
        return None
    with contextlib.suppress(TypeError):
        _LABEL_SHIFT[model] = shift
    what = "shifted by one (a causal LM)" if shift else "as they are"
    _choose(model, "tokens", f"{name}'s own loss is a mean over its token labels {what}, ignore_index left out")
    return shift


def _declared_shift(model: Any) -> int | None:
    """The shift a Hugging Face model declares (its ``loss_type``, as transformers' own Trainer reads it)."""
    if "transformers" not in sys.modules:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    if not hasattr(base, "loss_type") or not hasattr(base, "config"):
        return None
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:
        return None
    causal = LOSS_MAPPING.get(base.loss_type or "ForCausalLM") is ForCausalLMLoss
    return int(causal and not getattr(base.config, "is_encoder_decoder", False))


def _no_target_tokens() -> int:
    raise TrainwiseError(
        "count='tokens' counts target tokens, and this batch has no target; use count='samples' for a loss "
        "without targets."
    )


def _warn_if_unshifted_language_model(module: Any, inputs: Any, logits: Any, targets: Any, ignore_index: int) -> None:
    """Say once when cross-entropy is about to train (B, T, V) logits to predict the (B, T) input tokens at
    their own positions: the signature of a causal LM whose loss lost its label shift."""
    with contextlib.suppress(TypeError):  # looked at once per model (a callable without weak references: each time)
        _CHECKED_FOR_UNSHIFTED.add(module)
    if not isinstance(inputs, Mapping):
        return
    ids = inputs.get("input_ids")
    if not (isinstance(logits, torch.Tensor) and logits.dim() == 3 and isinstance(targets, torch.Tensor)
            and isinstance(ids, torch.Tensor) and ids.shape == targets.shape == logits.shape[:-1]):
        return
    if isinstance(module, torch.nn.Module):
        module = unwrap_model(module)
    counted = targets != ignore_index
    if bool(counted.any()) and bool((ids[counted] == targets[counted]).all()):
        warnings.warn(
            f"trainwise computes cross-entropy of {type(module).__name__}'s (batch, tokens, vocabulary) logits "
            "against labels equal to the input tokens at the same positions, so every position learns to copy "
            "its own input: a causal LM needs its labels shifted by one; let the model compute its loss (it "
            "gets labels=) or pass loss_fn= that shifts them.",
            UserWarning,
            stacklevel=4,
        )


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


def count_items(
    targets: Any, *, count: str = "samples", ignore_index: int = -100, shift: int = 0
) -> torch.Tensor | int:
    """Samples in a batch (a host int), or tokens whose target is not ``ignore_index`` (a tensor); ``shift=1``
    leaves out each sequence's first label, which a causal LM never predicts."""
    if count == "tokens":
        if not isinstance(targets, torch.Tensor):
            raise TrainwiseError("count='tokens' needs targets that are a tensor of token ids.")
        return ((targets[..., shift:] if shift else targets) != ignore_index).sum()
    if isinstance(targets, torch.Tensor):
        if targets.dim() == 0:
            return 1
        return targets.shape[0]
    if isinstance(targets, (list, tuple)) and targets:
        return count_items(targets[0], count=count, ignore_index=ignore_index)
    if isinstance(targets, Mapping) and targets:
        return count_items(next(iter(targets.values())), count=count, ignore_index=ignore_index)
    if dataclasses.is_dataclass(targets) and not isinstance(targets, type):
        return count_items([getattr(targets, f.name) for f in dataclasses.fields(targets)])
    raise TrainwiseError(
        f"cannot count the samples in {with_article(type(targets).__name__)}; give the batch a tensor target, or for a "
        "loss without a target, split_batch=lambda batch: (batch, None) (samples are then counted from the "
        "inputs)."
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
