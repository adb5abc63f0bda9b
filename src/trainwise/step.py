"""What happens between two optimizer steps, as one object a hand-written loop can use too: each micro-batch's
forward (with the batch conventions of :class:`~trainwise.data.BatchConventions`), its backward with the
gradient sync only on the window's last, the loss and accuracy counted into the metrics, then the optimizer
step. The window's arithmetic (each loss weighted by its share of the window's samples or tokens, the step's
normalisation, unscaling, clipping) is :class:`~trainwise.accumulation.GradientAccumulator`'s alone, the same
calls a hand-written loop makes.

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

from trainwise.accumulation import GradientAccumulator
from trainwise.data.batches import MicroBatch, wants_accuracy
from trainwise.metrics import Mean, MetricSet
from trainwise.oom import AdaptiveMicroBatches


class TrainStep:
    """Micro-batches in, optimizer steps out: forward, backward (synced on a window's last), counted, stepped.

    ``forward(model, batch)`` returns a :class:`~trainwise.data.MicroBatch`: a
    :class:`~trainwise.data.BatchConventions` (the Trainer's), or any function such as a bound
    :func:`~trainwise.data.forward_micro_batch`; ``model`` is the module the loop calls (DDP-wrapped or
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

    def add(self, batch: Any, *, last: bool) -> bool:
        """Train one batch (``last``: the epoch's last); True when it ended a window and the optimizer stepped
        (or skipped a non-finite step). With a splitter every batch is a whole window."""
        if self.splitter is not None:
            self.window(batch)
            return True
        ends = self.accumulator.ends_window(last=last)
        self.micro_batch(batch, last=ends)
        if ends:
            self.finish()
        return ends

    def micro_batch(self, batch: Any, *, last: bool) -> None:
        """Forward and backward one micro-batch (the gradient sync only when ``last`` ends the window), and count
        it; the optimizer step is :meth:`finish`'s."""
        with self.accumulator.sync_context(self.model, last=last):
            micro = self.forward(self.model, batch)
            self._backward(micro)
        self._count(micro, self.accumulator.optimizer_steps + 1)

    def _count(self, micro: MicroBatch, step: int) -> None:
        """The micro-batch's loss and accuracy into the metrics, its loss to the guard (``step``: the optimizer
        step it is part of)."""
        loss = None if micro.loss is None else micro.loss.detach()  # detached once for the metric and the guard
        value = (self.window_loss or self.metrics.mean("loss")).update_loss(loss, micro.count, micro.reduction)
        if self.counts_accuracy is not False:
            self._count_accuracy(micro)
        if self.loss_guard is not None and loss is not None and (value is None or not isfinite(value)):
            self.loss_guard.observe(loss, step)  # a loss read finite on the host can never be the guard's finding

    def _backward(self, micro: MicroBatch) -> None:
        """The micro-batch's backward through the accumulator, the window's one arithmetic."""
        if self.stream is not None and self.stream.limit is not None:  # a worker-loaded stream with a length
            self.stream.add(micro.targets)
        if micro.loss is None:  # no counted item (every token ignored): no gradient, no loss value
            self.accumulator.backward_empty(micro.outputs)
        else:
            self.accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)

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
