"""A seeded bucketing batch sampler under DDP: its batches are dealt to the 2 processes in turn (none repeated,
none dropped, the shorter shard padded with a zero-row batch), training equals one process taking the same
batches two at a time, and a run interrupted mid-epoch and resumed equals the uninterrupted one."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from ragged_common import BucketBatchSampler, Indexed, N, Recorder, init, launch, lengths, trainer_options, weights
from torch.utils.data import DataLoader

from trainwise import Trainer

pytestmark = pytest.mark.slow
EPOCHS = 2
BATCHES = 21  # 1,001 samples in pools of 400 cut into batches of 50: 8 + 8 + 5; rank 0 gets 11, rank 1 10 (+1)


def _loader(seed: int = 3) -> DataLoader:
    return DataLoader(Indexed(), batch_sampler=BucketBatchSampler(lengths(), 50, seed=seed))


def _fit(run_dir: str, steps: int, *, interrupt_at: int | None = None, resume: str | None = None):
    model = Recorder()
    model.interrupt_at = interrupt_at
    options = trainer_options(run_dir, epochs=EPOCHS, accumulation_steps=steps, checkpoints=True,
                              checkpoint_every=5, resume=resume)
    try:
        return model, Trainer(**options).fit(model, _loader(), _loader(seed=4))  # validation: batches shared too
    except KeyboardInterrupt as exc:  # an interrupted fit raises, carrying its result
        return model, exc.result


def _worker(rank: int, port: int, out: str, run_dir: str) -> None:
    init(rank, port)
    try:
        model, result = _fit(f"{run_dir}/full", 1)
        full = {"weights": weights(model), "seen": model.seen, "forwards": model.forwards, "steps": result.steps,
                "history": result.history}
        # windows of 1 micro-batch: 11 per epoch; checkpoints every 5 windows, so the last one before the
        # interruption is 9 batches into epoch 2; the interruption comes at its 11th micro-batch (on rank 1,
        # the zero-row one), so the resumed run skips 9 batches, trains 1 real batch and pads
        _, cut = _fit(f"{run_dir}/cut", 1, interrupt_at=11 + 11)
        resumed, result = _fit(f"{run_dir}/cut", 1, resume="auto")
        torch.save({"full": full, "cut": cut.stopped, "resumed": weights(resumed), "resumed_seen": resumed.seen,
                    "resumed_steps": result.steps}, f"{out}-{rank}.pt")
        gc.collect()  # any DDP reducer goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_bucketing_batch_sampler_under_ddp_is_sharded_exactly_and_resumes(tmp_path) -> None:
    launch(_worker, str(tmp_path / "out"), str(tmp_path / "runs"), timeout=300)
    ranks = [torch.load(tmp_path / f"out-{rank}.pt") for rank in (0, 1)]
    assert len(BucketBatchSampler(lengths(), 50, seed=3)) == BATCHES
    full = [r["full"] for r in ranks]
    assert full[0]["forwards"] == full[1]["forwards"] == EPOCHS * 11  # the same micro-batches on both
    sizes = [len(f["seen"]) // EPOCHS for f in full]
    for epoch in range(EPOCHS):  # every sample on exactly one process, once
        both = [f["seen"][epoch * s : (epoch + 1) * s] for f, s in zip(full, sizes)]
        assert sorted(both[0] + both[1]) == list(range(N))
    # one process taking the same batches two at a time (accumulation 2) trains the same weights
    single, result = _fit(str(tmp_path / "single"), 2)
    assert result.steps == full[0]["steps"] == EPOCHS * 11
    for mine, reference in zip(full[0]["history"], result.history, strict=True):
        assert mine["val_accuracy"] == reference["val_accuracy"]  # every validation sample counted once
        assert mine["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-6)
        assert mine["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-6)
    for key, value in single.net.state_dict().items():
        torch.testing.assert_close(full[0]["weights"][key], value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(full[1]["weights"][key], value, rtol=1e-5, atol=1e-6)
    # interrupted mid-epoch and resumed under DDP: the same as uninterrupted
    for rank in ranks:
        assert rank["cut"] == "interrupted" and rank["resumed_steps"] == full[0]["steps"]
        for key, value in full[0]["weights"].items():
            torch.testing.assert_close(rank["resumed"][key], value, rtol=0, atol=0)
    for rank, reference in zip(ranks, full):  # the rest of epoch 2, on the same process, in the same order
        assert rank["resumed_seen"] and rank["resumed_seen"] == reference["seen"][-len(rank["resumed_seen"]) :]
