"""Ragged shards under DDP and FSDP are exact: 1,001 samples on 2 processes train exactly as on 1.

Each rank gets every other batch of the one-process order (501 and 500 samples: nothing repeated, nothing
dropped); the rank with one batch fewer ends its epoch with a padding batch that adds nothing to the
gradient, so both run the same micro-batches, windows and collectives, and nobody waits for a peer forever.
The padding is a batch of zero rows (``shard_loader``'s default) or, in the Trainer and with
``padding="samples"``, real samples trained with weight 0 (for models that cannot take zero rows).
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ragged_common import Indexed, N, Recorder, init, launch, trainer_options, weights
from torch.nn.parallel import DistributedDataParallel

from trainwise import GradientAccumulator, Trainer, forward_micro_batch
from trainwise.data import seeded_loader, set_sampler_epoch, shard_loader
from trainwise.errors import TrainwiseError

EPOCHS = 3
# (name, per-process batch on 2 processes, accumulation steps): 1,001 samples in batches of 50 are 21 batches,
# 11 on rank 0 and 10 (+1 zero-row batch) on rank 1; 32 steps cover the epoch: one optimizer step per epoch
CASES = [("full", 50, 32), ("mini", 50, 2), ("mini64", 64, 3)]


def hand_loop(model: Recorder, batch: int, steps: int, *, distributed: bool, padding: str = "zero_rows") -> int:
    """A hand-written loop built from the public primitives only (no Trainer)."""
    loader = seeded_loader(Indexed(), batch_size=batch, seed=0)
    net: torch.nn.Module = model
    if distributed:
        loader = shard_loader(loader, train=True, seed=0, padding=padding)
        net = DistributedDataParallel(model)
    accumulator = GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.5), steps=steps,
                                      distributed=distributed)
    for epoch in range(EPOCHS):
        set_sampler_epoch(loader, epoch)
        for index, loaded in enumerate(loader):
            last = accumulator.micro_batches + 1 >= accumulator.steps or index + 1 == len(loader)
            if padding == "samples":  # forward_micro_batch knows a padding batch of real samples
                with accumulator.sync_context(net, last=last):
                    micro = forward_micro_batch(net, loaded)
                    if micro.loss is None:
                        accumulator.backward_empty(micro.outputs)
                    else:
                        accumulator.backward(micro.loss, count=micro.count)
                if last:
                    accumulator.step()
                continue
            inputs, targets = loaded
            with accumulator.sync_context(net, last=last):
                outputs = net(inputs)
                if len(targets):
                    accumulator.backward(F.cross_entropy(outputs, targets), count=len(targets))
                else:  # this rank's shard ran out: a zero-row batch keeps the collectives in step
                    accumulator.backward_empty(outputs)
            if last:
                accumulator.step()
    return accumulator.optimizer_steps


def _record(model: Recorder, steps: int) -> dict:
    return {"weights": weights(model), "seen": list(model.seen), "steps": steps, "forwards": model.forwards,
            "padding_forwards": model.padding_forwards}


def _worker(rank: int, port: int, out: str, run_dir: str) -> None:
    init(rank, port)
    try:
        results = {}
        for name, batch, steps in CASES:
            for kind in ("ddp", "fsdp"):
                if kind == "fsdp" and name != "full":
                    continue
                model = Recorder()
                options = trainer_options(f"{run_dir}/{kind}-{name}", batch_size=batch, accumulation_steps=steps,
                                          distributed=kind)
                result = Trainer(**options).fit(model, Indexed())
                results[f"trainer-{kind}-{name}"] = _record(model, result.steps)
            model = Recorder()
            results[f"hand-{name}"] = _record(model, hand_loop(model, batch, steps, distributed=True))
            model = Recorder()
            results[f"hand-samples-{name}"] = _record(model, hand_loop(model, batch, steps, distributed=True,
                                                                       padding="samples"))
        torch.save(results, f"{out}-{rank}.pt")
        gc.collect()  # any DDP reducer goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], dict]:
    folder = tmp_path_factory.mktemp("ragged")
    launch(_worker, str(folder / "out"), str(folder / "runs"), timeout=400)
    ranks = [torch.load(folder / f"out-{rank}.pt") for rank in (0, 1)]
    single = {}
    for name, batch, steps in CASES:  # one process with twice the batch: the same global batches
        model = Recorder()
        result = Trainer(**trainer_options(str(folder / f"single-{name}"), batch_size=2 * batch,
                                           accumulation_steps=steps)).fit(model, Indexed())
        single[f"trainer-{name}"] = _record(model, result.steps)
        model = Recorder()
        single[f"hand-{name}"] = _record(model, hand_loop(model, 2 * batch, steps, distributed=False))
    return ranks, single


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["trainer-ddp-full", "trainer-fsdp-full", "hand-full", "hand-samples-full"])
def test_full_batch_gradient_descent_on_two_processes_equals_one(runs, name: str) -> None:
    ranks, single = runs
    reference = single[name.replace("-ddp", "").replace("-fsdp", "").replace("-samples", "")]
    assert ranks[0][name]["steps"] == reference["steps"] == EPOCHS  # one optimizer step per epoch
    _same(ranks[0][name]["weights"], reference["weights"])
    _same(ranks[1][name]["weights"], reference["weights"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["trainer-ddp-mini", "hand-mini", "hand-samples-mini", "trainer-ddp-mini64",
                                  "hand-mini64"])
def test_mini_batches_on_two_processes_equal_one(runs, name: str) -> None:
    ranks, single = runs
    reference = single[name.replace("-ddp", "").replace("-samples", "")]
    assert ranks[0][name]["steps"] == ranks[1][name]["steps"] == reference["steps"]
    _same(ranks[0][name]["weights"], reference["weights"])


@pytest.mark.slow
def test_every_sample_is_trained_on_exactly_once_per_epoch_and_no_rank_waits(runs) -> None:
    ranks, single = runs
    for name in ranks[0]:
        # the same number of forwards (and so of collectives) on both ranks; with batches of 50 rank 1's
        # shard is one batch shorter and its last forward each epoch is a padding batch: zero rows in a hand
        # loop, real samples (not recorded in seen) in the Trainer and with padding="samples"
        assert ranks[0][name]["forwards"] == ranks[1][name]["forwards"], name
        samples = name.startswith("trainer") or name.startswith("hand-samples")
        padded = EPOCHS if samples and not name.endswith("mini64") else 0  # 1,001 in 64s: 16 batches, 8 each
        assert [ranks[rank][name]["padding_forwards"] for rank in (0, 1)] == [0, padded], name
        per_rank = [ranks[rank][name]["seen"] for rank in (0, 1)]
        sizes = [len(seen) // EPOCHS for seen in per_rank]  # each rank trains on the same shard size each epoch
        assert sum(sizes) == N and all(len(seen) % EPOCHS == 0 for seen in per_rank), name  # none padded in
        for epoch in range(EPOCHS):
            both = [seen[epoch * size : (epoch + 1) * size] for seen, size in zip(per_rank, sizes)]
            assert sorted(both[0] + both[1]) == list(range(N)), f"{name}, epoch {epoch + 1}"
    for record in single.values():
        assert sorted(record["seen"]) == sorted(list(range(N)) * EPOCHS)


def test_zero_row_padding_adds_nothing_and_leaves_batch_norm_statistics_alone() -> None:
    from torch.utils.data import DataLoader, default_collate

    from trainwise.data import ShardedBatchSampler, padding_batches
    from trainwise.data.samplers import PaddingCollate

    data = Indexed(7)
    shards = []
    for rank in (0, 1):  # 5 samples in batches of 2: rank 0 gets batches 1 and 3, rank 1 batch 2 and a zero-row one
        sampler = ShardedBatchSampler(torch.utils.data.BatchSampler(range(5), 2, False), seed=0, rank=rank,
                                      world_size=2)
        loader = DataLoader(data, batch_sampler=sampler, collate_fn=PaddingCollate(default_collate, data, 0))
        shards.append([targets.tolist() for _, targets in loader])
        assert len(loader) == 2 and padding_batches(loader) == 2 - sampler.real_batches
    assert shards == [[data.y[[0, 1]].tolist(), data.y[[4]].tolist()], [data.y[[2, 3]].tolist(), []]]
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3)).train()
    (inputs, _), targets = next(iter(DataLoader(data, batch_sampler=[[]], collate_fn=PaddingCollate(
        default_collate, data, 0))))
    assert inputs.shape == (0, 6) and targets.shape == (0,)
    statistics = model[1].running_mean.clone(), model[1].running_var.clone()
    outputs = model(inputs)
    assert torch.equal(model[1].running_mean, statistics[0]) and torch.equal(model[1].running_var, statistics[1])
    assert torch.isnan(F.cross_entropy(outputs, targets))  # a mean over zero samples: loss * 0 would be NaN
    accumulator = GradientAccumulator(_Capture(model.parameters()), steps=2)
    accumulator.backward_empty(outputs)
    assert accumulator.micro_batches == 1
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())  # zeros, reached by backward
    accumulator.backward(F.cross_entropy(model(data.x[:3]), data.y[:3]), count=3)
    accumulator.step()  # the window: the zero-row batch and 3 samples, so the mean over those 3
    model.zero_grad()
    F.cross_entropy(model(data.x[:3]), data.y[:3]).backward()
    for got, expected in zip(accumulator.optimizer.grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, expected)


class _FlattensByRows(torch.nn.Module):
    """Flattens with ``x.view(x.size(0), -1)`` (as attention layers reshape): a batch of zero rows breaks it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.BatchNorm1d(6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, inputs) -> torch.Tensor:
        x, _ = inputs
        return self.head(self.norm(x).view(x.size(0), -1))


