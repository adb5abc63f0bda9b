"""Trainer(resume=...): a run interrupted mid-epoch and resumed ends bitwise identical to an uninterrupted one."""

import json

import pytest
import torch
import torch.nn.functional as F

from trainwise import Trainer, TrainwiseError, seed_everything
from trainwise.checkpoint import CheckpointManager, load_weights
from trainwise.demo import DigitsCNN, digits_datasets


def _fit(run_dir, *, workers, interrupt_at=None, resume=None, epochs=3):
    seed_everything(0)
    model = DigitsCNN(width=8)
    train, val = digits_datasets(0)
    calls = {"train": 0}

    def loss_fn(outputs, targets):
        if torch.is_grad_enabled():  # training calls only
            calls["train"] += 1
            if calls["train"] == interrupt_at:
                raise KeyboardInterrupt
        return F.cross_entropy(outputs, targets)

    try:  # an interrupted fit raises KeyboardInterrupt carrying its result
        result = Trainer(
            epochs=epochs, batch_size=64, accumulation_steps=2, num_workers=workers, deterministic=True, seed=0,
            checkpoint_every=5, run_dir=str(run_dir), progress="off", plot=False, loss_fn=loss_fn, resume=resume,
            scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5),
        ).fit(model, train, val)
    except KeyboardInterrupt as exc:
        result = exc.result
    return model, result


def _without_times(history):
    return [{k: v for k, v in record.items() if k != "seconds"} for record in history]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_interrupted_mid_epoch_and_resumed_equals_uninterrupted(tmp_path, workers):
    reference, full = _fit(tmp_path / "full", workers=workers)
    # 23 batches per epoch, 2 per optimizer step: the step-15 checkpoint is 6 batches into epoch 2;
    # the interruption comes 2 batches later, so the resumed run must redo those two
    _, cut = _fit(tmp_path / "cut", workers=workers, interrupt_at=23 + 9)
    assert cut.stopped == "interrupted" and len(cut.history) == 1
    resumed, result = _fit(tmp_path / "cut", workers=workers, resume="auto")
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    assert _without_times(result.history) == _without_times(full.history)
    assert result.steps == full.steps
    log = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    resumed_record = next(r for r in log if r["kind"] == "resumed")
    assert resumed_record["epoch"] == 2 and resumed_record["step"] == 15


def test_resume_after_a_finished_epoch_and_explicit_path(tmp_path):
    _, first = _fit(tmp_path / "a", workers=0, epochs=1)
    manager = CheckpointManager(tmp_path / "a")
    latest = manager.latest()
    assert latest is not None
    model, result = _fit(tmp_path / "b", workers=0, epochs=2, resume=str(latest))
    assert [r["epoch"] for r in result.history] == [1, 2]
    assert result.history[0]["train_loss"] == first.history[0]["train_loss"]
    reference, _ = _fit(tmp_path / "c", workers=0, epochs=2)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in reference.state_dict().items())


def test_checkpoint_loads_into_a_plain_model_without_prefixes(tmp_path):
    _fit(tmp_path, workers=0, epochs=1)
    latest = CheckpointManager(tmp_path).latest()
    report = load_weights(DigitsCNN(width=8), latest)
    assert not report.missing and not report.unexpected and not report.prefix_changes and not report.mismatched


def test_resume_from_a_missing_path_is_one_sentence(tmp_path):
    with pytest.raises(TrainwiseError, match="does not exist"):
        _fit(tmp_path, workers=0, resume=str(tmp_path / "nope.pt"))


def test_resume_auto_with_nothing_to_resume_starts_fresh(tmp_path):
    _, result = _fit(tmp_path, workers=0, epochs=1, resume="auto")
    assert result.stopped == "completed" and len(result.history) == 1
