"""The set-up before the first step does not wait for the disk, and gives up nothing for it (issue 47).

Before: ``Trainer.fit`` wrote ``config.json`` with two fsyncs (the file, then the folder) on the main thread before
the first optimizer step; on a busy disk they were most of the set-up's wall time. Now the file is written before
the first step and made durable beside it: the run still ends with a whole ``config.json`` (amended after the first
step), and a write that fails there ends the run in one sentence naming the file.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import TensorDataset

from trainwise import Trainer
from trainwise.errors import DiskWriteError
from trainwise.files import PendingWrite


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g))


def _fit(run_dir, **options):
    return Trainer(epochs=2, batch_size=8, device="cpu", progress="off", seed=0, run_dir=str(run_dir),
                   **options).fit(lambda: nn.Linear(4, 3), _data())


def test_no_fsync_waits_on_the_main_thread_before_the_first_step(tmp_path, monkeypatch):
    main_thread_fsyncs: list[int] = []
    first_step_seen: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd):
        if threading.current_thread() is threading.main_thread() and not first_step_seen:
            main_thread_fsyncs.append(fd)
        return real_fsync(fd)

    def first_step(optimizer, args, kwargs):
        first_step_seen.append(True)

    monkeypatch.setattr(os, "fsync", fsync)
    handle = register_optimizer_step_post_hook(first_step)
    try:
        result = _fit(tmp_path / "run")
    finally:
        handle.remove()
    assert first_step_seen
    assert main_thread_fsyncs == []
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["trainer"]["batch_size"] == 8
    assert config["count"] == "samples"  # amended after the first step, on the file committed beside it


def test_a_config_json_that_cannot_be_made_durable_ends_the_run_naming_it(tmp_path, monkeypatch):
    real_commit = PendingWrite.commit

    def commit(self):
        if self.path.name == "config.json":
            self.discard()
            raise DiskWriteError(f"could not write {self.path}: the disk is full (No space left on device); "
                                 "nothing was written; free space, then try again.", path=self.path, errno=28,
                                 strerror="No space left on device")
        return real_commit(self)

    monkeypatch.setattr(PendingWrite, "commit", commit)
    with pytest.raises(DiskWriteError, match=r"config\.json: the disk is full"):
        _fit(tmp_path / "run")
    run = tmp_path / "run"
    assert not (run / "config.json").exists()
    assert not list(run.glob(".config.json*"))  # no temporary file left behind
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").iterdir())
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["status"] == "failed"
