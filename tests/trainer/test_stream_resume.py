"""A stream (a torch ``IterableDataset``, no ``len``) checkpointed every step and interrupted resumes bitwise:
the checkpoint's loader position is a count of batches, whatever the loader knows of its length."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import IterableDataset

from trainwise import Trainer, seed_everything


class _Stream(IterableDataset):
    """40 samples of a fixed synthetic task, in a fixed order: no ``__len__``."""

    def __iter__(self):
        g = torch.Generator().manual_seed(1)
        for _ in range(40):
            x = torch.randn(6, generator=g)
            yield x, int(x.sum() > 0)


def _fit(run_dir, *, interrupt_at=None, resume=None, checkpoint_every=1):
    seed_everything(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
    calls = {"train": 0}

    def loss_fn(outputs, targets):
        if torch.is_grad_enabled():
            calls["train"] += 1
            if calls["train"] == interrupt_at:
                raise KeyboardInterrupt
        return F.cross_entropy(outputs, targets)

    try:
        result = Trainer(epochs=2, batch_size=8, deterministic=True, seed=0, checkpoint_every=checkpoint_every,
                         run_dir=str(run_dir), progress="off", plot=False, loss_fn=loss_fn, resume=resume,
                         device="cpu").fit(model, _Stream())
    except KeyboardInterrupt as exc:
        result = exc.result
    return model, result


@pytest.mark.parametrize("interrupt_at", [4, 7])
def test_a_stream_checkpointed_every_step_resumes_bitwise(tmp_path, interrupt_at):
    reference, full = _fit(tmp_path / "full")
    _, cut = _fit(tmp_path / "cut", interrupt_at=interrupt_at)
    assert cut.stopped == "interrupted"
    resumed, result = _fit(tmp_path / "cut", resume="auto")
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    assert result.steps == full.steps
