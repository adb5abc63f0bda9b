"""Ctrl-C in Trainer.fit: the first interrupt finishes the current optimizer step, saves a checkpoint and the
log, then raises KeyboardInterrupt (a script must not run on as if training had finished); resuming from
that checkpoint gives the uninterrupted run's weights. A second Ctrl-C stops at once."""

from __future__ import annotations

import os
import signal

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import CheckpointManager, Trainer, read_log
from trainwise.interrupts import StepBoundaryInterrupt


def _data(n=120):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _fit(run_dir, *, sigint_at=(), resume=None, epochs=2):
    """Fit with 3 micro-batches a window; ``sigint_at``: the training batches (counted from 1) during whose loss
    this process sends itself SIGINT, as Ctrl-C in a terminal does."""
    calls = {"n": 0}

    def loss_fn(outputs, targets):
        if not torch.is_grad_enabled():  # validation
            return F.cross_entropy(outputs, targets)
        calls["n"] += 1
        for _ in range(sigint_at.count(calls["n"])):
            os.kill(os.getpid(), signal.SIGINT)
        return F.cross_entropy(outputs, targets)

    trainer = Trainer(epochs=epochs, batch_size=8, accumulation_steps=3, run_dir=str(run_dir), progress="off",
                      seed=0, loss_fn=loss_fn, resume=resume, plot=False)
    result = trainer.fit(lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), _data(), _data(40))
    return result.model, result


def test_ctrl_c_finishes_the_step_saves_a_checkpoint_and_raises_and_the_resume_is_exact(tmp_path):
    reference, full = _fit(tmp_path / "full")
    # 15 batches an epoch, windows of 3: a Ctrl-C during batch 20 (epoch 2, second batch of its second
    # window) is held until batch 21 has stepped, at step 7
    with pytest.raises(KeyboardInterrupt) as info:
        _fit(tmp_path / "cut", sigint_at=(20,))
    cut = info.value.result
    assert cut.stopped == "interrupted" and cut.steps == 7 and len(cut.history) == 1
    assert "its checkpoint at step 7 resumes it" in cut.message
    assert CheckpointManager(tmp_path / "cut").latest().name == "ckpt-step000000007.pt"
    records = read_log(tmp_path / "cut")
    assert [r["kind"] for r in records][-2:] == ["interrupted", "end"] and records[-1]["status"] == "interrupted"
    resumed, result = _fit(tmp_path / "cut", resume="auto")
    assert result.steps == full.steps == 10
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(tmp_path):
    with pytest.raises(KeyboardInterrupt) as info:
        _fit(tmp_path / "cut", sigint_at=(20, 20))
    cut = info.value.result
    assert cut.steps == 6 and "checkpoint at step" not in cut.message  # the window of batches 19-21 never stepped
    assert CheckpointManager(tmp_path / "cut").latest().name == "ckpt-step000000005.pt"  # epoch 1's


def test_ctrl_c_outside_training_raises_at_once(tmp_path):
    class InterruptsInEval(nn.Linear):
        def forward(self, x):
            if not self.training:
                os.kill(os.getpid(), signal.SIGINT)
            return super().forward(x)

    with pytest.raises(KeyboardInterrupt) as info:
        Trainer(epochs=2, batch_size=8, run_dir=str(tmp_path / "run"), progress="off", plot=False).fit(
            InterruptsInEval(8, 2), _data(), _data(40))
    assert info.value.result.stopped == "interrupted" and info.value.result.steps == 15
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_handler_the_program_installed_is_left_alone():
    seen = []

    def own(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, own)
    try:
        with StepBoundaryInterrupt() as interrupt:
            interrupt.armed = True
            os.kill(os.getpid(), signal.SIGINT)
            assert not interrupt.active and not interrupt.requested and seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_a_checkpoint_is_written_waits_for_the_file_then_raises(tmp_path, monkeypatch):
    """The Ctrl-C arrives inside torch.save of the epoch-end checkpoint: raised there, it broke the zip being
    written ("unexpected pos" from torch's writer, an error instead of an interrupt); held, the file is whole."""
    original_save = torch.save
    calls = []

    def save(*args, **kwargs):  # the run's first torch.save: the epoch-end checkpoint
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode, inside torch's writer
        return original_save(*args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(KeyboardInterrupt) as info:
        _fit(tmp_path / "cut")
    cut = info.value.result
    assert cut.steps == 5 and len(cut.history) == 1 and "its checkpoint at step 5 resumes it" in cut.message
    monkeypatch.setattr(torch, "save", original_save)
    resumed, result = _fit(tmp_path / "cut", resume="auto")
    reference, full = _fit(tmp_path / "full")
    assert result.steps == full.steps
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_a_ctrl_c_at_once_right_after_an_epoch_checkpoint_says_that_checkpoint_resumes_the_run(tmp_path):
    """The run's one end says "its checkpoint at step N resumes it" whenever the latest checkpoint is of the step
    the run stopped at (issue 47: before, only a Ctrl-C held until a step said so; one outside training, between
    the epoch's checkpoint and the next step, said nothing of the checkpoint that resumes it)."""

    class CtrlCAtEpoch2:
        def on_epoch_start(self, state):
            if state.epoch == 2:  # outside training: raised at once
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as info:
        Trainer(epochs=2, batch_size=8, run_dir=str(tmp_path / "run"), progress="off", plot=False,
                callbacks=[CtrlCAtEpoch2()]).fit(nn.Linear(8, 2), _data(), _data(40))
    cut = info.value.result
    assert cut.stopped == "interrupted" and cut.steps == 15 and len(cut.history) == 1
    assert "interrupted at step 15; its checkpoint at step 15 resumes it" in cut.message
    assert CheckpointManager(tmp_path / "run").latest().name == "ckpt-step000000015.pt"
