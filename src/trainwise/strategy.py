"""How many processes train and how they agree, as one object, in the spirit of Lightning Fabric's strategies:
one process (:class:`SingleProcess`), DDP (:class:`DDP`) or FSDP (:class:`FSDP`). The loop asks the strategy
instead of branching on the process count.

    >>> strategy = connect("auto", device, timeout=300)      # joins torchrun's process group, if any
    >>> strategy.place(model)                                # FSDP shards here, before the optimizer
    >>> forward_model, eval_model = strategy.wrap(model, compile=False)
    >>> stop = strategy.agree(stop)                          # rank 0's decision on every process
    >>> values = strategy.reduce(metrics)                    # summed over every process
"""

from __future__ import annotations

from typing import Any, Literal

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


class SingleProcess:
    """One process: every agreement is the process's own value, every reduction its own sums."""

    name = "single"
    sharded = False  # FSDP: the model's parameters are shards, saved beside the checkpoint file

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

    def check(self, *, unfreeze_at: Any, auto_batch: bool) -> None:
        """Refuse, in one sentence, an option this strategy cannot honour."""

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

    name = "ddp"

    def check(self, *, unfreeze_at: Any, auto_batch: bool) -> None:
        if unfreeze_at:  # DDP and FSDP fix the trainable parameters when they wrap
            raise TrainwiseError(
                "unfreeze_at is not supported with several processes; run each unfreezing phase as its own fit()."
            )

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

    name = "fsdp"
    sharded = True

    def check(self, *, unfreeze_at: Any, auto_batch: bool) -> None:
        super().check(unfreeze_at=unfreeze_at, auto_batch=auto_batch)
        if auto_batch:
            raise TrainwiseError("batch_size='auto' is not supported with distributed='fsdp'; set batch_size to "
                                 "a micro-batch that fits, with effective_batch.")

    def place(self, model: torch.nn.Module) -> None:
        shard_model(model)  # FSDP2, in place, before the optimizer sees the parameters

    def wrap(self, model: torch.nn.Module, *, compile: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
        compiled = torch.compile(model) if compile else model  # the sharded module is its own wrapper
        return compiled, compiled


def connect(kind: Kind, device: torch.device, *, timeout: float) -> SingleProcess:
    """The strategy for this process: under torchrun (several processes) it joins the process group and uses
    ``cuda:LOCAL_RANK`` on CUDA; ``"off"`` or one process: :class:`SingleProcess` on ``device``."""
    if kind == "off":
        return SingleProcess(device)
    info = init_distributed(local_device(device), timeout=timeout)  # a no-op for one process
    if not info.enabled:
        return SingleProcess(device, info)
    return (FSDP if kind == "fsdp" else DDP)(local_device(device), info)


__all__ = ["DDP", "FSDP", "SingleProcess", "connect"]
