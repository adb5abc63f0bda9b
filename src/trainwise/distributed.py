"""torch.distributed for the same script on one process or many: torchrun detection, the process group,
samplers that shard the data, decisions every rank agrees on, DDP and FSDP wrapping, sharded checkpoints.

    python train.py                                   # one process: nothing here does anything
    torchrun --standalone --nproc-per-node 2 train.py # two processes: DDP, sharded data, exact metrics

Everything is plain ``torch.distributed`` (DDP, FSDP2 ``fully_shard``, ``torch.distributed.checkpoint``);
trainwise only decides when to use it and keeps the fundamentals exact across processes. A collective that
waits longer than ``timeout`` seconds for a peer (a crashed or killed process) raises instead of hanging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from trainwise.errors import TrainwiseError
from trainwise.freezing import has_running_stats
from trainwise.seeding import SeededBatchSampler, rebuild_loader

DEFAULT_TIMEOUT = 300.0  # seconds a collective waits for a peer before raising (a dead rank, a stuck one)
Padding = Literal["zero_rows", "samples"]  # what a rank whose shard ran out trains on (see PaddingCollate)
PADDING_SAMPLES = 2  # real samples in a padding batch: BatchNorm without running statistics needs two in train mode


@dataclasses.dataclass(frozen=True)
class DistributedInfo:
    """Where this process stands: its rank, the number of processes, and whether trainwise made the group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    created: bool = False  # the group was initialised here (and is destroyed here)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True when torchrun (or any launcher setting ``RANK`` and ``WORLD_SIZE``) started more than one process."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_distributed() -> bool:
    """A process group with more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Rank 0, or the only process: the one that writes files and prints."""
    return get_rank() == 0


def init_distributed(
    device: torch.device | str | None = None, *, timeout: float = DEFAULT_TIMEOUT, backend: str | None = None
) -> DistributedInfo:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...).

    Backend: nccl for a CUDA device, gloo otherwise. On CUDA the process uses ``cuda:LOCAL_RANK``. A group
    that is already initialised (by the user) is used as it is. Without torchrun: a one-process no-op.
    ``timeout`` bounds how long any collective waits for the other processes.
    """
    if dist.is_available() and dist.is_initialized():
        return DistributedInfo(dist.get_rank(), dist.get_world_size(), _local_rank(), created=False)
    if not launched_by_torchrun():
        return DistributedInfo()
    if not dist.is_available():
        raise TrainwiseError("this torch build has no torch.distributed; install a build with it to use torchrun.")
    if not timeout > 0:
        raise TrainwiseError(f"the distributed timeout must be a positive number of seconds, got {timeout!r}.")
    device = torch.device(device) if device is not None else None
    local_rank = _local_rank()
    if backend is None:
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return DistributedInfo(dist.get_rank(), dist.get_world_size(), local_rank, created=True)


def close_distributed(info: DistributedInfo) -> None:
    """Destroy the process group if ``init_distributed`` created it (a user's own group is left alone)."""
    if info.created and dist.is_initialized():
        gc.collect()  # a DDP wrapper in a reference cycle still holds the group; it goes while Python is alive
        dist.destroy_process_group()


def local_device(device: torch.device) -> torch.device:
    """``cuda:LOCAL_RANK`` for a CUDA device under torchrun; any other device as it is."""
    if device.type == "cuda" and launched_by_torchrun():
        return torch.device("cuda", _local_rank())
    return device


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


# -- agreement ---------------------------------------------------------------------------------------------


def broadcast_flag(flag: bool, *, device: torch.device | str = "cpu", src: int = 0) -> bool:
    """Rank ``src``'s decision, on every rank (one tiny broadcast; ``flag`` itself without a group)."""
    if not is_distributed():
        return bool(flag)
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.broadcast(tensor, src=src)
    return bool(tensor.item())


def any_rank(flag: bool, *, device: torch.device | str = "cpu") -> bool:
    """True on every rank when ``flag`` is true on at least one (a MAX all-reduce)."""
    if not is_distributed():
        return bool(flag)
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def same_last_batch(last: bool, batches: int, *, device: torch.device | str = "cpu") -> None:
    """Refuse, on every rank at once, a stream that ends on one rank while it goes on on another.

    For data without ``len()`` under DDP: a rank that ran out would leave the others waiting in their
    gradient all-reduce. One tiny all-reduce per batch tells every rank, before its backward, whether all
    of them are at their last batch. ``batches`` counts this rank's batches of the epoch including this one;
    a rank whose epoch yielded nothing calls it once with ``batches=0``.
    """
    if not is_distributed():
        return
    tensor = torch.tensor([1 if last or batches == 0 else 0, 1 if batches == 0 else 0], dtype=torch.int32,
                          device=device)
    dist.all_reduce(tensor)
    ended, empty = (int(v) for v in tensor.tolist())
    world = dist.get_world_size()
    if empty == world:  # nobody has data: the caller's own "no batches" error, on every rank
        return
    if empty or 0 < ended < world:
        when = "yielded no batches" if empty else f"ended after {batches} batches"
        raise TrainwiseError(
            f"the training data of {max(empty, ended)} of {world} processes {when} while the others "
            f"{'had some' if empty else 'go on'}; data without len() must yield the same number of batches on "
            "every process under DDP: give the data set a length (trainwise shards it evenly) or cut each "
            "process's stream to the same length."
        )


def broadcast_object(value: Any, *, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``value`` on every rank (e.g. a run folder name chosen by the clock)."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def first_problem(problem: str | None) -> str | None:
    """The first rank's problem (a sentence, or None), on every rank (one all_gather), so all stop together."""
    if not is_distributed():
        return problem
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p is not None), None)


