"""Samplers that shard the data over processes, and the padding batches that keep every process at the same
number of micro-batches (the process group itself: :mod:`trainwise.distributed`).

Training deals one process's batches to the ranks in turn (:class:`ShardedBatchSampler`, every sample on
exactly one rank); a rank left one batch short ends its epoch with a padding batch that trains with weight 0
(:class:`PaddingCollate`). Evaluation shards without padding (:class:`ShardSampler`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from trainwise.data.seeding import SeededBatchSampler, rebuild_loader
from trainwise.distributed import get_rank, get_world_size, is_distributed, is_sharded
from trainwise.errors import TrainwiseError
from trainwise.freezing import has_running_stats

Padding = Literal["zero_rows", "samples"]  # what a rank whose shard ran out trains on (see PaddingCollate)
PADDING_SAMPLES = 2  # real samples in a padding batch: BatchNorm without running statistics needs two in train mode


class ShardSampler(Sampler[int]):
    """Rank ``r`` of ``W`` gets indices ``r, r+W, r+2W, ...`` in order: every sample exactly once, no padding.

    For evaluation: shards may differ in length by one, which is fine because no collective runs per batch
    (only the final sum of the metrics). ``DistributedSampler`` pads by repeating samples, which would count
    them twice in a validation metric.
    """

    def __init__(self, dataset: Any, *, rank: int | None = None, world_size: int | None = None) -> None:
        self.size = len(dataset)
        self.rank = get_rank() if rank is None else rank
        self.world_size = get_world_size() if world_size is None else world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world_size))


def train_sampler(dataset: Dataset, *, shuffle: bool, seed: int, drop_last: bool = False) -> DistributedSampler:
    """``DistributedSampler`` seeded identically on every rank (call ``set_sampler_epoch`` every epoch).

    It repeats samples when the world size does not divide the data set, so processes do not train on the
    data one process would; :func:`shard_loader` (:class:`ShardedBatchSampler`) is exact.
    """
    return DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)


class ShardedBatchSampler(SeededBatchSampler):
    """This rank's batches of a batch sampler that every rank draws identically: batches ``r, r+W, r+2W...``.

    Every batch of the epoch, and so every sample, goes to exactly one rank: nothing is repeated or dropped.
    ``pad=True`` (training): a rank left with fewer batches than rank 0 (at most one fewer) ends its epoch
    with empty index lists, which :class:`PaddingCollate` turns into padding batches (zero rows, or real
    samples marked as :class:`PaddingBatch`), so that every rank runs as many micro-batches (the same
    accumulation windows, DDP/FSDP collectives and optimizer steps); ``len()`` counts them. A padding batch
    counts zero items: backpropagate it with ``GradientAccumulator.backward_empty(outputs)``. ``drop_last=True``
    drops the last batches that do not fill a step of every rank (as one process with a W times larger batch
    would drop its short last batch): then no rank pads.
    The batches are drawn as :class:`SeededBatchSampler` draws them (seeded from ``(seed, epoch)``).
    """

    def __init__(
        self,
        batch_sampler: Any,
        *,
        seed: int,
        pad: bool = True,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(batch_sampler, seed=seed)
        self.rank = get_rank() if rank is None else rank
        self.world_size = get_world_size() if world_size is None else world_size
        self.pad = pad
        self.drop_last = drop_last
        try:
            total = self._total()
        except TypeError:
            raise TrainwiseError(
                f"the batch_sampler {type(batch_sampler).__name__} has no len(); give it a __len__ that returns "
                "the number of batches it yields, so that the processes can share them."
            ) from None
        if pad and 0 < total < self.world_size:
            raise TrainwiseError(
                f"the training data makes {total} batch(es) for {self.world_size} processes, so some process "
                "would get none; use a smaller batch size or fewer processes."
            )

    def _total(self) -> int:
        """Batches of the epoch over all ranks (after drop_last)."""
        total = len(self.batch_sampler)
        return total - total % self.world_size if self.drop_last else total

    @property
    def real_batches(self) -> int:
        """Batches of data this rank gets this epoch (without padding)."""
        return len(range(self.rank, self._total(), self.world_size))

    @property
    def padding(self) -> int:
        """Empty batches this rank yields at the end of the epoch (known without a collective)."""
        return len(self) - self.real_batches

    def __len__(self) -> int:
        return -(-self._total() // self.world_size) if self.pad else self.real_batches

    def __iter__(self) -> Iterator[list[Any]]:
        mine = self.epoch_batches()[: self._total()][self.rank :: self.world_size]
        return iter(mine + [[] for _ in range(len(self) - len(mine))])

    def check(self) -> list[list[Any]]:
        """:meth:`SeededBatchSampler.check`, and under a process group, that every rank drew the same
        batches (one all-reduce of a digest: call it on every rank at the same point)."""
        batches = super().check()
        if is_distributed():
            digest = hashlib.blake2b(digest_size=8)
            for batch in batches:
                digest.update(repr(batch).encode())
            value = int.from_bytes(digest.digest(), "little", signed=True) >> 1  # so that -value fits int64 too
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            both = torch.tensor([value, -value], dtype=torch.int64, device=device)
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
            if int(both[0]) != -int(both[1]):
                raise TrainwiseError(
                    f"the batch_sampler {type(self.batch_sampler).__name__} drew different batches on different "
                    "processes; seed its generator the same on every process (not from the rank or the clock), "
                    "or give it num_replicas and rank attributes if it already shards the data itself."
                )
        return batches


@dataclasses.dataclass
class PaddingBatch:
    """A padding batch of real samples, which trains with weight 0: made by ``shard_loader(padding="samples")``
    (the Trainer's) for a rank whose shard ran out, for models that cannot take a batch of zero rows (every
    Hugging Face attention layer reshapes to ``(batch, ..., -1, head_dim)``, which zero elements cannot fill).

    ``batch`` is :data:`PADDING_SAMPLES` samples of the data set collated as every batch is.
    :func:`trainwise.forward_micro_batch` runs the model on it with norm layers' running statistics left
    alone (:func:`padding_forward`) and returns no loss, a count of 0 and outputs and targets cut to zero
    rows, so that ``GradientAccumulator.backward_empty(outputs)`` backpropagates an exact zero through the
    whole graph (DDP's all-reduce and FSDP's reduce-scatter run and add nothing) and no metric counts it.
    """

    batch: Any


def is_padding(batch: Any) -> bool:
    """Whether ``batch`` is a padding batch of real samples (:class:`PaddingBatch`); a zero-row padding batch
    is known by its zero rows."""
    return isinstance(batch, PaddingBatch)


def padding_for(model: torch.nn.Module) -> Padding:
    """The padding the Trainer uses for ``model``: real samples weighted 0 (``"samples"``), which every model
    that trains on a batch of two can take, or zero rows for a model with ``SyncBatchNorm``, whose train-mode
    forward would put a real sample into the batch statistics of every process (it takes zero rows)."""
    if any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules()):
        return "zero_rows"
    return "samples"


@contextlib.contextmanager
def padding_forward(model: torch.nn.Module) -> Iterator[None]:
    """For the forward of a padding batch of real samples: the model's norm layers with running statistics
    (BatchNorm, InstanceNorm with ``track_running_stats``) in eval mode, so that the padding leaves their
    ``running_mean``, ``running_var`` and ``num_batches_tracked`` as they were; their modes are put back after.
    A ``SyncBatchNorm`` in train mode is refused: its forward is a collective that puts the padding samples
    into every process's batch statistics, and in eval mode it would skip a collective the others run."""
    switched = [m for m in model.modules() if m.training and has_running_stats(m)]
    if any(isinstance(m, torch.nn.SyncBatchNorm) for m in switched):
        raise TrainwiseError(
            "a padding batch of real samples cannot go through SyncBatchNorm, which would count it in every "
            "process's batch statistics; use shard_loader(..., padding='zero_rows') for this model."
        )
    for module in switched:
        module.training = False  # the attribute, not .eval(): nothing else about the module changes
    try:
        yield
    finally:
        for module in switched:
            module.training = True


