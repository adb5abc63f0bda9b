"""Background checkpoint saves: serialised at the save, durable before anything reads them, failures raised once
with the step that failed, and a Trainer whose fsync fails says so in one sentence."""

from __future__ import annotations

import errno
import os
import threading

import pytest
import torch
from torch import nn

from trainwise import Trainer
from trainwise.checkpoint import CheckpointManager
from trainwise.checkpoint.manager import checkpoint_name
from trainwise.checkpoint.state import read_checkpoint
from trainwise.errors import DiskWriteError, TrainwiseError


def test_the_state_is_the_one_at_save_time_and_readers_wait_for_it(tmp_path, monkeypatch):
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):  # the background commit blocks until released: a save is still in flight
        if threading.current_thread().name == "trainwise-checkpoint":
            release.wait(10)
        return real_fsync(fd)

    model = nn.Linear(3, 2)
    manager = CheckpointManager(tmp_path, keep_last=2)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    path = manager.save({"model": model}, step=1, background=True)
    before = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on: this change must not reach step 1's checkpoint
    assert not path.exists()  # not durable yet, so not visible under its name
    threading.Timer(0.2, release.set).start()
    assert manager.latest() == path  # waits for the commit
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert torch.equal(read_checkpoint(path)["state"]["model"]["weight"], before)


def test_a_failed_background_commit_is_raised_once_with_its_step(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save({"w": torch.ones(2)}, step=1)
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    manager.save({"w": torch.zeros(2)}, step=2, background=True)  # serialised fine; the commit fails
    with pytest.raises(DiskWriteError) as info:
        manager.wait()
    assert info.value.step == 2 and "the disk is full" in str(info.value)
    monkeypatch.setattr(os, "fsync", real_fsync)
    manager.wait()  # raised once
    assert [p.name for p in manager.checkpoints()] == [checkpoint_name(1)]
    assert [p.name for p in tmp_path.joinpath("checkpoints").iterdir() if p.name.startswith(".")] == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to tell the checkpoint's fsync apart")
def test_trainer_reports_a_failed_background_commit_in_one_sentence(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    real_fsync = os.fsync
    commits = {"n": 0}

    def fail_the_second_checkpoint(fd):
        if threading.current_thread().name == "trainwise-checkpoint" and ".ckpt-step" in os.readlink(
                f"/proc/self/fd/{fd}"):
            commits["n"] += 1
            if commits["n"] == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fail_the_second_checkpoint)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainwiseError) as info:
        Trainer(epochs=3, batch_size=16, device="cpu", progress="off", run_dir=str(run_dir), plot=False).fit(
            nn.Linear(4, 2), data)
    message = str(info.value)
    first = run_dir / "checkpoints" / checkpoint_name(4)
    assert f"{checkpoint_name(8)}: the disk is full (No space left on device); free some space" in message, message
    assert f"the latest good checkpoint is {first}" in message and "\n" not in message
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert CheckpointManager(run_dir).checkpoints() == [first]


def test_fit_returns_with_its_last_checkpoint_on_disk(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    result = Trainer(epochs=2, batch_size=16, device="cpu", progress="off", run_dir=str(tmp_path), plot=False).fit(
        nn.Linear(4, 2), data)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert checkpoint_name(result.steps) in names and not any(n.startswith(".") for n in names)
    assert not any(t.name == "trainwise-checkpoint" and t.is_alive() for t in threading.enumerate())
