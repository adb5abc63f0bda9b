"""Under several processes every process resumes from the checkpoint rank 0 chose, or all stop together.

A node that cannot see rank 0's checkpoint (no shared file system) used to start from scratch while the
others resumed, so DDP averaged gradients of different models and the job hung.
"""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

import trainwise.checkpoint.training
from trainwise import Trainer, TrainwiseError


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g))


def _fit(run_dir, resume=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    Trainer(epochs=1 if resume is None else 2, batch_size=4, run_dir=run_dir, resume=resume, progress="off",
            plot=False, diagnose=False, device="cpu", dist_timeout=60).fit(model, _data())
    return model


def _worker(rank: int, port: int, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        if rank == 1:  # this "node" does not see the run folder of rank 0
            def missing(path, **kw):
                raise TrainwiseError(f"{path} does not exist; check the path.")

            trainwise.checkpoint.training.read_checkpoint = missing
        try:
            _fit(run_dir, resume="auto")
            outcome = "trained"
        except TrainwiseError as exc:
            outcome = str(exc)
        with open(f"{out}.{rank}", "w") as file:
            file.write(outcome)
        gc.collect()  # a DDP wrapper in a reference cycle goes before the process group (a teardown SIGABRT)
        dist.barrier()  # neither process leaves the group while the other still talks to it
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_process_that_cannot_read_the_checkpoint_stops_every_process(tmp_path):
    run_dir = str(tmp_path / "run")
    _fit(run_dir)  # one process, one epoch: a checkpoint to resume from
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = str(tmp_path / "outcome")
    mp.spawn(_worker, args=(port, run_dir, out), nprocs=2, join=True)
    outcomes = [Path(f"{out}.{rank}").read_text() for rank in (0, 1)]
    assert outcomes[0] == outcomes[1], outcomes
    assert "process 1 cannot read" in outcomes[0] and "file system every node shares" in outcomes[0]
