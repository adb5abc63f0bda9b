"""Out of memory: train each window (one batch of the effective size) in micro-batches of the largest size
that fits, halving it on an out-of-memory error and redoing the window from its start, so that no sample is
skipped or counted twice and the effective batch never changes (fundamental 7).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from trainwise.errors import TrainwiseError

_OOM_TYPES = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                               getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)) if t is not None)
_MPS_MESSAGE = "MPS backend out of memory"


def is_out_of_memory(error: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (CUDA) or MPS's out-of-memory ``RuntimeError``; nothing else."""
    if _OOM_TYPES and isinstance(error, _OOM_TYPES):
        return True
    return type(error) is RuntimeError and str(error).startswith(_MPS_MESSAGE)


def rows(batch: Any) -> int:
    """The number of samples in ``batch``: the first dimension of its tensors (tuples, lists, dicts, dataclasses)."""
    sizes = set(_row_counts(batch))
    if not sizes:
        raise TrainwiseError(f"a {type(batch).__name__} batch has no tensor to split into micro-batches; "
                             "yield tensors (in a tuple, list, dict or dataclass).")
    if len(sizes) > 1:
        listed = ", ".join(map(str, sorted(sizes)))
        raise TrainwiseError(f"the batch's tensors have different first dimensions ({listed}), so it cannot be "
                             "split into micro-batches of samples; put samples on the first dimension of every "
                             "tensor.")
    return sizes.pop()


def _row_counts(batch: Any) -> list[int]:
    if isinstance(batch, torch.Tensor):
        return [batch.shape[0]] if batch.dim() else []
    if isinstance(batch, Mapping):
        return [n for value in batch.values() for n in _row_counts(value)]
    if isinstance(batch, (list, tuple)):
        return [n for value in batch for n in _row_counts(value)]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [n for f in dataclasses.fields(batch) for n in _row_counts(getattr(batch, f.name))]
    return []


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Samples ``start:stop`` of every tensor in ``batch``, in the same structure (a view, no copy)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, Mapping):
        values = {k: slice_batch(v, start, stop) for k, v in batch.items()}
        return values if type(batch) is dict else _rebuild_mapping(batch, values)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(slice_batch(v, start, stop) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(slice_batch(v, start, stop) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: slice_batch(getattr(batch, f.name), start, stop)
                                             for f in dataclasses.fields(batch) if f.init})
    return batch


def _rebuild_mapping(batch: Mapping[str, Any], values: dict[str, Any]) -> Any:
    try:
        return type(batch)(values)  # transformers' BatchEncoding, OrderedDict...
    except Exception:
        return values


def check_auto_loader(loader: Any, effective_batch: int) -> None:
    """With ``batch_size="auto"`` each batch the loader yields is one window: a DataLoader built for another
    batch size would silently change the effective batch, so it is refused in one sentence."""
    from torch.utils.data import DataLoader

    inner = getattr(loader, "loader", loader)
    if isinstance(inner, DataLoader):
        size = inner.batch_size or getattr(inner.batch_sampler, "batch_size", None)
        if size is not None and size != effective_batch:
            raise TrainwiseError(
                f"with batch_size='auto' each batch is one optimizer step, but the DataLoader yields batches of "
                f"{size}, not effective_batch={effective_batch}; build it with batch_size={effective_batch}, or "
                "pass the Dataset."
            )