def run_on_main(fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0 only (its result there, None elsewhere); a :class:`TrainwiseError` it raises is
    raised on every rank with the same sentence, so that all processes stop together."""
    result, problem = None, None
    if is_main_process():
        try:
            result = fn()
        except TrainwiseError as exc:
            problem = str(exc)
    problem = first_problem(problem)
    if problem is not None:
        raise TrainwiseError(problem)
    return result


# What gloo and NCCL say when the process at the other end of a collective has died (or hangs past the timeout).
_LOST_PEER = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|Connection refused|Timed out waiting|[Tt]imeout|timed out|"
    r"NCCL communicator was aborted|remote process exited|Socket closed"
)


def lost_process_error(exc: BaseException, info: DistributedInfo, *, checkpoint: str | None,
                       timeout: float) -> TrainwiseError | None:
    """One sentence for a collective that failed because another process died or stopped answering (gloo's
    ``Connection reset by peer``, a timeout), naming that process where it can be known (of two processes, the
    other one) and ``checkpoint``, the latest good one; None for any other error."""
    if not info.enabled or not isinstance(exc, RuntimeError) or isinstance(exc, TrainwiseError):
        return None
    found = _LOST_PEER.search(str(exc))
    if found is None:
        return None
    who = f"process {1 - info.rank} of 2" if info.world_size == 2 else f"another of the {info.world_size} processes"
    timed_out = "ime" in found.group()  # Timed out, timeout, timed out
    what = (f"did not answer within dist_timeout ({timeout:g} s)" if timed_out
            else f"died (the connection to it closed: {found.group().lower()})")
    saved = (f"the latest good checkpoint is {checkpoint}, which resume='auto' continues from" if checkpoint
             else "no checkpoint was written yet")
    return TrainwiseError(f"{who} {what}, so process {info.rank} stopped too; {saved}.")


def barrier() -> None:
    """Wait for every rank (no-op without a group)."""
    if is_distributed():
        dist.barrier()


def global_metric_values(metrics: Any) -> dict[str, float]:
    """``metrics.compute()`` over every process, leaving the local running sums untouched.

    For running (training) metrics read mid-epoch: ``MetricSet.all_reduce`` replaces the local sums by the
    global ones, which a later reduction would count again.
    """
    if not is_distributed():
        return metrics.compute()
    snapshot = type(metrics)(metrics.device)
    snapshot.load_state_dict(metrics.state_dict())
    snapshot.all_reduce()
    return snapshot.compute()


# -- data ----------------------------------------------------------------------------------------------------


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
    """Tell a loader's batch sampler or sampler (any with ``set_epoch``) which epoch starts."""
    for holder in (loader, getattr(loader, "loader", None)):  # ResumableLoader wraps the DataLoader
        batch_sampler = getattr(holder, "batch_sampler", None)
        for sampler in (batch_sampler, getattr(holder, "sampler", None), getattr(batch_sampler, "sampler", None)):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
                return True
    return False


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


# -- models --------------------------------------------------------------------------------------------------


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``DistributedDataParallel`` around ``model`` (already on ``device``); the model itself is unchanged."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def _fully_shard() -> Any:
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:  # pragma: no cover - older torch
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def shard_model(model: torch.nn.Module, *, layers: tuple[type[torch.nn.Module], ...] | None = None) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2 ``fully_shard``: each child with parameters, then the root.

    ``layers``: the module types to shard one by one (transformer blocks, say); default every direct child
    that owns parameters. Parameters become ``DTensor`` shards; build the optimizer afterwards.
    """
    fully_shard = _fully_shard()
    if layers is None:
        targets = [child for child in model.children() if any(True for _ in child.parameters())]
    else:
        targets = [m for m in model.modules() if isinstance(m, layers) and m is not model]
    for module in targets:
        fully_shard(module)
    fully_shard(model)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """True for a model sharded with ``fully_shard`` (its parameters are DTensors)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def save_sharded(path: str | os.PathLike[str], model: torch.nn.Module, optimizer: Any = None) -> Path:
    """Every rank writes its shards to the folder ``path`` with ``torch.distributed.checkpoint`` (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(path)
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    dcp.save(state, checkpoint_id=str(path))
    return path


def load_sharded(path: str | os.PathLike[str], model: torch.nn.Module, optimizer: Any = None) -> None:
    """Load a folder written by :func:`save_sharded` into a model sharded the same or another way (collective).

    The folder is read through :mod:`trainwise.checkpoint.dcp`: its ``.metadata`` is checked before DCP
    reads anything, and nothing in it is unpickled beyond the DCP metadata classes and ``weights_only`` values.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from trainwise.checkpoint.dcp import load_dcp

    model_state, optim_state = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        state["optimizer"] = optim_state
    load_dcp(state, path)
    try:
        set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                       optim_state_dict=state.get("optimizer", {}))
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200].rstrip(".").replace(". ", "; ")
        raise TrainwiseError(
            f"the sharded checkpoint {path} does not fit this model and optimizer ({first}); resume with the "
            "model and optimizer it was saved from."
        ) from None


