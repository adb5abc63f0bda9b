"""Under DDP, processes with different numbers of samples per window still get the global-batch gradient."""

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from trainwise import GradientAccumulator

# per process, two micro-batches each: 5 + 3 samples on rank 0, 2 + 7 on rank 1 (17 in the window)
SPLITS = {0: [(0, 5), (5, 8)], 1: [(8, 10), (10, 17)]}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(17, 6, generator=g), torch.randint(0, 3, (17,), generator=g)


class _Capture(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = nn.parallel.DistributedDataParallel(_model())
        optimizer = _Capture(model.parameters())
        accumulator = GradientAccumulator(optimizer, steps=2, distributed=True)
        x, y = _data()
        for index, (start, end) in enumerate(SPLITS[rank]):
            with accumulator.sync_context(model, last=index == 1):
                loss = F.cross_entropy(model(x[start:end]), y[start:end])
                accumulator.backward(loss, count=end - start)
        accumulator.step()
        if rank == 0:
            torch.save(optimizer.grads, out)
        del model, optimizer, accumulator
        gc.collect()  # a DDP wrapper in a reference cycle goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_unequal_counts_give_the_global_batch_gradient(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = str(tmp_path / "grads.pt")
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    reference = _model()
    x, y = _data()
    F.cross_entropy(reference(x), y).backward()
    for got, expected in zip(torch.load(out), [p.grad for p in reference.parameters()], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
