"""Shared by the ragged-shard and batch-sampler tests under DDP: data that names its samples, a model that
records which samples it trained on, a bucketing batch sampler, and a launcher of 2 gloo processes that
fails (instead of hanging) past a deadline."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import Dataset

N = 1001  # not divisible by 2: the two processes get 501 and 500 samples


class Indexed(Dataset):
    """Sample i is ``((x_i, i), y_i)``: its index travels with it to the model."""

    def __init__(self, n: int = N) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=generator)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] > 0).long() + (self.x[:, 2] > 1).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> Any:
        return (self.x[index], torch.tensor(index)), self.y[index]


class Recorder(nn.Module):
    """A small classifier that records the index of every sample it trains on (zero-row batches add none), and
    counts the forwards of padding batches of real samples apart: the Trainer runs those with norm layers'
    running statistics in eval mode (``trainwise.data.padding_forward``), which ``marker`` shows."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.marker = nn.BatchNorm1d(1, affine=False)  # never called; no parameters: the weights are net's
        self.seen: list[int] = []
        self.forwards = 0
        self.padding_forwards = 0  # of them, forwards of a padding batch of real samples (trained with weight 0)
        self.interrupt_at: int | None = None  # raise KeyboardInterrupt at this training forward

    def forward(self, inputs: Any) -> torch.Tensor:
        x, index = inputs
        if self.training and torch.is_grad_enabled():
            self.forwards += 1
            if self.forwards == self.interrupt_at:
                raise KeyboardInterrupt
            if self.marker.training:
                self.seen.extend(index.tolist())
            else:
                self.padding_forwards += 1
        return self.net(x)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full weights of ``model.net``, also when FSDP sharded them (a collective then: call on every rank)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.net.state_dict().items()}


class BucketBatchSampler:
    """Batches of samples of similar length (NLP bucketing): shuffled, sorted by length in pools of 8
    batches, cut into batches, and the batches shuffled; seeded by its own ``torch.Generator``."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int) -> None:
        self.lengths, self.batch_size = lengths, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def _pools(self) -> range:
        return range(0, len(self.lengths), 8 * self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        batches = []
        for start in self._pools():
            pool = sorted(order[start : start + 8 * self.batch_size], key=lambda i: self.lengths[i])
            batches += [pool[k : k + self.batch_size] for k in range(0, len(pool), self.batch_size)]
        shuffled = torch.randperm(len(batches), generator=self.generator).tolist()
        return iter([batches[i] for i in shuffled])

    def __len__(self) -> int:
        pool = 8 * self.batch_size
        return sum(-(-min(pool, len(self.lengths) - start) // self.batch_size) for start in self._pools())


def lengths(n: int = N) -> list[int]:
    return [(7 * i) % 13 + 1 for i in range(n)]


def init(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import datetime

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))


def launch(worker: Any, *args: Any, timeout: float = 300) -> None:
    """Run ``worker(rank, port, *args)`` in 2 spawned processes; fail the test past ``timeout`` seconds."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # for the spawned processes only: put back once they are started
    try:
        context = mp.start_processes(worker, args=(port, *args), nprocs=2, join=False, start_method="spawn")
    finally:
        if previous is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = previous
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the two processes did not finish within {timeout} seconds (a hang)")


def trainer_options(run_dir: str, **overrides: Any) -> dict[str, Any]:
    options = dict(
        epochs=3, device="cpu", precision="fp32", progress="off", plot=False, diagnose=False, log_every=1000,
        run_dir=run_dir, checkpoints=False, dist_timeout=60.0, seed=0,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
    )
    options.update(overrides)
    return options
