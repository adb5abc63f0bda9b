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
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from trainwise.accumulation import accumulation_steps
from trainwise.config import max_workers
from trainwise.data.batches import count_items
from trainwise.data.batches import split_batch as default_split_batch
from trainwise.data.resumable import ResumableLoader
from trainwise.data.samplers import Padding, shard_loader
from trainwise.data.seeding import prepare_loader, rebuild_loader, seeded_loader
from trainwise.device import pin_memory_default
from trainwise.distributed import is_distributed
from trainwise.errors import TrainwiseError


def training_loader(
    data: Any,
    *,
    batch_size: int = 32,
    seed: int = 0,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    epochs: int = 1,
    shard: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
    padding: Padding = "zero_rows",
) -> ResumableLoader:
    """The training loader for ``data``: samples (a Dataset, a Hugging Face ``datasets.Dataset``, a list of
    samples) get a seeded DataLoader of ``batch_size`` collated by ``collate_fn``; a DataLoader is rebuilt with
    a seeded order (its batch size, workers, collate and batch sampler kept); an IterableDataset is batched in
    its own order; an iterable of ready-made batches is used as it is (see :func:`data_kind`). With several
    processes (``shard``; default: when a process group is initialised) each process gets its part, every
    sample on one process. Empty data, too many workers, a replaying IterableDataset and a one-shot iterator
    for several epochs are refused in one sentence. ``drop_last`` drops a short last batch, as a DataLoader's
    does (on several processes: the last batches that do not fill a step of every process, so none pads);
    ``padding`` is what a process whose shard ran out trains on (``trainwise.data.PaddingCollate``)."""
    loader = _local_loader(data, train=True, batch_size=batch_size, seed=seed, num_workers=num_workers,
                           device=device, epochs=epochs, collate_fn=collate_fn)
    if drop_last:
        loader = _dropping_last(loader)
    loader = _sharded(loader, train=True, seed=seed, shard=shard, padding=padding)
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
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Iterable[Any]:
    """The evaluation loader for ``data``: in order, each process its part (no padding), checked like
    :func:`training_loader`."""
    loader = _local_loader(data, train=False, batch_size=batch_size, seed=seed, num_workers=num_workers,
                           device=device, epochs=1, collate_fn=collate_fn)
    loader = _sharded(loader, train=False, seed=seed, shard=shard)
    check_loader(loader, "validation")
    return loader


def _sharded(loader: Any, *, train: bool, seed: int, shard: bool | None, padding: Padding = "zero_rows") -> Any:
    shard = is_distributed() if shard is None else shard
    if shard and isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        # this process's shard, every sample on one process; training pads a short shard (see shard_loader)
        return shard_loader(loader, train=train, seed=seed, padding=padding)
    return loader


def _dropping_last(loader: Any) -> DataLoader:
    """``loader`` with ``drop_last=True`` (``Trainer(drop_last=True)``), for the batches a DataLoader makes."""
    if isinstance(loader, DataLoader) and loader.batch_size is not None:
        if loader.drop_last:
            return loader
        sampler = None if isinstance(loader.dataset, IterableDataset) else loader.sampler
        return rebuild_loader(loader, sampler=sampler, worker_init_fn=loader.worker_init_fn,
                              generator=loader.generator, drop_last=True)
    what = "ready-made batches"
    if isinstance(loader, DataLoader):
        what = "a DataLoader with its own batch_sampler, which decides the batches" if loader.batch_sampler \
            is not None else "a DataLoader without automatic batching (batch_size=None)"
    raise TrainwiseError(
        f"drop_last=True drops a short last batch of the batches made with batch_size, and the data is {what}; "
        "drop the short batch there, or pass the samples (a Dataset or a list of samples)."
    )


