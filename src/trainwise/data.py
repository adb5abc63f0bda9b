"""The data pipeline: one call turns a Dataset, a DataLoader or an iterable of batches into what a training
loop iterates, in a seeded order, this process's shard only, resumable in the middle of an epoch, and with a
look-ahead that marks the last batch (no ``len()`` needed).

    >>> train = training_loader(train_set, batch_size=32, seed=0)       # a ResumableLoader
    >>> for epoch in range(1, epochs + 1):
    ...     set_sampler_epoch(train, epoch)
    ...     for batch, last in train.with_last(): ...
    >>> val = evaluation_loader(val_set, batch_size=256)

The Trainer calls exactly these; a hand-written loop gets the same order, shards and resume position.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainwise.accumulation import accumulation_steps
from trainwise.batches import count_items
from trainwise.batches import split_batch as default_split_batch
from trainwise.checkpoint.loader import ResumableLoader
from trainwise.config import max_workers
from trainwise.device import pin_memory_default
from trainwise.distributed import is_distributed, shard_loader
from trainwise.errors import TrainwiseError
from trainwise.seeding import prepare_loader, seeded_loader


def training_loader(
    data: Any,
    *,
    batch_size: int = 32,
    seed: int = 0,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    epochs: int = 1,
    shard: bool | None = None,
) -> ResumableLoader:
    """The training loader for ``data``: a Dataset gets a seeded DataLoader, a DataLoader is rebuilt with a
    seeded order (its batch size, workers, collate and batch sampler kept), an IterableDataset is batched in
    its own order, an iterable of ready-made batches is used as it is. With several processes (``shard``;
    default: when a process group is initialised) each process gets its part, every sample on one process.
    Empty data, too many workers, a replaying IterableDataset and a one-shot iterator for several epochs are
    refused in one sentence."""
    loader = _local_loader(data, train=True, batch_size=batch_size, seed=seed, num_workers=num_workers,
                           device=device, epochs=epochs)
    loader = _sharded(loader, train=True, seed=seed, shard=shard)
    check_loader(loader, "training")
    return ResumableLoader(loader)


def evaluation_loader(
    data: Any,
    *,
    batch_size: int = 32,
    seed: int = 0,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    shard: bool | None = None,
) -> Iterable[Any]:
    """The evaluation loader for ``data``: in order, each process its part (no padding), checked like
    :func:`training_loader`."""
    loader = _local_loader(data, train=False, batch_size=batch_size, seed=seed, num_workers=num_workers,
                           device=device, epochs=1)
    loader = _sharded(loader, train=False, seed=seed, shard=shard)
    check_loader(loader, "validation")
    return loader


def _sharded(loader: Any, *, train: bool, seed: int, shard: bool | None) -> Any:
    shard = is_distributed() if shard is None else shard
    if shard and isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        # this process's shard, every sample on one process; training pads with zero-row batches (see shard_loader)
        return shard_loader(loader, train=train, seed=seed)
    return loader


def _local_loader(
    data: Any, *, train: bool, batch_size: int, seed: int, num_workers: int, device: Any, epochs: int
) -> Iterable[Any]:
    pin = pin_memory_default(torch.device(device))
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):  # no sampler to seed: the stream's order is its own
            return data
        return prepare_loader(data, seed=seed) if train else data
    if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
        if length(data) == 0:
            what, fix = ("training", "check the data") if train else (
                "validation", "pass val_data=None to train without validation")
            raise TrainwiseError(f"the {what} data set is empty (0 samples); {fix}.")
        return seeded_loader(data, batch_size=batch_size, seed=seed, shuffle=train, num_workers=num_workers,
                             pin_memory=pin)
    if isinstance(data, IterableDataset):
        if num_workers:
            raise TrainwiseError(
                f"num_workers={num_workers} would give every loader worker the whole IterableDataset "
                f"({type(data).__name__}), so each sample would count {num_workers} times; shard it in "
                "__iter__ by torch.utils.data.get_worker_info() and pass your own DataLoader, or use num_workers=0."
            )
        return DataLoader(data, batch_size=batch_size, pin_memory=pin)
    if isinstance(data, Iterable):
        if iter(data) is data and train and epochs > 1:  # a generator, a file handle, iter(list)
            raise TrainwiseError(
                f"the training data is an iterator ({type(data).__name__}), which is used up after one epoch; "
                "pass a list of batches, a Dataset or a DataLoader for several epochs."
            )
        return data
    raise TrainwiseError(
        f"training data must be a Dataset, a DataLoader or an iterable of batches, got {type(data).__name__}."
    )


def check_loader(loader: Any, what: str = "training") -> None:
    """Refuse empty data, and more loader workers than the machine can run, before anything is written."""
    workers = getattr(loader, "num_workers", 0)
    if isinstance(workers, int) and workers > max_workers():
        raise TrainwiseError(
            f"the {what} DataLoader has num_workers={workers}, more than {max_workers()} (4 per CPU core here, "
            "at least 8): each worker is a process holding a copy of the dataset, so use fewer."
        )
    batches = length(loader)
    if batches is None or batches > 0:  # an iterable without a length: checked when an epoch yields nothing
        return
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        raise TrainwiseError(f"the {what} data yields no batches; check the data.")
    if length(dataset) == 0:
        fix = "pass val_data=None to train without validation" if what == "validation" else "check the data"
        raise TrainwiseError(f"the {what} data set is empty (0 samples); {fix}.")
    raise TrainwiseError(
        f"the {what} data yields no batches ({length(dataset)} samples with drop_last=True and a larger batch "
        "size); use a smaller batch_size or drop_last=False."
    )


def window_steps(
    loader: Any,
    *,
    effective_batch: int | None = None,
    steps: int | None = None,
    split: Callable[[Any], tuple[Any, Any]] = default_split_batch,
) -> int:
    """Micro-batches per optimizer step: ``steps``, or ``effective_batch`` over the loader's real micro-batch
    (a DataLoader's batch size, else the sample count of the first ready-made batch)."""
    if steps is not None:
        return steps
    if effective_batch is None:
        return 1
    inner = loader.loader if isinstance(loader, ResumableLoader) else loader
    micro = None
    if isinstance(inner, DataLoader):  # under DDP a ShardedBatchSampler knows its batch size
        micro = inner.batch_size or getattr(inner.batch_sampler, "batch_size", None)
    if micro is None:
        micro = _first_batch_size(inner, split)
    return accumulation_steps(effective_batch, micro)


def _first_batch_size(loader: Any, split: Callable[[Any], tuple[Any, Any]]) -> int:
    if iter(loader) is loader:
        raise TrainwiseError(
            "effective_batch needs the batch size, which an iterator of batches cannot show without using up a "
            "batch; pass accumulation_steps=N instead."
        )
    for batch in loader:
        return int(count_items(split(batch)[1]))
    raise TrainwiseError("the training data yields no batches; check the data.")


def length(data: Any) -> int | None:
    """``len(data)``, or None for data without a length (a DataLoader over an unsized IterableDataset raises)."""
    try:
        return len(data)
    except TypeError:
        return None


class StreamCheck:
    """Counts an epoch's samples from a worker-loaded, sized IterableDataset and refuses more than its
    length: every worker replaying the whole stream would otherwise train and count each sample N times."""

    def __init__(self, loader: Any) -> None:
        inner = getattr(loader, "loader", loader)
        dataset = getattr(inner, "dataset", None)
        sized_stream = isinstance(inner, DataLoader) and isinstance(dataset, IterableDataset) and inner.num_workers
        self.limit = length(dataset) if sized_stream else None
        self.workers = getattr(inner, "num_workers", 0)
        self.seen = 0

    def start_epoch(self) -> None:
        self.seen = 0

    def add(self, targets: Any) -> None:
        if self.limit is None:
            return
        self.seen += count_items(targets)
        if self.seen > self.limit:
            raise TrainwiseError(
                f"the training stream yielded more samples than its length ({self.limit}): with num_workers="
                f"{self.workers} every worker replays the whole IterableDataset; shard it in __iter__ by "
                "torch.utils.data.get_worker_info()."
            )


@contextlib.contextmanager
def threads_beside_workers(device: torch.device, loader: Any, *, threads: int | None = None) -> Iterator[None]:
    """On CPU, leave one core per DataLoader worker for the duration (or use exactly ``threads``, the count
    a checkpoint recorded, so that a resumed run computes as the interrupted one did).

    OpenMP threads spin while they wait: with as many compute threads as cores, workers starve and a
    2-core machine trains about 15 times slower with 2 workers than with none (measured on the demo).
    """
    workers = getattr(loader, "num_workers", 0)
    before = torch.get_num_threads()
    wanted = before
    if threads is not None:
        wanted = threads
    elif device.type == "cpu" and workers:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS, Windows
            cores = os.cpu_count() or 1
        wanted = max(1, min(before, cores - workers))
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)
