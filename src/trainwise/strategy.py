"""How many processes train and how they agree, as one object, in the spirit of Lightning Fabric's strategies:
:class:`Strategy` is the type (a Protocol), implemented by one process (:class:`SingleProcess`), DDP
(:class:`DDP`) and FSDP (:class:`FSDP`). The loop asks the strategy instead of branching on the process count;
which Trainer options a strategy cannot honour is the configuration's to say (``TrainerConfig.check_processes``).

    >>> strategy = connect("auto", device, timeout=300)      # joins torchrun's process group, if any
    >>> strategy.place(model)                                # FSDP shards here, before the optimizer
    >>> forward_model, eval_model = strategy.wrap(model, compile=False)
    >>> stop = strategy.agree(stop)                          # rank 0's decision on every process
    >>> values = strategy.reduce(metrics)                    # summed over every process
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch

from trainwise.distributed import (
    DistributedInfo,
    broadcast_flag,
    close_distributed,
    global_metric_values,
    init_distributed,
    local_device,
    lost_process_error,
    same_last_batch,
    shard_model,
    wrap_ddp,
)
from trainwise.errors import TrainwiseError

Kind = Literal["auto", "ddp", "fsdp", "off"]
Name = Literal["single", "ddp", "fsdp"]


class Strategy(Protocol):
    """How many processes train and how they agree: what the loop, the run and the policies may ask."""

    name: Name  # which one: the configuration checks its options against it (TrainerConfig.check_processes)
    sharded: bool  # FSDP: the model's parameters are shards, saved beside the checkpoint file
    device: torch.device  # this process's device
    info: DistributedInfo  # rank, world size, whether trainwise made the process group

    @property
    def enabled(self) -> bool:
        """More than one process trains."""
        ...

    @property
    def is_main(self) -> bool:
        """The process that writes the run folder and prints (rank 0)."""
        ...

    @property
    def world_size(self) -> int:
        """The number of processes that train."""
        ...

    def place(self, model: torch.nn.Module) -> None:
        """Before the optimizer sees the parameters (FSDP shards the model here, in place)."""
        ...

    def wrap(self, model: torch.nn.Module, *, compile: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The module training calls and the one validation calls (compiled when asked)."""
        ...

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, on every process (a stop, say): every process then does the same."""
        ...

    def agree_on_last(self, last: bool, batches_done: int) -> None:
        """Data without ``len()``: refuse, on every process at once, a stream that ends on one but not another."""
        ...

    def reduce(self, metrics: Any) -> dict[str, float]:
        """The metrics' values over every process (running sums left as they are)."""
        ...

    def lost_process(self, exc: BaseException, *, checkpoint: str | None, timeout: float) -> TrainwiseError | None:
        """The one sentence for an error that means another process died; None for any other error."""
        ...

    def close(self) -> None:
        """Leave the process group this strategy joined (a user's own group is left alone)."""
        ...


class SingleProcess:
    """One process: every agreement is the process's own value, every reduction its own sums. DDP and FSDP
    share its code by inheritance; the type the rest of trainwise names is :class:`Strategy`."""

    name: Name = "single"
    sharded = False

    def __init__(self, device: torch.device, info: DistributedInfo | None = None) -> None:
        self.device = device
        self.info = info or DistributedInfo()

    @property
    def enabled(self) -> bool:
        """More than one process trains."""
        return self.info.enabled

    @property
    def is_main(self) -> bool:
        """The process that writes the run folder and prints (rank 0)."""
        return self.info.is_main

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def place(self, model: torch.nn.Module) -> None:
        """Before the optimizer sees the parameters (FSDP shards the model here, in place)."""

    def wrap(self, model: torch.nn.Module, *, compile: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The module training calls and the one validation calls (compiled when asked)."""
        compiled = torch.compile(model) if compile else model
        return compiled, compiled

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, on every process (a stop, say): every process then does the same."""
        return bool(flag)

    def agree_on_last(self, last: bool, batches_done: int) -> None:
        """Data without ``len()``: refuse, on every process at once, a stream that ends on one but not another."""

    def reduce(self, metrics: Any) -> dict[str, float]:
        """The metrics' values over every process (running sums left as they are)."""
        return metrics.compute()

    def lost_process(self, exc: BaseException, *, checkpoint: str | None, timeout: float) -> TrainwiseError | None:
        """The one sentence for an error that means another process died; None for any other error."""
        return None

    def close(self) -> None:
        """Leave the process group this strategy joined (a user's own group is left alone)."""
        close_distributed(self.info)


class DDP(SingleProcess):
    """``DistributedDataParallel``: every process holds the whole model; gradients are averaged each window.
    Validation runs on the module itself (no per-batch collective, so unequal evaluation shards cannot hang),
    its sums added over processes at the end."""

    name: Name = "ddp"

    def wrap(self, model: torch.nn.Module, *, compile: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        wrapped = wrap_ddp(model, self.device)
        if compile:
            return torch.compile(wrapped), torch.compile(model)
        return wrapped, model

    def agree(self, flag: bool) -> bool:
        return broadcast_flag(flag, device=self.device)

    def agree_on_last(self, last: bool, batches_done: int) -> None:
        same_last_batch(last, batches_done, device=self.device)

    def reduce(self, metrics: Any) -> dict[str, float]:
        return global_metric_values(metrics)  # one all-reduce

    def lost_process(self, exc: BaseException, *, checkpoint: str | None, timeout: float) -> TrainwiseError | None:
        return lost_process_error(exc, self.info, checkpoint=checkpoint, timeout=timeout)


class FSDP(DDP):
    """FSDP2 ``fully_shard``: each process holds shards of the parameters and optimizer state; checkpoints
    are sharded folders written by every process beside rank 0's file."""

    name: Name = "fsdp"
    sharded = True

    def place(self, model: torch.nn.Module) -> None:
        shard_model(model)  # FSDP2, in place, before the optimizer sees the parameters

    def wrap(self, model: torch.nn.Module, *, compile: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        compiled = torch.compile(model) if compile else model  # the sharded module is its own wrapper
        return compiled, compiled


def connect(kind: Kind, device: torch.device, *, timeout: float) -> Strategy:
    """The strategy for this process: under torchrun (several processes) it joins the process group and uses
    ``cuda:LOCAL_RANK`` on CUDA; ``"off"`` or one process: :class:`SingleProcess` on ``device``."""
    if kind == "off":
        return SingleProcess(device)
    info = init_distributed(local_device(device), timeout=timeout)  # a no-op for one process
    if not info.enabled:
        return SingleProcess(device, info)
    return (FSDP if kind == "fsdp" else DDP)(local_device(device), info)


__all__ = ["DDP", "FSDP", "SingleProcess", "Strategy", "connect"]