def padding_outputs(outputs: Any, loss: torch.Tensor | None) -> Any:
    """What a padding batch of real samples shows ``backward_empty`` and the metrics: its outputs cut to zero
    rows (still attached to the graph), or for a model that returned only a loss, that loss cut to no element."""
    if outputs is None and isinstance(loss, torch.Tensor):
        return loss.reshape(1)[:0]
    return zero_rows(outputs)


class PaddingCollate:
    """A DataLoader ``collate_fn`` that turns an empty index list (a padding batch) into a batch that trains
    with weight 0.

    ``padding="zero_rows"``: a real batch (of the sample ``index``, collated by ``collate_fn``) cut to zero rows
    along dimension 0, so it has the structure, dtypes and trailing shapes of the others; the model must take
    zero rows. ``padding="samples"``: :data:`PADDING_SAMPLES` real samples (``index`` is a list of them),
    collated and marked as a :class:`PaddingBatch`. Picklable for worker processes, which read the samples from
    their own copy of the dataset.
    """

    def __init__(self, collate_fn: Any, dataset: Any, index: Any, *, padding: Padding = "zero_rows") -> None:
        self.collate_fn = collate_fn
        self.dataset = dataset
        self.indices = list(index) if isinstance(index, (list, tuple)) else [index]
        self.padding = _checked_padding(padding)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "dataset": None}  # a worker has the dataset already: do not send it twice

    def __call__(self, samples: Any) -> Any:
        if len(samples):
            return self.collate_fn(samples)
        dataset = self.dataset
        if dataset is None:
            from torch.utils.data import get_worker_info

            dataset = get_worker_info().dataset
        indices = self.indices if self.padding == "samples" else self.indices[:1]
        getitems = getattr(dataset, "__getitems__", None)
        batch = self.collate_fn(getitems(indices) if getitems else [dataset[i] for i in indices])
        return PaddingBatch(batch) if self.padding == "samples" else zero_rows(batch)


