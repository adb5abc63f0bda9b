"""What happens between two optimizer steps, as one object a hand-written loop can use too: each micro-batch's
forward (with the batch conventions of :func:`~trainwise.data.forward_micro_batch`), its backward with the
gradient sync only on the window's last, the loss and accuracy counted into the metrics, then the optimizer
step of :class:`~trainwise.accumulation.GradientAccumulator`.

    >>> step = TrainStep(model, accumulator, forward, metrics)
    >>> for batch, last in loader.with_last():
    ...     if step.add(batch, last=last):        # True when this batch ended a window (the optimizer stepped)
    ...         log_every_so_often(metrics)

With ``skip_nonfinite`` (``nonfinite="skip"``) the losses of a window whose step was skipped are not averaged
in; with a ``splitter`` (:class:`~trainwise.oom.AdaptiveMicroBatches`, ``batch_size="auto"``) each batch is one
window, trained in micro-batches of the size that fits and redone from its start, metrics included, after an
out-of-memory error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from math import isfinite
from typing import Any, Literal

import torch
from torch.nn.functional import cross_entropy

from trainwise.accumulation import GradientAccumulator
from trainwise.data.batches import (
    MicroBatch,
    forward_micro_batch,
    micro_batch_of,
    split_batch,
    takes_labels,
    wants_accuracy,
)
from trainwise.device import move_to_device
from trainwise.metrics import Mean, MetricSet
from trainwise.oom import AdaptiveMicroBatches


class TrainStep:
    """Micro-batches in, optimizer steps out: forward, backward (synced on a window's last), counted, stepped.

    ``forward(model, batch)`` returns a :class:`~trainwise.data.MicroBatch` (a bound
    :func:`~trainwise.data.forward_micro_batch`); ``model`` is the module the loop calls (DDP-wrapped or
    compiled). ``loss_guard`` (a :class:`~trainwise.guards.loss.NonFiniteLossGuard`) sees every loss;
    ``stream`` (a :class:`~trainwise.data.StreamCheck`) counts a worker-loaded stream's samples. ``counts_accuracy``:
    whether accuracy is counted, None until the first batch shows whether outputs are class logits (a resumed
    run passes what its checkpoint recorded).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        accumulator: GradientAccumulator,
        forward: Callable[[Any, Any], MicroBatch],
        metrics: MetricSet,
        *,
        accuracy: Literal["auto", "on", "off"] = "auto",
        ignore_index: int = -100,
        skip_nonfinite: bool = False,
        loss_guard: Any = None,
        stream: Any = None,
        splitter: AdaptiveMicroBatches | None = None,
        counts_accuracy: bool | None = None,
    ) -> None:
        self.model = model
        self.accumulator = accumulator
        self.forward = forward
        self.metrics = metrics
        self.accuracy = accuracy
        self.ignore_index = ignore_index
        self.loss_guard = loss_guard
        self.stream = stream
        self.splitter = splitter
        self.counts_accuracy = counts_accuracy
        # with nonfinite="skip" a window's losses count only once its step is taken
        self.window_loss = Mean(metrics.device) if skip_nonfinite else None
        # whether the plain way applies (None: not decided until the first batch, see _plain_decided), and the
        # device it moves batches to
        self._plain: bool | None = None
        self._plain_to: torch.device | None = None

    def add(self, batch: Any, *, last: bool) -> bool:
        """Train one batch (``last``: the epoch's last); True when it ended a window and the optimizer stepped
        (or skipped a non-finite step). With a splitter every batch is a whole window."""
        if self._plain and self._plain_window(batch):
            return True
        if self.splitter is not None:
            self.window(batch)
            return True
        ends = self.accumulator.ends_window(last=last)
        self.micro_batch(batch, last=ends)
        if ends:
            if self.window_loss is None:
                self.accumulator.step()  # finish() without its nonfinite="skip" bookkeeping: one frame less a step
            else:
                self.finish()
        return ends

    def micro_batch(self, batch: Any, *, last: bool) -> None:
        """Forward and backward one micro-batch (the gradient sync only when ``last`` ends the window), and count
        it; the optimizer step is :meth:`finish`'s."""
        accumulator, model = self.accumulator, self.model
        if last or getattr(type(model), "no_sync", None) is None:  # sync_context's test: no context to enter
            micro = self._forward_backward(batch)
        else:
            with accumulator.sync_context(model, last=last):
                micro = self._forward_backward(batch)
        self._count(micro, accumulator.optimizer_steps + 1)
        if self._plain is None:
            self._plain = self._plain_decided(micro)

    def _count(self, micro: MicroBatch, step: int) -> None:
        """The micro-batch's loss and accuracy into the metrics, its loss to the guard (``step``: the optimizer
        step it is part of)."""
        loss = None if micro.loss is None else micro.loss.detach()  # detached once for the metric and the guard
        value = (self.window_loss or self.metrics.mean("loss")).update_loss(loss, micro.count, micro.reduction)
        if self.counts_accuracy is not False:  # decided on the first batch; off: no call a step
            self._count_accuracy(micro)
        if self.loss_guard is not None and loss is not None and (value is None or not isfinite(value)):
            self.loss_guard.observe(loss, step)  # a loss read finite on the host can never be the guard's finding

    def _forward_backward(self, batch: Any) -> MicroBatch:
        micro = self.forward(self.model, batch)
        self._backward(micro)
        return micro

    def _backward(self, micro: MicroBatch) -> None:
        if self.stream is not None and self.stream.limit is not None:  # a worker-loaded stream with a length
            self.stream.add(micro.targets)
        if micro.loss is None:  # no counted item (every token ignored): no gradient, no loss value
            self.accumulator.backward_empty(micro.outputs)
        else:
            self.accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)

    def _plain_decided(self, micro: MicroBatch) -> bool:
        """Whether the batches that follow may take the plain way (:meth:`_plain_window`), judged once from the
        first: the Trainer's own forward (no loss_fn, split_batch, autocast or labels= of its own, samples
        counted), class logits against one target per sample, and a window of one micro-batch that nothing
        weights, syncs or retries."""
        forward, accumulator = self.forward, self.accumulator
        options = getattr(forward, "keywords", None)
        if (getattr(forward, "func", None) is not forward_micro_batch or options is None
                or set(options) - {"device", "split", "loss_fn", "count", "ignore_index", "reduction", "autocast"}
                or options.get("split", split_batch) is not split_batch or options.get("loss_fn") is not None
                or options.get("count", "auto") not in ("auto", "samples") or options.get("reduction", "mean") != "mean"
                or options.get("autocast") is not None or options.get("ignore_index", -100) != self.ignore_index):
            return False
        if (self.splitter is not None or self.window_loss is not None or accumulator.steps != 1
                or accumulator.scaler is not None or accumulator.max_grad_norm is not None
                or accumulator.skip_nonfinite or accumulator.distributed
                or getattr(type(self.model), "no_sync", None) is not None or takes_labels(self.model)):
            return False
        if (micro.model_loss or micro.reduction != "mean" or micro.loss is None
                or type(micro.outputs) is not torch.Tensor or micro.outputs.dim() != 2
                or type(micro.targets) is not torch.Tensor or micro.targets.dim() != 1):
            return False
        self._plain_to = options.get("device")
        return True

    def _plain_window(self, batch: Any) -> bool:
        """One batch as one window, the way a hand-written loop does it (forward, cross-entropy, backward, step),
        when :meth:`_plain_decided` allowed it and the batch is an ``(inputs, targets)`` pair of tensors with
        one target per sample: the same arithmetic as :meth:`micro_batch` and :meth:`finish`, with none of
        their checks of what the batch and the model's outputs are. False (nothing done) for any other batch."""
        if (type(batch) is not list and type(batch) is not tuple) or len(batch) != 2:
            return False
        inputs, targets = batch
        if type(inputs) is not torch.Tensor or type(targets) is not torch.Tensor or targets.dim() != 1:
            return False
        items = targets.shape[0]
        if not items:
            return False
        to = self._plain_to
        if to is not None and (inputs.device != to or targets.device != to):
            inputs, targets = move_to_device(inputs, to), move_to_device(targets, to)
        accumulator, step = self.accumulator, self.accumulator.optimizer_steps + 1
        outputs = self.model(inputs)
        if type(outputs) is torch.Tensor and outputs.dim() == 2:
            loss = cross_entropy(outputs, targets, ignore_index=self.ignore_index)
            if self.stream is not None and self.stream.limit is not None:
                self.stream.add(targets)
            accumulator.backward_and_step(loss, count=items)
            loss = loss.detach()
            value = self.metrics.mean("loss").update_loss(loss, items)
            if self.counts_accuracy:
                self.metrics.accuracy("accuracy", ignore_index=self.ignore_index).update(outputs, targets)
            if self.loss_guard is not None and (value is None or not isfinite(value)):
                self.loss_guard.observe(loss, step)
            return True
        # outputs of another kind than the first batch's: the general rules from here
        micro = micro_batch_of(self.model, inputs, outputs, targets, items, None, 0, False, None, self.ignore_index,
                               "mean")
        self._backward(micro)
        self._count(micro, step)
        self.finish()
        return True

    def finish(self) -> bool:
        """The window's optimizer step; a skipped (non-finite) step's losses are not averaged in."""
        stepped = self.accumulator.step()
        if self.window_loss is not None:
            if stepped:
                self.metrics.mean("loss").update_sum(*self.window_loss.fold())
            self.window_loss.reset()
        return stepped

    def window(self, batch: Any) -> bool:
        """One batch of ``effective_batch`` samples as one window, in micro-batches of the size that fits; out of
        memory, the window is undone (gradients, counts, metrics) and redone at half the size. Then the step."""
        splitter = self.splitter
        assert splitter is not None, "window() needs a splitter"
        metrics = self.metrics.snapshot()
        seen = None if self.stream is None else self.stream.seen
        pending = None if self.window_loss is None else self.window_loss.snapshot()

        def discard() -> None:
            self.accumulator.discard_window()
            self.metrics.restore(metrics)
            if self.stream is not None:
                self.stream.seen = seen
            if pending is not None:
                self.window_loss.restore(pending)  # type: ignore[union-attr]

        splitter.step = self.accumulator.optimizer_steps
        splitter.run(batch, lambda part, last: self.micro_batch(part, last=last), discard=discard)
        return self.finish()

    def take_halvings(self) -> list[tuple[int, int]]:
        """The splitter's micro-batch halvings since the last call, as (old size, new size): for the caller to
        report (the splitter never calls up into it)."""
        if self.splitter is None or not self.splitter.halvings:
            return []
        halvings, self.splitter.halvings = self.splitter.halvings, []
        return halvings

    def _count_accuracy(self, micro: MicroBatch) -> None:
        """Count correct predictions once the first batch has shown that outputs are class logits."""
        if self.counts_accuracy is None:
            self.counts_accuracy = wants_accuracy(self.accuracy, micro)
            window = self.accumulator.steps
            if micro.targets is None and window > 1:
                warnings.warn(
                    f"the loss has no target and each step accumulates {window} micro-batches, so a loss that "
                    "compares samples within a batch (in-batch negatives, contrastive losses) sees each "
                    "micro-batch alone; raise batch_size and lower the accumulation if it needs the whole batch.",
                    UserWarning, stacklevel=4)
        if self.counts_accuracy:
            self.metrics.accuracy("accuracy", ignore_index=self.ignore_index).update(micro.outputs, micro.targets)


__all__ = ["TrainStep"]
