"""Metrics as sums and counts of samples (or tokens), kept on the device and read back once per interval.

A mean of per-batch means is wrong when batches differ in size (a short last batch, a token count that
varies); ``correct / len(loader)`` divides by the number of batches. Here every metric keeps a numerator
and a denominator as detached device tensors, so that updating costs no host sync, reading all metrics
costs one, and sums and counts can be all-reduced across processes exactly before the single division.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from typing import Any

import torch

from trainwise.errors import TrainwiseError

# Devices whose tensors' values Python reads without waiting for a device: a training step's loss and correct
# count are added on the host there; elsewhere they stay on the device, read once per log interval.
HOST_READ_DEVICES = frozenset({"cpu"})
# On those devices a batch of at most this many targets (one per sample) is compared as Python lists: one torch
# operation (argmax) instead of three; larger batches compare as tensors.
HOST_COMPARE_MAX = 128


def _accumulator_dtype(device: torch.device) -> torch.dtype:
    # float64 keeps sums of many float32 values and counts up to 2**53 exact; MPS has no float64.
    return torch.float32 if device.type == "mps" else torch.float64


class Metric:
    """A numerator and a denominator on one device; the value is their ratio.

    Counts given as Python numbers are summed on the host (no kernel); counts given as tensors (tokens) on
    the device. Both are folded into ``state`` before anything reads it. On the CPU, where reading a scalar
    costs no device sync, a training step's loss and correct count are added on the host in float64 (the same
    additions, in the same order, as the tensor's: the same bits), one kernel fewer a step each.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        # a normal tensor even when first made under inference_mode (inside evaluating()): an inference
        # tensor could never again be updated, reset or all-reduced outside it
        with torch.inference_mode(False):
            self.state = torch.zeros(2, dtype=_accumulator_dtype(self.device), device=self.device)
            self._total, self._count = self.state[0], self.state[1]  # views, made once
        self._host_count = 0.0
        self._on_host = self.device.type in HOST_READ_DEVICES  # scalars read back for free: host additions
        self._host_total: float | None = None  # when set, the running total (state[0] is behind it)

    def _sync_total(self) -> None:
        """Write the host's running total into ``state`` (before anything adds to or reads the tensor)."""
        if self._host_total is not None:
            self._total.fill_(self._host_total)
            self._host_total = None

    def _add_count(self, count: torch.Tensor | int | float) -> None:
        if isinstance(count, torch.Tensor):
            self._count.add_(count)
        else:
            self._host_count += count

    def fold(self) -> torch.Tensor:
        """Move host-side sums and counts into ``state`` and return it (numerator, denominator)."""
        if self._host_total is not None:
            self._sync_total()
        if self._host_count:
            self._count.add_(self._host_count)
            self._host_count = 0.0
        return self.state

    def reset(self) -> None:
        self.state.zero_()
        self._host_count = 0.0
        self._host_total = None

    def compute(self) -> float:
        """The current value (one host sync). NaN when nothing was counted."""
        total, count = self.fold().tolist()
        return total / count if count else math.nan

    def snapshot(self) -> tuple[torch.Tensor, float]:
        """A device copy of the sums, for :meth:`restore` (no host sync)."""
        self._sync_total()
        return self.state.clone(), self._host_count

    def restore(self, snapshot: tuple[torch.Tensor, float]) -> None:
        self._host_total = None
        self.state.copy_(snapshot[0])
        self._host_count = snapshot[1]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.fold().detach().cpu().clone()}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.reset()
        self.state.copy_(state_dict["state"].to(self.state))


class Mean(Metric):
    """A running mean weighted by the number of samples (or tokens) behind each value."""

    def update(self, value: torch.Tensor | float, weight: torch.Tensor | int | float = 1) -> None:
        """Add ``value``, a mean over ``weight`` items; use :meth:`update_sum` for a sum over them."""
        if self._host_total is not None:
            self._sync_total()
        if isinstance(value, torch.Tensor):
            if value.dim() != 0:  # each op skipped here is a kernel launch saved on every training step
                if value.numel() != 1:
                    raise TrainwiseError(
                        f"Mean.update takes a scalar, got a tensor of shape {tuple(value.shape)}; reduce it "
                        "first or pass its sum to update_sum with the number of items."
                    )
                value = value.reshape(())
            if value.requires_grad:
                value = value.detach()
            if isinstance(weight, torch.Tensor):
                self._total.add_(value * weight)
            else:
                self._total.add_(value, alpha=weight)
        else:
            self._total.add_(value * weight)
        self._add_count(weight)

    def update_loss(
        self, loss: torch.Tensor | None, count: torch.Tensor | int | float, reduction: str = "mean"
    ) -> float | None:
        """Add a loss that means (or sums, ``reduction="sum"``) over ``count`` items; a loss over no item
        (``None``, or ``count`` 0: every target ignored) adds nothing, so it cannot make the mean NaN. Returns
        the loss as a float when it was read on the host to be added (a CPU loss, a metric on the CPU), else
        None: a caller that wants the value (a non-finite check) needs no second read."""
        if loss is None or (not isinstance(count, torch.Tensor) and count == 0):
            return None
        if reduction == "mean":
            if type(count) is int and type(loss) is torch.Tensor and loss.dim() == 0 and not loss.requires_grad:
                # a training step's own case, without the checks below
                if self._on_host and loss.is_cpu:  # float64 on the host: total + float(loss) * count, as add_ does
                    total = self._host_total
                    value = loss.item()
                    self._host_total = (self._total.item() if total is None else total) + value * count
                    self._host_count += count
                    return value
                if self._host_total is not None:
                    self._sync_total()
                self._total.add_(loss, alpha=count)
                self._host_count += count
                return None
            self.update(loss, count)
        else:
            self.update_sum(loss, count)
        return None

    def update_sum(self, total: torch.Tensor | float, count: torch.Tensor | int | float) -> None:
        """Add a sum over ``count`` items (for a loss computed with ``reduction='sum'``)."""
        if self._host_total is not None:
            self._sync_total()
        if isinstance(total, torch.Tensor):
            total = total.detach().reshape(())
        self._total.add_(total)
        self._add_count(count)


