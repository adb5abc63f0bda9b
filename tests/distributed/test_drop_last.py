"""``Trainer(drop_last=True)`` drops a short last batch as a DataLoader does: of a Dataset the Trainer batches,
and of a DataLoader given with ``drop_last=False``; under DDP every process keeps the same number of full
batches, so none pads (the 2-process runs are in tests/ecosystem/test_hf_ddp_ragged.py)."""

from __future__ import annotations

import pytest
import torch
from ragged_common import Indexed, Recorder, trainer_options
from torch.utils.data import BatchSampler, DataLoader

from trainwise import Trainer
from trainwise.data import ShardedBatchSampler
from trainwise.errors import TrainwiseError


def _fit(tmp_path, data, **options) -> tuple[Recorder, int]:
    model = Recorder()
    result = Trainer(**trainer_options(str(tmp_path / "run"), epochs=1, batch_size=8, **options)).fit(model, data)
    return model, result.steps


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_drops_the_short_last_batch_of_a_dataset(tmp_path, drop_last: bool) -> None:
    model, steps = _fit(tmp_path, Indexed(44), drop_last=drop_last)  # 5 batches of 8 and one of 4
    assert steps == (5 if drop_last else 6)
    assert len(model.seen) == (40 if drop_last else 44) and len(set(model.seen)) == len(model.seen)


def test_drop_last_applies_to_a_dataloader_given_without_it(tmp_path) -> None:
    loader = DataLoader(Indexed(44), batch_size=8, shuffle=True)
    model, steps = _fit(tmp_path, loader, drop_last=True)
    assert steps == 5 and len(model.seen) == 40
    _, kept = _fit(tmp_path / "kept", loader)  # the loader's own drop_last=False otherwise
    assert kept == 6


@pytest.mark.parametrize("kind", ["batch_sampler", "batches"])
def test_drop_last_is_refused_for_batches_it_cannot_drop(tmp_path, kind: str) -> None:
    data = Indexed(44)
    if kind == "batch_sampler":
        data = DataLoader(data, batch_sampler=BatchSampler(range(44), 8, drop_last=False))
        match = "its own batch_sampler"
    else:
        data = [((data.x[i : i + 8], torch.arange(i, min(i + 8, 44))), data.y[i : i + 8]) for i in range(0, 44, 8)]
        match = "ready-made batches"
    with pytest.raises(TrainwiseError, match=match):
        _fit(tmp_path, data, drop_last=True)


def test_drop_last_on_several_processes_keeps_full_steps_and_pads_none() -> None:
    # 44 samples in batches of 4 on 2 processes: 11 full batches, 10 kept (5 each), as one process with batches
    # of 8 keeps 5; without drop_last, rank 1 ends with a padding batch
    for drop_last, padding in ((True, [0, 0]), (False, [0, 1])):
        samplers = [ShardedBatchSampler(BatchSampler(range(44), 4, drop_last), seed=0, drop_last=drop_last,
                                        rank=rank, world_size=2) for rank in (0, 1)]
        assert [s.padding for s in samplers] == padding
        steps = [list(s) for s in samplers]
        assert len(steps[0]) == len(steps[1]) == (5 if drop_last else 6)
        one = list(BatchSampler(range(44), 8, drop_last))
        for k, batch in enumerate(one):  # step k of 2 processes: the samples of batch k of one
            assert sorted(steps[0][k] + steps[1][k]) == sorted(batch)