def _checked_padding(padding: Any) -> Padding:
    if padding not in ("zero_rows", "samples"):
        raise TrainwiseError(f"padding must be 'zero_rows' or 'samples', got {padding!r}.")
    return padding


def zero_rows(batch: Any) -> Any:
    """``batch`` with every tensor (and array, and list of plain values) cut to zero rows along dimension 0."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch[:0] if batch.ndim else batch
    if isinstance(batch, Mapping):
        cut = {key: zero_rows(value) for key, value in batch.items()}
        try:
            return type(batch)(cut)
        except TypeError:
            return cut
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: zero_rows(getattr(batch, f.name))
                                             for f in dataclasses.fields(batch) if f.init})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(zero_rows(item) for item in batch))
    if isinstance(batch, (list, tuple)):
        if isinstance(batch, list) and all(isinstance(item, (str, bytes, int, float, bool)) for item in batch):
            return []  # a batch of plain values (texts, ids): one per row
        return type(batch)(zero_rows(item) for item in batch)
    return batch


def padding_batches(loader: Any) -> int:
    """Padding batches at the end of this rank's epoch of ``loader`` (0 for any other loader)."""
    for holder in (loader, getattr(loader, "loader", None)):  # ResumableLoader wraps the DataLoader
        batch_sampler = getattr(holder, "batch_sampler", None)
        if isinstance(batch_sampler, ShardedBatchSampler):
            return batch_sampler.padding
    return 0


def validation_padding(model: torch.nn.Module, loader: Any, device: torch.device | str) -> int:
    """Extra forwards this process runs so that all match the longest validation shard (FSDP only: it
    gathers parameters in every forward, so every process must run as many). One all-reduce."""
    if not is_distributed() or not is_sharded(model) or not hasattr(loader, "__len__"):
        return 0
    count = torch.tensor([len(loader)], dtype=torch.int64, device=device)
    longest = count.clone()
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    return int(longest.item() - count.item())


