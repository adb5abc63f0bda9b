"""torch.distributed for the same script on one process or many: torchrun detection, the process group,
decisions every rank agrees on, DDP and FSDP wrapping, sharded checkpoints (the samplers that shard the data
and the padding batches: :mod:`trainwise.data.samplers`).

    python train.py                                   # one process: nothing here does anything
    torchrun --standalone --nproc-per-node 2 train.py # two processes: DDP, sharded data, exact metrics

Everything is plain ``torch.distributed`` (DDP, FSDP2 ``fully_shard``, ``torch.distributed.checkpoint``);
trainwise only decides when to use it and keeps the fundamentals exact across processes. A collective that
waits longer than ``timeout`` seconds for a peer (a crashed or killed process) raises instead of hanging.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import re
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwise.errors import TrainwiseError

DEFAULT_TIMEOUT = 300.0  # seconds a collective waits for a peer before raising (a dead rank, a stuck one)
_DDP_WRAPPERS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # wrap_ddp's, while they are alive


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
    """Destroy the process group if ``init_distributed`` created it (a user's own group is left alone).

    A DDP wrapper of :func:`wrap_ddp` still alive, if only in a reference cycle (a traceback's frames), would hold
    the group into interpreter exit, where gloo aborts the process: it is collected first, and only then (a full
    collection takes 0.4 s with a big heap)."""
    if info.created and dist.is_initialized():
        if len(_DDP_WRAPPERS):
            gc.collect()
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


# -- models --------------------------------------------------------------------------------------------------


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``DistributedDataParallel`` around ``model`` (already on ``device``); the model itself is unchanged."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids)
    _DDP_WRAPPERS.add(wrapped)
    return wrapped


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
    "DistributedInfo",
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
    "is_sharded",
    "launched_by_torchrun",
    "load_sharded",
    "local_device",
    "save_sharded",
    "shard_model",
    "sharded_to_single_file",
]
