"""Under DDP with accumulation, an iterable without len() ends its last (short) window with a gradient sync.

Before the look-ahead, the last micro-batch of an unsized epoch was not known, so the short last window's
backward ran inside no_sync(): each process stepped on its own gradients and the replicas drifted apart.
"""

from __future__ import annotations

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import IterableDataset

from trainwise import Trainer

BATCHES, BATCH = 5, 4  # per process: two full windows of 2 micro-batches, then a short window of 1


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _batches(rank):
    g = torch.Generator().manual_seed(10 + rank)
    return [(torch.randn(BATCH, 6, generator=g), torch.randint(0, 3, (BATCH,), generator=g)) for _ in range(BATCHES)]


class _Unsized(IterableDataset):
    """Ready-made batches of one process, no __len__."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _trainer(run_dir, steps):
    return Trainer(epochs=2, accumulation_steps=steps, optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
                   run_dir=str(run_dir), progress="off", plot=False, checkpoints=False, diagnose=False,
                   device="cpu")


def _worker(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = _model()
        trainer = _trainer(os.path.join(folder, "run"), steps=2)
        trainer.fit(model, iter_batches(_Unsized(_batches(rank))))
        torch.save(model.state_dict(), os.path.join(folder, f"rank{rank}.pt"))
        del trainer
        gc.collect()  # the DDP wrapper and its reducer go before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def iter_batches(dataset):
    """An iterable of ready-made batches without __len__ (the Trainer does not batch it again)."""

    class Batches:
        def __iter__(self):
            return iter(dataset)

    return Batches()


@pytest.mark.slow
def test_replicas_stay_identical_and_equal_one_process(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    # one process, the same windows: (r0 b0, r0 b1, r1 b0, r1 b1), (r0 b2, r0 b3, r1 b2, r1 b3), (r0 b4, r1 b4)
    first, second = _batches(0), _batches(1)
    order = []
    for start in range(0, BATCHES, 2):
        order += first[start:start + 2] + second[start:start + 2]
    windows = [order[i:i + 4] for i in range(0, 8, 4)] + [order[8:]]
    reference = _model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for _ in range(2):
        for window in windows:
            optimizer.zero_grad()
            x = torch.cat([b[0] for b in window])
            y = torch.cat([b[1] for b in window])
            nn.functional.cross_entropy(reference(x), y).backward()
            optimizer.step()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(rank0[key], value, rtol=1e-5, atol=1e-6)


def _unequal_worker(rank: int, port: int, folder: str, counts: tuple[int, int], steps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=__import__("datetime").timedelta(seconds=60))
    try:
        trainer = _trainer(os.path.join(folder, "run"), steps=steps)
        try:
            trainer.fit(_model(), iter_batches(_Unsized(_batches(rank)[: counts[rank]])))
            outcome = "trained"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as f:
            f.write(outcome)
        del trainer
        gc.collect()  # the DDP wrapper and its reducer go before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("counts", "steps"), [((3, 5), 2), ((5, 2), 1), ((0, 2), 1)])
def test_unequal_stream_lengths_are_refused_on_every_process(tmp_path, counts, steps):
    """A stream that ends on one process while the other goes on used to leave the other waiting in its
    gradient all-reduce (a hang until the timeout, or mismatched collectives); both now stop with one sentence
    before any backward of the mismatched batch."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_unequal_worker, args=(port, str(tmp_path), counts, steps), nprocs=2, join=True)
    outcomes = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    for outcome in outcomes:
        assert outcome.startswith("TrainwiseError: "), outcomes
        assert "same number of batches on every process" in outcome, outcomes