class Accuracy(Metric):
    """Correct predictions divided by the samples (or non-ignored tokens) seen: never by batches."""

    def __init__(self, device: torch.device | str = "cpu", *, ignore_index: int | None = -100) -> None:
        super().__init__(device)
        self.ignore_index = ignore_index
        # for targets of one shape: [predictions; ignore_index], its prediction row (a view made once) and the
        # dimensions to sum over
        self._rows: tuple[torch.Size, torch.device, torch.Tensor, torch.Tensor, tuple[int, ...]] | None = None
        self._pending: torch.Tensor | None = None  # [correct, ignored] counted since the last fold (int64)
        self._pending_added = False

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """``logits`` of shape (..., classes) and integer ``targets`` of shape (...)."""
        if logits.shape[:-1] != targets.shape:
            raise TrainwiseError(
                f"Accuracy needs logits of shape (..., classes) and targets of shape (...); got "
                f"{tuple(logits.shape)} and {tuple(targets.shape)}."
            )
        ignore = self.ignore_index
        on_host = self._on_host and targets.is_cpu
        if self._host_total is not None and not on_host:
            self._sync_total()
        if (on_host and targets.dim() == 1 and targets.shape[0] <= HOST_COMPARE_MAX and logits.is_cpu
                and (ignore is None or ignore < 0 or ignore >= logits.shape[-1])):
            # the ignored index is never predicted, so an ignored target never counts as correct
            truth = targets.tolist()
            self._add_on_host(sum(map(operator.eq, logits.argmax(dim=-1).tolist(), truth)))
            self._host_count += len(truth) - (0 if ignore is None else truth.count(ignore))
            return
        if ignore is None:
            correct = (logits.argmax(dim=-1) == targets).sum()  # argmax records no graph
            if on_host:
                self._add_on_host(correct.item())
            else:
                self._total.add_(correct)
            self._host_count += targets.numel()
        elif ignore < 0 or ignore >= logits.shape[-1]:
            # the ignored index is never predicted: one comparison of [predictions; ignore_index] with the targets
            # counts the correct and the ignored positions at once (argmax, eq, sum; on an accelerator one add
            # into the pending counts, folded in when read); the items counted are the targets less the ignored
            rows = self._rows
            if rows is None or rows[0] != targets.shape or rows[1] != targets.device:
                rows = self._rows = self._make_rows(targets)
            torch.argmax(logits, dim=-1, out=rows[3])
            hits = rows[2] == targets
            if on_host:
                correct, ignored = (hits.sum(dim=rows[4]) if rows[4] else hits).tolist()
                self._add_on_host(correct)
                self._host_count += targets.numel() - ignored
                return
            pending = self._pending if self._pending is not None else self._new_pending()
            pending.add_(hits.sum(dim=rows[4]) if rows[4] else hits)
            self._pending_added = True
            self._host_count += targets.numel()
        else:  # a class index can be predicted: ignored positions are masked out of the correct ones
            self._sync_total()
            keep = targets != ignore
            both = torch.stack(((logits.argmax(dim=-1) == targets) & keep, keep))
            self.state.add_((both if both.dim() == 2 else both.reshape(2, -1)).sum(dim=1))

    def _add_on_host(self, correct: int) -> None:
        total = self._host_total
        self._host_total = (self._total.item() if total is None else total) + correct

    def _make_rows(self, targets: torch.Tensor) -> tuple[torch.Size, torch.device, torch.Tensor, torch.Tensor,
                                                          tuple[int, ...]]:
        with torch.inference_mode(False):  # made in evaluation too, written in training after it
            rows = torch.full((2, *targets.shape), self.ignore_index, dtype=torch.int64, device=targets.device)
            return targets.shape, targets.device, rows, rows[0], tuple(range(1, rows.dim()))

    def _new_pending(self) -> torch.Tensor:
        with torch.inference_mode(False):
            self._pending = torch.zeros(2, dtype=torch.int64, device=self.device)
        return self._pending

    def fold(self) -> torch.Tensor:
        self._sync_total()  # the host's total first: the pending counts add to it
        if self._pending_added:  # [correct, ignored] -> total += correct, count -= ignored
            self._total.add_(self._pending[0])  # type: ignore[index]
            self._count.sub_(self._pending[1])  # type: ignore[index]
            self._forget_pending()
        return super().fold()

    def _forget_pending(self) -> None:
        if self._pending_added:
            self._pending.zero_()  # type: ignore[union-attr]  # kept: no allocation on the next step
            self._pending_added = False

    def reset(self) -> None:
        super().reset()
        self._forget_pending()

    def snapshot(self) -> tuple[torch.Tensor, float]:
        self.fold()
        return super().snapshot()

    def restore(self, snapshot: tuple[torch.Tensor, float]) -> None:
        self._forget_pending()
        super().restore(snapshot)

    def update_counts(self, correct: torch.Tensor | int, count: torch.Tensor | int) -> None:
        """Add precomputed counts of correct predictions and of samples."""
        self._sync_total()
        self._total.add_(correct)
        self._add_count(count)


