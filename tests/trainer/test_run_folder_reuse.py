"""A reused run folder never loses the new run, and never mixes two runs.

Before: a script with a fixed run_dir run twice (the second time shorter, another lr, no resume) wrote the
new run's checkpoints and pruned them at once, because the old run's files sort as newer; config.json
described the new run while metrics.jsonl mixed both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import CheckpointManager, Trainer, TrainwiseError, read_log


def _fit(run_dir, epochs, **options):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g))
    model = nn.Linear(4, 3)
    return Trainer(epochs=epochs, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False,
                   run_dir=str(run_dir), **options).fit(model, data)


def test_a_second_run_in_the_same_folder_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    _fit(run, 5)
    before = {p.name: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".trainwise.lock"}
    with pytest.raises(TrainwiseError) as caught:
        _fit(run, 3, lr=1e-2)
    assert str(caught.value) == (
        f"run folder {run} already holds a run; pass resume='auto' to continue it, another run_dir, or "
        "overwrite=True to move the old run aside."
    )
    after = {p.name: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".trainwise.lock"}
    assert after == before


def test_overwrite_moves_the_old_run_aside_and_keeps_the_new_one_whole(tmp_path):
    run = tmp_path / "run"
    _fit(run, 5)
    old_checkpoints = [p.name for p in CheckpointManager(run).checkpoints()]
    result = _fit(run, 3, lr=1e-2, overwrite=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.previous-")]
    assert len(aside) == 1
    assert [p.name for p in CheckpointManager(aside[0]).checkpoints()] == old_checkpoints
    assert [r["epoch"] for r in read_log(aside[0] / "metrics.jsonl") if r["kind"] == "epoch"] == [1, 2, 3, 4, 5]
    # the new run: its own checkpoints (the last one is its step), its own log and config
    assert CheckpointManager(run).latest().name == f"ckpt-step{result.steps:09d}.pt"
    assert [r["epoch"] for r in read_log(run / "metrics.jsonl") if r["kind"] == "epoch"] == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["trainer"]["lr"] == 1e-2


def test_resume_auto_continues_the_run_in_the_folder(tmp_path):
    run = tmp_path / "run"
    _fit(run, 2)
    result = _fit(run, 3, resume="auto")
    assert [r["epoch"] for r in result.history] == [1, 2, 3]


def test_the_checkpoint_just_written_is_never_pruned_for_another_runs_later_steps(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    for step in (100, 200):
        manager.save({"x": torch.tensor(step)}, step=step)
    path = manager.save({"x": torch.tensor(5)}, step=5)
    assert path.exists()


@pytest.mark.slow
def test_the_demo_command_refuses_a_used_run_folder_without_a_traceback(tmp_path):
    run = tmp_path / "demo"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "start"}\n')
    out = subprocess.run([sys.executable, "-m", "trainwise.cli", "demo", "--epochs", "1", "--run-dir", str(run)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "already holds a run" in out.stderr and "Traceback" not in out.stderr


def _checkpoint_files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith("ckpt-")}


def test_a_copied_run_folder_never_writes_into_nor_prunes_the_originals_checkpoints(tmp_path):
    """``runs/a/checkpoints -> bigdisk/a-ckpts`` (docs/checkpoints.md), ``cp -r a b``, resume b: b's
    checkpoints/ is the same folder, so the resume is refused in one sentence and a's files stay as they are;
    a run folder that was moved (not copied) takes its checkpoints along."""
    big = tmp_path / "bigdisk" / "a-ckpts"
    big.mkdir(parents=True)
    a = tmp_path / "runs" / "a"
    a.mkdir(parents=True)
    (a / "checkpoints").symlink_to(big)
    _fit(a, 3, checkpoint_every=2, keep_last=1)
    before = _checkpoint_files(big)
    assert before
    b = tmp_path / "runs" / "b"
    shutil.copytree(a, b, symlinks=True)  # what `cp -r a b` does with the link
    with pytest.raises(TrainwiseError, match=r"checkpoints folder of the run folder .*a.* too .*checkpoints/ folder "
                                             r"of its own"):
        _fit(b, 5, checkpoint_every=2, keep_last=1, resume="auto")
    assert _checkpoint_files(big) == before
    c = tmp_path / "runs" / "c"
    a.rename(c)  # moved, not copied: c continues the run in the same checkpoints
    shutil.rmtree(b)
    _fit(c, 5, checkpoint_every=2, keep_last=1, resume="auto")
    assert max(_checkpoint_files(big)) > max(before)


def _snapshot(folder):
    """Every entry under ``folder`` (hidden ones too) with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize(("run_dir", "cwd"), [(".", "."), ("..", "src"), ("src/..", ".")])
@pytest.mark.parametrize("when", ["construction", "fit"])
def test_overwrite_of_the_current_folder_is_refused_before_anything_is_written(tmp_path, monkeypatch, run_dir, cwd,
                                                                                when):
    """Before (issue 48, item 10): ``Trainer(run_dir=".", overwrite=True)`` in a folder holding a run failed
    inside fit with pathlib's ``ValueError: PosixPath('.') has an empty name``, after it had taken (and left) the
    folder's lock; had it gone on, every file of the user's project would have been moved aside."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "train.py").write_text("# the user's script\n")
    (project / "src" / "model.py").write_text("# the user's model\n")
    (project / "metrics.jsonl").write_text('{"kind": "start"}\n')  # an earlier run's log, no lock file
    before = _snapshot(project)
    message = ("is the current folder, and overwrite=True would move everything in it aside" if run_dir != ".."
               else "holds the current folder, and overwrite=True would move everything in it aside")
    if when == "construction":
        monkeypatch.chdir(project / cwd)
        with pytest.raises(TrainwiseError, match=message):
            Trainer(epochs=1, run_dir=run_dir, overwrite=True)
    else:  # made elsewhere with the project's full path; fit runs after a chdir into the project
        monkeypatch.chdir(tmp_path)
        trainer = Trainer(epochs=1, batch_size=8, device="cpu", progress="off", plot=False,
                          run_dir=os.path.join(project, cwd, run_dir), overwrite=True)
        monkeypatch.chdir(project / cwd)
        data = TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
        with pytest.raises(TrainwiseError, match=message):
            trainer.fit(nn.Linear(4, 3), data)
    assert _snapshot(project) == before  # nothing moved, written or locked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # nothing moved beside it
