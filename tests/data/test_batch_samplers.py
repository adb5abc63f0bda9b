"""A DataLoader with its own batch_sampler (bucketing by length) is accepted when its order is reproducible:
it trains, resumes mid-epoch exactly, and is shared between processes without repeats; an unseeded random
one is refused in one sentence that names the fix."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset

from trainwise import Trainer, TrainwiseError

N = 203


class Indexed(Dataset):
    """Sample i is ``((x_i, i), y_i)``: the model sees which samples it trains on."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 6, generator=generator)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int):
        return (self.x[index], torch.tensor(index)), self.y[index]


class Recorder(nn.Module):
    def __init__(self, interrupt_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
        self.seen: list[int] = []
        self.forwards, self.interrupt_at = 0, interrupt_at

    def forward(self, inputs):
        x, index = inputs
        if self.training and torch.is_grad_enabled():
            self.forwards += 1
            if self.forwards == self.interrupt_at:
                raise KeyboardInterrupt
            self.seen.extend(index.tolist())
        return self.net(x)


LENGTHS = [(7 * i) % 13 + 1 for i in range(N)]


class Buckets:
    """Bucketing by length: shuffled, sorted by length in pools of 4 batches, batches shuffled. Subclasses
    change only where the randomness comes from."""

    def __init__(self, batch_size: int = 16) -> None:
        self.batch_size = batch_size

    def permutation(self, n: int) -> list[int]:
        raise NotImplementedError

    def __iter__(self):
        order = self.permutation(N)
        pool = 4 * self.batch_size
        batches = []
        for start in range(0, N, pool):
            chunk = sorted(order[start : start + pool], key=lambda i: LENGTHS[i])
            batches += [chunk[k : k + self.batch_size] for k in range(0, len(chunk), self.batch_size)]
        return iter([batches[i] for i in self.permutation(len(batches))])

    def __len__(self) -> int:
        pool = 4 * self.batch_size
        return sum(-(-min(pool, N - start) // self.batch_size) for start in range(0, N, pool))


class GeneratorBuckets(Buckets):  # its own seeded torch.Generator (checkpointed by ResumableLoader)
    def __init__(self, batch_size: int = 16, seed: int = 3) -> None:
        super().__init__(batch_size)
        self.generator = torch.Generator().manual_seed(seed)

    def permutation(self, n: int) -> list[int]:
        return torch.randperm(n, generator=self.generator).tolist()


class GlobalRandomBuckets(Buckets):  # Python's global RNG: trainwise seeds it from (seed, epoch) while drawing
    def permutation(self, n: int) -> list[int]:
        order = list(range(n))
        random.shuffle(order)
        return order


class EpochSeededBuckets(Buckets):  # a NumPy Generator reseeded from a seed in set_epoch
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__(batch_size)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.rng = np.random.default_rng([5, epoch])

    def permutation(self, n: int) -> list[int]:
        return self.rng.permutation(n).tolist()


class UnseededBuckets(Buckets):  # a private RNG seeded from the OS: a different order every run
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__(batch_size)
        self.rng = random.Random()

    def permutation(self, n: int) -> list[int]:
        return self.rng.sample(range(n), n)


def _fit(run_dir, batch_sampler, *, interrupt_at=None, resume=None, epochs=3, workers=0):
    model = Recorder(interrupt_at)
    loader = DataLoader(Indexed(), batch_sampler=batch_sampler, num_workers=workers)
    try:  # an interrupted fit raises KeyboardInterrupt carrying its result
        result = Trainer(
            epochs=epochs, device="cpu", precision="fp32", progress="off", plot=False, diagnose=False,
            run_dir=str(run_dir), checkpoint_every=4, accumulation_steps=2, seed=0, resume=resume,
            optimizer=lambda params: torch.optim.SGD(params, lr=0.3, momentum=0.9),
        ).fit(model, loader)
    except KeyboardInterrupt as exc:
        result = exc.result
    return model, result


def _history(result):
    return [{k: v for k, v in record.items() if k != "seconds"} for record in result.history]


@pytest.mark.parametrize("kind", [GeneratorBuckets, GlobalRandomBuckets, EpochSeededBuckets])
def test_a_reproducible_bucketing_batch_sampler_trains_each_sample_once_per_epoch(tmp_path, kind):
    model, result = _fit(tmp_path / "a", kind())
    assert result.stopped == "completed" and len(result.history) == 3
    batches = len(kind())
    for epoch in range(3):  # every epoch, every sample exactly once
        assert sorted(model.seen[epoch * N : (epoch + 1) * N]) == list(range(N))
    assert result.steps == 3 * -(-batches // 2)
    random.seed(123)  # whatever the global RNGs hold when fit starts, the batches are the same
    np.random.seed(123)
    again, _ = _fit(tmp_path / "b", kind())
    assert again.seen == model.seen
    for key, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key
    assert model.seen[:N] != again.seen[N : 2 * N]  # and each epoch has its own order


@pytest.mark.parametrize("kind", [GeneratorBuckets, GlobalRandomBuckets])
def test_interrupted_mid_epoch_and_resumed_equals_uninterrupted(tmp_path, kind):
    batches = len(kind())  # 13 batches of at most 16: 7 windows of 2 per epoch, a checkpoint every 4 windows
    reference, full = _fit(tmp_path / "full", kind())
    # the checkpoint at window 8 is 2 batches into epoch 2; interrupt 3 batches later
    _, cut = _fit(tmp_path / "cut", kind(), interrupt_at=batches + 2 + 3 + 1)
    assert cut.stopped == "interrupted"
    resumed, result = _fit(tmp_path / "cut", kind(), resume="auto")
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    assert _history(result) == _history(full) and result.steps == full.steps
    assert resumed.seen == reference.seen[-len(resumed.seen) :]  # the rest of the epoch, in the same order


def test_an_unseeded_random_batch_sampler_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(TrainwiseError) as caught:
        _fit(tmp_path, UnseededBuckets())
    message = str(caught.value)
    assert "UnseededBuckets" in message and "torch.Generator" in message and "set_epoch" in message
    assert message.endswith(".") and ". " not in message


def test_ranks_get_every_batch_once_and_the_same_number_of_micro_batches():
    """Without a process group: rank and world size given. 13 batches over 3 ranks: 5, 4 (+1), 4 (+1)."""
    from trainwise.data import SeededBatchSampler, ShardedBatchSampler

    shards = []
    for rank in range(3):
        sharded = ShardedBatchSampler(GeneratorBuckets(), seed=0, rank=rank, world_size=3)
        shards.append(list(sharded))
        assert len(sharded) == 5 and sharded.padding == (0 if rank == 0 else 1)
        assert shards[-1][sharded.real_batches :] == [[]] * sharded.padding  # padding at the end only
    everything = sorted(i for shard in shards for batch in shard for i in batch)
    assert everything == list(range(N))
    assert [batch for shard in zip(*shards) for batch in shard if batch] == list(
        SeededBatchSampler(GeneratorBuckets(), seed=0))  # dealt in turn: step k holds batches 3k, 3k+1, 3k+2
    dropped = [list(ShardedBatchSampler(GeneratorBuckets(), seed=0, rank=r, world_size=3, drop_last=True))
               for r in range(3)]
    assert [len(shard) for shard in dropped] == [4, 4, 4] and all(all(shard) for shard in dropped)


def test_plain_batch_sampler_shards_like_one_process_with_a_bigger_batch():
    """Sharding the one-process batches of 4 over 2 ranks gives, step by step, its batches of 8."""
    from trainwise.data import ShardedBatchSampler

    one = list(BatchSampler(range(21), 8, drop_last=True))
    steps = [
        ShardedBatchSampler(BatchSampler(range(21), 4, drop_last=True), seed=0, rank=r, world_size=2,
                            drop_last=True)
        for r in (0, 1)
    ]
    assert [a + b for a, b in zip(*steps)] == one