_KINDS: dict[type, str] = {Mean: "mean", Accuracy: "accuracy"}


class MetricSet:
    """Named metrics on one device, read back together with a single host sync.

    >>> metrics = MetricSet("cpu")
    >>> metrics.mean("loss").update(torch.tensor(0.5), 32)
    >>> metrics.accuracy("accuracy").update(torch.randn(32, 10), torch.randint(10, (32,)))
    >>> values = metrics.compute()  # {'loss': 0.5, 'accuracy': ...}
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._metrics: dict[str, Metric] = {}

    def mean(self, name: str) -> Mean:
        metric = self._metrics.get(name)
        if type(metric) is Mean:  # every step looks its metrics up: the common case first
            return metric
        return self._get(name, Mean)  # type: ignore[return-value]

    def accuracy(self, name: str, *, ignore_index: int | None = -100) -> Accuracy:
        metric = self._metrics.get(name)
        if type(metric) is Accuracy and metric.ignore_index == ignore_index:
            return metric
        metric = self._get(name, Accuracy)
        metric.ignore_index = ignore_index  # type: ignore[attr-defined]
        return metric  # type: ignore[return-value]

    def _get(self, name: str, kind: type[Metric]) -> Metric:
        metric = self._metrics.get(name)
        if metric is None:
            metric = self._metrics[name] = kind(self.device)
        elif not isinstance(metric, kind):
            raise TrainwiseError(f"metric {name!r} is a {type(metric).__name__}, not a {kind.__name__}.")
        return metric

    def __contains__(self, name: str) -> bool:
        return name in self._metrics

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def reset(self) -> None:
        for metric in self._metrics.values():
            metric.reset()

    def all_reduce(self) -> None:
        """Sum every numerator and denominator over all processes (no-op without a process group)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or not self._metrics:
            return
        stacked = torch.stack([m.fold() for m in self._metrics.values()])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        for metric, row in zip(self._metrics.values(), stacked):
            metric.state.copy_(row)

    def compute(self) -> dict[str, float]:
        """Every metric's value, with one device-to-host copy for all of them."""
        if not self._metrics:
            return {}
        rows = torch.stack([m.fold() for m in self._metrics.values()]).tolist()
        return {
            name: (total / count if count else math.nan)
            for name, (total, count) in zip(self._metrics, rows)
        }

    def counts(self) -> dict[str, float]:
        """The denominators (samples or tokens counted), read back with one sync."""
        if not self._metrics:
            return {}
        rows = torch.stack([m.fold() for m in self._metrics.values()]).tolist()
        return {name: count for name, (_, count) in zip(self._metrics, rows)}

    def snapshot(self) -> dict[str, tuple[Metric, tuple[torch.Tensor, float]]]:
        """The metrics with a device copy of their sums, for :meth:`restore` (no host sync)."""
        return {name: (m, m.snapshot()) for name, m in self._metrics.items()}

    def restore(self, snapshot: dict[str, tuple[Metric, tuple[torch.Tensor, float]]]) -> None:
        """Undo every update since :meth:`snapshot` (a window redone after running out of memory)."""
        self._metrics = {name: metric for name, (metric, _) in snapshot.items()}
        for metric, saved in snapshot.values():
            metric.restore(saved)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Every metric's kind and numerator/denominator, for checkpoints (loads with ``weights_only``)."""
        return {
            name: {"kind": _KINDS[type(m)], "ignore_index": getattr(m, "ignore_index", None), **m.state_dict()}
            for name, m in self._metrics.items()
        }

    def load_state_dict(self, state_dict: dict[str, dict[str, Any]]) -> None:
        """Recreate the metrics of :meth:`state_dict` (replacing any present) with their sums and counts."""
        self._metrics = {}
        for name, saved in state_dict.items():
            if saved["kind"] == "accuracy":
                metric: Metric = self.accuracy(name, ignore_index=saved.get("ignore_index"))
            else:
                metric = self.mean(name)
            metric.load_state_dict(saved)