def _local_loader(
    data: Any, *, train: bool, batch_size: int, seed: int, num_workers: int, device: Any, epochs: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Iterable[Any]:
    pin = pin_memory_default(torch.device(device))
    kind = data_kind(data)
    if collate_fn is not None and kind in ("loader", "batches"):
        what = "a DataLoader, which has its own collate_fn" if kind == "loader" else "ready-made batches"
        raise TrainwiseError(f"collate_fn= batches samples, and the data is {what}; pass the samples (a Dataset "
                             "or a list of samples) instead, or leave collate_fn out.")
    if kind == "loader":
        if isinstance(data.dataset, IterableDataset):  # no sampler to seed: the stream's order is its own
            return data
        return prepare_loader(data, seed=seed) if train else data
    if kind == "samples":
        if length(data) == 0:
            what, fix = ("training", "check the data") if train else (
                "validation", "pass val_data=None to train without validation")
            raise TrainwiseError(f"the {what} data set is empty (0 samples); {fix}.")
        _check_hf_format(data, collate_fn, "training" if train else "validation")
        return seeded_loader(data, batch_size=batch_size, seed=seed, shuffle=train, num_workers=num_workers,
                             pin_memory=pin, collate_fn=collate_fn or StackSamples())
    if kind == "stream":
        if num_workers:
            raise TrainwiseError(
                f"num_workers={num_workers} would give every loader worker the whole IterableDataset "
                f"({type(data).__name__}), so each sample would count {num_workers} times; shard it in "
                "__iter__ by torch.utils.data.get_worker_info() and pass your own DataLoader, or use num_workers=0."
            )
        return DataLoader(data, batch_size=batch_size, pin_memory=pin, collate_fn=collate_fn or StackSamples())
    if kind == "batches":
        if iter(data) is data and train and epochs > 1:  # a generator, a file handle, iter(list)
            raise TrainwiseError(
                f"the training data is an iterator ({type(data).__name__}), which is used up after one epoch; "
                "pass a list of batches, a Dataset or a DataLoader for several epochs."
            )
        return data
    if kind == "splits":
        raise TrainwiseError(
            f"the data is a DatasetDict of the splits {sorted(map(str, data))}; pass one split, such as "
            f"data[{next(iter(data))!r}]."
        )
    raise TrainwiseError(
        f"training data must be a Dataset, a DataLoader, a list of samples or an iterable of batches, got "
        f"{type(data).__name__}."
    )


def data_kind(data: Any) -> str:
    """What ``data`` is, decided by its type and, for a plain sequence, by its first item:

    - ``"loader"``: a DataLoader (used as it is, reseeded for training);
    - ``"samples"``: a map-style torch ``Dataset``, a Hugging Face ``datasets.Dataset``, or a list/tuple (or any
      sized ``__getitem__`` object) whose first item is one sample: its target is a number or a 0-dim tensor,
      it holds Python lists, strings or numbers, or its tensors have at most one dimension (a token sequence);
    - ``"batches"``: a sequence whose first item is a ready-made batch (every tensor shares its first
      dimension, and one has two or more), or any other iterable (a generator of batches);
    - ``"stream"``: an ``IterableDataset`` (torch's or Hugging Face's), batched in its own order;
    - ``"splits"``: a ``datasets.DatasetDict``; ``"unknown"``: anything else.
    """
    if isinstance(data, DataLoader):
        return "loader"
    if isinstance(data, IterableDataset):
        return "stream"
    module = type(data).__module__.split(".")[0]
    if module == "datasets":
        name = type(data).__name__
        if name in ("DatasetDict", "IterableDatasetDict"):
            return "splits"
        if name == "IterableDataset":
            return "stream"
        if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
            return "samples"
    if isinstance(data, Dataset):
        return "samples"
    if isinstance(data, (str, bytes, Mapping)):
        return "unknown"
    size = length(data) if hasattr(data, "__getitem__") else None
    if size is not None:
        if size == 0:
            return "batches"  # empty: refused by check_loader with the usual sentence
        try:
            first = data[0]
        except Exception:  # a sized object that is not indexed by position: iterate it as batches
            return "batches" if isinstance(data, Iterable) else "unknown"
        return "samples" if _is_sample(first) else "batches"
    if isinstance(data, Iterable):
        return "batches"
    return "unknown"


def _is_sample(item: Any) -> bool:
    """Whether one item of a sequence is a sample (batched by batch_size) rather than a ready-made batch."""
    try:
        _, target = default_split_batch(item)
    except TrainwiseError:
        target = None
    if isinstance(target, (int, float, bool, np.number)) or (_is_array(target) and target.ndim == 0):
        return True
    leaves = list(_leaves(item))
    if any(not _is_array(leaf) for leaf in leaves):
        return True  # Python numbers, strings or lists: rows of a table, not a collated batch
    if not leaves or any(leaf.ndim == 0 for leaf in leaves):
        return True
    return not (len({leaf.shape[0] for leaf in leaves}) == 1 and any(leaf.ndim >= 2 for leaf in leaves))


def _is_array(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _leaves(item: Any) -> Iterator[Any]:
    if isinstance(item, Mapping):
        for value in item.values():
            yield from _leaves(value)
    elif isinstance(item, (tuple, list)) and item and not isinstance(item[0], (int, float, bool, str)):
        for value in item:
            yield from _leaves(value)
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        for field in dataclasses.fields(item):
            yield from _leaves(getattr(item, field.name))
    else:
        yield item


def _check_hf_format(data: Any, collate_fn: Any, what: str = "training") -> None:
    """A Hugging Face Dataset without a tensor format yields Python lists, which the default collate
    transposes (one tensor per position, not per sample); ``what`` names the data (training or validation)."""
    if collate_fn is not None or type(data).__module__.split(".")[0] != "datasets":
        return
    if (getattr(data, "format", None) or {}).get("type") not in ("torch", "numpy", "np"):
        raise TrainwiseError(
            f"the {what} data (a datasets.Dataset) has no tensor format, so its rows are Python lists; call "
            ".with_format('torch') on it for rows of equal length, or pass collate_fn= (for text, "
            "transformers.DataCollatorWithPadding(tokenizer) pads each batch)."
        )


class StackSamples:
    """torch's default collate, with one sentence in place of the error from samples it cannot stack, and a
    refusal of Python lists (which it would transpose into one tensor per position)."""

    draws_no_random = True  # seeded loaders need not seed its collation (trainwise.data.seeding)

    def __init__(self) -> None:
        self.checked = False  # the first batch's first sample is looked at; the rest collate as torch does

    def __call__(self, samples: list[Any]) -> Any:
        if not self.checked and samples:
            _refuse_python_lists(samples[0])
            self.checked = True
        try:
            return default_collate(samples)
        except (RuntimeError, TypeError) as error:
            raise TrainwiseError(
                f"the samples could not be collated into a batch ({str(error).splitlines()[0]}); give samples "
                "tensors or numbers of one shape, or pass collate_fn= that batches them (for text of different "
                "lengths, transformers.DataCollatorWithPadding(tokenizer) pads)."
            ) from error


def _refuse_python_lists(sample: Any) -> None:
    values = sample.values() if isinstance(sample, Mapping) else sample if isinstance(sample, tuple) else ()
    for value in values:
        if isinstance(value, list) and value and isinstance(value[0], (int, float, bool)):
            raise TrainwiseError(
                "a sample holds a Python list of numbers, which the default collate would transpose; make it a "
                "tensor (or call dataset.with_format('torch')), or pass collate_fn= that pads the lists (for "
                "text, transformers.DataCollatorWithPadding(tokenizer))."
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