def set_sampler_epoch(loader: Any, epoch: int) -> bool:
    """Tell a loader which epoch starts: its batch sampler or sampler (any with ``set_epoch``), and its dataset
    when that has ``set_epoch`` (a Hugging Face ``IterableDataset`` reshuffles from ``seed + epoch``, as the
    Hugging Face Trainer and Accelerate tell it). True when something was told."""
    told = False
    for holder in (loader, getattr(loader, "loader", None)):  # ResumableLoader wraps the DataLoader
        batch_sampler = getattr(holder, "batch_sampler", None)
        for sampler in (batch_sampler, getattr(holder, "sampler", None), getattr(batch_sampler, "sampler", None)):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
                told = True
                break
        if told:
            break
    for holder in (loader, getattr(loader, "loader", None)):
        dataset = getattr(holder, "dataset", None)
        if dataset is not None and callable(getattr(dataset, "set_epoch", None)):
            dataset.set_epoch(epoch)
            return True
    return told


def shard_loader(
    loader: DataLoader, *, train: bool, seed: int, drop_last: bool | None = None, padding: Padding = "zero_rows"
) -> DataLoader:
    """The same DataLoader drawing only this rank's shard: every sample on exactly one rank per epoch.

    Training: the batches one process would draw (the loader's sampler and batch size, or its own
    ``batch_sampler``: bucketing...), dealt to the ranks in turn by :class:`ShardedBatchSampler`, a rank with
    one batch fewer ending with a padding batch (:class:`PaddingCollate`): ``padding="zero_rows"`` (a batch of
    zero rows: the model must take it) or ``"samples"`` (a :class:`PaddingBatch` of real samples, for
    :func:`trainwise.forward_micro_batch`); ``drop_last`` (default: the loader's) drops the last batches that do
    not fill a step of every rank. Evaluation: :class:`ShardSampler`
    (or the batch sampler's batches dealt in turn), no padding. Call it on every rank at the same point (it
    checks, with one all-reduce, that the ranks drew the same batches). Returned unchanged: a loader whose
    sampler is already distributed (has ``set_epoch``), or whose batch sampler shards itself (it, or its
    ``sampler``, has ``num_replicas``), or a loader without automatic batching (``batch_size=None``).
    """
    _checked_padding(padding)
    sampler, batch_sampler = loader.sampler, loader.batch_sampler
    custom = batch_sampler is not None and loader.batch_size is None
    if (
        isinstance(batch_sampler, ShardedBatchSampler)
        or callable(getattr(sampler, "set_epoch", None))
        or (custom and _shards_itself(batch_sampler))
    ):
        return loader
    if batch_sampler is None:  # no automatic batching: every index is a batch of the dataset's own
        if not train:
            return rebuild_loader(loader, sampler=ShardSampler(loader.dataset), worker_init_fn=loader.worker_init_fn,
                                  generator=loader.generator)
        return loader
    if custom:
        if isinstance(batch_sampler, SeededBatchSampler):  # prepare_loader's: keep its seed
            batch_sampler, seed = batch_sampler.batch_sampler, batch_sampler.seed
        sharded = ShardedBatchSampler(batch_sampler, seed=seed, pad=train)
    elif train:
        drop = loader.drop_last if drop_last is None else drop_last
        sharded = ShardedBatchSampler(BatchSampler(sampler, loader.batch_size, drop), seed=seed, drop_last=drop)
    else:
        return rebuild_loader(loader, sampler=ShardSampler(loader.dataset), worker_init_fn=loader.worker_init_fn,
                              generator=loader.generator)
    # the first samples of this epoch's draw (the same on every rank), which every padding batch is made of
    samples = list(itertools.islice(itertools.chain.from_iterable(sharded.check()), PADDING_SAMPLES))
    collate = loader.collate_fn
    if train and samples:
        collate = PaddingCollate(collate, loader.dataset, samples, padding=padding)
    return rebuild_loader(loader, batch_sampler=sharded, collate_fn=collate, worker_init_fn=loader.worker_init_fn,
                          generator=loader.generator)


def _shards_itself(batch_sampler: Any) -> bool:
    """A batch sampler that already picks this rank's part (like one over a ``DistributedSampler``)."""
    return any(hasattr(s, "num_replicas") for s in (batch_sampler, getattr(batch_sampler, "sampler", None)))