class AdaptiveMicroBatches:
    """Split each window's batch into micro-batches of ``size``; on an out-of-memory error, discard the
    window's gradients, free the memory, halve ``size`` and redo the window from its first sample.

    >>> micro = AdaptiveMicroBatches(256)                     # start at the effective batch
    >>> accumulator = GradientAccumulator(optimizer)
    >>> for batch in loader:                                 # batches of the effective size: one window each
    ...     def train(part, last):
    ...         x, y = part
    ...         accumulator.backward(F.cross_entropy(model(x), y), count=len(y))
    ...     micro.run(batch, train, discard=accumulator.discard_window)
    ...     accumulator.step()

    ``train(part, last)`` runs forward and backward of one micro-batch (``last``: the window's last, where
    DDP syncs gradients); ``discard()`` undoes what the failed window did (the accumulator's
    ``discard_window``, and any metric you updated). With ``distributed=True`` (DDP) every micro-batch runs
    without the gradient sync; then the processes agree (one all-reduce) on whether any ran out of memory, so
    all redo the window at the same smaller size, or all average their gradients (as DDP would have).
    """

    def __init__(self, size: int, *, distributed: bool = False, model: torch.nn.Module | None = None,
                 on_shrink: Callable[[int, int], None] | None = None) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise TrainwiseError(f"the micro-batch size must be a positive integer, got {size!r}.")
        self.size = size
        self.distributed = distributed
        self.model = model  # under DDP: the wrapped model, whose no_sync() every micro-batch runs in
        self.on_shrink = on_shrink  # called with (old size, new size) once per halving
        self.halvings: list[tuple[int, int]] = []  # every (old size, new size), for the caller to report
        self.step = 0  # the caller's optimizer step count, for the message at micro-batch 1

    def parts(self, total: int) -> int:
        """Micro-batches a window of ``total`` samples takes at the current size."""
        return -(-total // self.size)

    def run(self, batch: Any, train: Callable[[Any, bool], None], *, discard: Callable[[], None]) -> int:
        """Train ``batch`` in micro-batches until one whole pass fits; returns the micro-batch size used."""
        total = rows(batch)
        while True:
            failed = self._attempt(batch, total, train)
            if self.distributed:
                from trainwise.distributed import any_rank

                failed = any_rank(failed, device=self._device())
                if not failed:
                    _average_gradients(self.model)
            if not failed:
                return self.size
            discard()
            _free_memory()
            if self.size == 1:
                raise TrainwiseError(
                    f"out of memory at micro-batch 1 in step {self.step + 1}: even one sample does not fit; use a "
                    "smaller model, precision='bf16', activation checkpointing (torch.utils.checkpoint) or fewer "
                    "sequence tokens per sample."
                )
            old, self.size = self.size, max(1, self.size // 2)
            self.halvings.append((old, self.size))
            if self.on_shrink is not None:
                self.on_shrink(old, self.size)

    def _attempt(self, batch: Any, total: int, train: Callable[[Any, bool], None]) -> bool:
        """One pass over the window; True when it ran out of memory (the error's frames are released first)."""
        try:
            for start in range(0, max(total, 1), self.size):  # a zero-row padding batch still runs (DDP)
                stop = min(start + self.size, total)
                part = batch if start == 0 and stop == total else slice_batch(batch, start, stop)
                if self.distributed and self.model is not None and hasattr(self.model, "no_sync"):
                    with self.model.no_sync():
                        train(part, stop == total)
                else:
                    train(part, stop == total)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return True  # leaving the except block drops the traceback and the activations it holds
        return False

    def _device(self) -> torch.device:
        if self.model is not None:
            for parameter in self.model.parameters():
                return parameter.device
        return torch.device("cpu")

    def state_dict(self) -> dict[str, int]:
        return {"size": self.size}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        size = int(state.get("size", self.size))
        self.size = size if size >= 1 else self.size


def _free_memory() -> None:
    """Give the failed window's device memory back before the window is redone: the tensors only a reference
    cycle of the window still holds are collected, then the allocator's cache is emptied. Only where CUDA or MPS
    memory is in use, the memory that runs out: a full collection takes 0.4 s with a big heap."""
    cuda = torch.cuda.is_initialized()
    mps = getattr(torch, "mps", None) if torch.backends.mps.is_available() else None
    if not cuda and mps is None:
        return
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    if mps is not None:
        mps.empty_cache()


def _average_gradients(model: torch.nn.Module | None, bucket: int = 1 << 24) -> None:
    """What DDP's reducer does after the last micro-batch: every gradient averaged over the processes (flattened
    into buckets of at most ``bucket`` elements per dtype and device)."""
    import torch.distributed as dist

    if model is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # unused on this process: zeros, so every process reduces the same tensors
            p.grad = torch.zeros_like(p)
    world = dist.get_world_size()
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
    for grads in groups.values():
        for chunk in _buckets(grads, bucket):
            flat = torch.cat([g.reshape(-1) for g in chunk])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for g in chunk:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()


def _buckets(grads: Sequence[torch.Tensor], size: int) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    filled = 0
    for g in grads:
        if out[-1] and filled + g.numel() > size:
            out.append([])
            filled = 0
        out[-1].append(g)
        filled += g.numel()
    return [b for b in out if b]


__all__ = ["AdaptiveMicroBatches", "check_auto_loader", "is_out_of_memory", "rows", "slice_batch"]