def test_padding_with_real_samples_adds_nothing_and_leaves_batch_norm_statistics_alone() -> None:
    from torch.utils.data import DataLoader, default_collate

    from trainwise.data import PaddingBatch, is_padding
    from trainwise.data.samplers import PADDING_SAMPLES, PaddingCollate, zero_rows

    data = Indexed(7)
    model = _FlattensByRows().train()
    (inputs, _), _ = zero_rows(default_collate([data[0]]))
    with pytest.raises(RuntimeError, match="0 elements"):  # why zero rows do not do for such a model
        model((inputs, None))
    (padding,) = DataLoader(data, batch_sampler=[[]], collate_fn=PaddingCollate(default_collate, data, [3, 5],
                                                                                padding="samples"))
    assert is_padding(padding) and isinstance(padding, PaddingBatch) and PADDING_SAMPLES == 2
    assert padding.batch[1].tolist() == data.y[[3, 5]].tolist()  # real samples, collated as every batch is
    norm = model.norm
    statistics = norm.running_mean.clone(), norm.running_var.clone(), norm.num_batches_tracked.clone()
    micro = forward_micro_batch(model, padding)
    assert micro.loss is None and micro.count == 0  # weight 0: no loss, no count
    assert micro.outputs.shape == (0, 3) and micro.targets.shape == (0,)  # no metric counts it
    assert norm.training  # eval only for the padding forward, then back
    for before, after in zip(statistics, (norm.running_mean, norm.running_var, norm.num_batches_tracked)):
        assert torch.equal(before, after)  # running statistics and num_batches_tracked untouched
    accumulator = GradientAccumulator(_Capture(model.parameters()), steps=2)
    accumulator.backward_empty(micro.outputs)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())  # zeros, reached by backward
    real = forward_micro_batch(model, [[data.x[:3], torch.arange(3)], data.y[:3]])
    accumulator.backward(real.loss, count=real.count)
    accumulator.step()  # the window: the padding and 3 samples, so the mean over those 3
    model.zero_grad()
    F.cross_entropy(model((data.x[:3], None)), data.y[:3]).backward()
    for got, expected in zip(accumulator.optimizer.grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, expected)


def test_padding_with_real_samples_refuses_sync_batch_norm_and_the_trainer_uses_zero_rows_for_it() -> None:
    from trainwise.data import padding_forward
    from trainwise.data.samplers import padding_for

    plain = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    synced = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.SyncBatchNorm(4))
    assert padding_for(plain) == "samples" and padding_for(synced) == "zero_rows"
    with pytest.raises(TrainwiseError, match="padding='zero_rows'"), padding_forward(synced):
        pass
    with pytest.raises(TrainwiseError, match="padding must be 'zero_rows' or 'samples'"):
        shard_loader(seeded_loader(Indexed(7), batch_size=2, seed=0), train=True, seed=0, padding="repeat")


class _Capture(torch.optim.Optimizer):
    def __init__(self, params) -> None:
        super().__init__(params, {})

    def step(self, closure=None) -> None:
        self.grads = [p.grad.clone() for group in self.param_groups for p in group["params"]]