def sharded_to_single_file(folder: str | os.PathLike[str], output: str | os.PathLike[str]) -> dict[str, Any]:
    """Convert a sharded checkpoint folder to one ``torch.save`` file of the model's plain state dict.

    Runs in one process, no process group needed. The result loads with ``load_weights`` into a plain model.
    The folder is read safely (see :func:`load_sharded`): a folder that would need anything else is refused.
    """
    from trainwise.checkpoint.dcp import read_dcp_state
    from trainwise.checkpoint.io import atomic_torch_save

    state = read_dcp_state(folder)
    model_state = state.get("model", state)
    if not isinstance(model_state, dict):
        raise TrainwiseError(
            f"the sharded checkpoint {folder} holds no model state dict under 'model'; pass a folder written by "
            "trainwise.save_sharded."
        )
    atomic_torch_save(model_state, output)
    return model_state


__all__ = [
    "DEFAULT_TIMEOUT",
    "PADDING_SAMPLES",
    "DistributedInfo",
    "PaddingBatch",
    "PaddingCollate",
    "ShardSampler",
    "ShardedBatchSampler",
    "any_rank",
    "barrier",
    "broadcast_flag",
    "broadcast_object",
    "close_distributed",
    "get_rank",
    "get_world_size",
    "global_metric_values",
    "init_distributed",
    "is_distributed",
    "is_main_process",
    "is_padding",
    "is_sharded",
    "launched_by_torchrun",
    "load_sharded",
    "local_device",
    "padding_batches",
    "padding_for",
    "padding_forward",
    "padding_outputs",
    "save_sharded",
    "set_sampler_epoch",
    "shard_loader",
    "shard_model",
    "sharded_to_single_file",
    "train_sampler",
    "validation_padding",
    "zero_rows",
]
