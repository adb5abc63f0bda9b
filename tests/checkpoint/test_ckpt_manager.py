"""CheckpointManager: the last N and the best kept, the only good checkpoint never deleted, partial files ignored."""

from __future__ import annotations

import os

import pytest
import torch

from trainwise.checkpoint import CheckpointManager, find_resume_checkpoint
from trainwise.checkpoint.manager import checkpoint_name
from trainwise.errors import TrainwiseError


def steps(manager: CheckpointManager) -> list[int]:
    return [int(p.name[len("ckpt-step"):-len(".pt")]) for p in manager.checkpoints()]


def test_keeps_last_n_and_the_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, monitor="val_loss", mode="min")
    losses = {1: 0.9, 2: 0.3, 3: 0.5, 4: 0.6, 5: 0.7}
    for step, loss in losses.items():
        manager.save({"step": step}, step=step, metric=loss)
    assert steps(manager) == [2, 4, 5]  # best (step 2) + last two
    assert manager.best.name == checkpoint_name(2)
    assert manager.latest().name == checkpoint_name(5)
    manager.save({"step": 6}, step=6, metric=0.1)  # a new best replaces the old one
    assert steps(manager) == [5, 6]
    assert manager.best.name == checkpoint_name(6)


def test_mode_max_and_no_metric(tmp_path):
    manager = CheckpointManager(tmp_path / "a", keep_last=1, monitor="acc", mode="max")
    for step, acc in enumerate([0.5, 0.9, 0.7, float("nan")], start=1):
        manager.save({}, step=step, metric=acc)
    assert steps(manager) == [2, 4]
    plain = CheckpointManager(tmp_path / "b", keep_last=1)
    for step in range(1, 4):
        plain.save({}, step=step)
    assert steps(plain) == [3] and plain.best is None


def test_best_survives_a_lost_manifest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, monitor="loss")
    manager.save({}, step=1, metric=0.1)
    manager.save({}, step=2, metric=0.5)
    (manager.folder / "manifest.json").write_text("{ corrupt")
    manager.save({}, step=3, metric=0.9)
    assert steps(manager) == [1, 3]  # the best's metric was read back from the file itself


def test_never_deletes_the_only_good_checkpoint(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save({"w": torch.ones(2)}, step=1)
    # the new checkpoint fails while being written: the old one stays, no temp file is left
    import trainwise.checkpoint.state as state_module

    def broken_save(obj, file):
        file.write(b"PK\x03\x04")
        raise OSError("No space left on device")

    monkeypatch.setattr(state_module.torch, "save", broken_save)
    with pytest.raises(OSError):
        manager.save({"w": torch.ones(2)}, step=2)
    monkeypatch.undo()
    assert steps(manager) == [1]
    assert sorted(os.listdir(manager.folder)) == ["ckpt-step000000001.pt", "manifest.json", "owner.json"]
    # a new checkpoint that does not read back as complete deletes nothing
    monkeypatch.setattr("trainwise.checkpoint.manager.is_complete", lambda path: False)
    manager.save({"w": torch.ones(2)}, step=3)
    monkeypatch.undo()
    assert steps(manager) == [1, 3]


def test_partial_and_foreign_files_are_never_checkpoints(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    good = manager.save({"step": 1}, step=1)
    data = good.read_bytes()
    # a temporary file of a writer that is still alive (this process), one of a dead writer, a truncated
    # file under a checkpoint's name (a bad copy), random bytes, and an unrelated file
    live_temp = manager.folder / f".{checkpoint_name(5)}.tmp-{os.getpid()}-0123abcd"
    dead_temp = manager.folder / f".{checkpoint_name(6)}.tmp-999999999-0123abcd"
    for temp in (live_temp, dead_temp):
        temp.write_bytes(data)
    (manager.folder / checkpoint_name(7)).write_bytes(data[: len(data) // 2])
    (manager.folder / checkpoint_name(8)).write_bytes(os.urandom(2000))
    (manager.folder / "notes.txt").write_text("hello")
    manager = CheckpointManager(tmp_path, keep_last=3)
    assert manager.latest() == good
    assert live_temp.exists() and not dead_temp.exists()  # only a dead writer's temp file is cleaned up
    found = manager.load_latest({"step": None})
    assert found is not None and found[0] == good


def test_load_latest_skips_an_unreadable_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save({"step": 1}, step=1)
    # zip directory intact but the payload is not a trainwise checkpoint: unreadable as one
    torch.save({"something": "else"}, manager.folder / checkpoint_name(2))
    state = {"step": None}
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        path, _ = manager.load_latest(state)
    assert path.name == checkpoint_name(1) and state["step"] == 1


def test_find_resume_checkpoint(tmp_path):
    assert find_resume_checkpoint(None, tmp_path) is None
    assert find_resume_checkpoint("auto", tmp_path) is None  # nothing yet: start fresh
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save({}, step=3)
    newest = manager.save({}, step=4)
    assert find_resume_checkpoint("auto", tmp_path) == newest
    assert find_resume_checkpoint(tmp_path, None) == newest
    assert find_resume_checkpoint(manager.folder, None) == newest
    assert find_resume_checkpoint(str(manager.folder / checkpoint_name(3)), None).name == checkpoint_name(3)
    with pytest.raises(TrainwiseError, match="does not exist"):
        find_resume_checkpoint(tmp_path / "nope.pt", None)
    with pytest.raises(TrainwiseError, match="no complete checkpoint"):
        find_resume_checkpoint(tmp_path / "checkpoints" / ".." / "..", None)


def test_bad_arguments(tmp_path):
    with pytest.raises(TrainwiseError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)
    with pytest.raises(TrainwiseError, match="mode"):
        CheckpointManager(tmp_path, mode="best")
    with pytest.raises(TrainwiseError, match="step"):
        CheckpointManager(tmp_path).save({}, step=-1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainwiseError, match="is a file"):
        CheckpointManager(tmp_path / "file")


def test_what_a_killed_run_left_unpruned_is_pruned_before_the_next_save_is_written(tmp_path, monkeypatch):
    """A run killed between a save and its pruning leaves more than keep_last + 1 checkpoints: the first save
    of the next run prunes them before it writes (room on a full disk), then prunes after itself as usual."""
    before = CheckpointManager(tmp_path, keep_last=5, run_id="r")
    for step in (1, 2, 3):
        before.save({"x": torch.tensor(step)}, step=step)
    manager = CheckpointManager(tmp_path, keep_last=1, run_id="r")
    seen = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: seen.append(steps(manager)) or real_save(obj, f))
    manager.save({"x": torch.tensor(4)}, step=4)
    manager.save({"x": torch.tensor(5)}, step=5)
    assert seen == [[3], [4]] and steps(manager) == [5]


def test_a_checkpoint_whose_name_claims_a_later_step_is_never_chosen_nor_pruned(tmp_path):
    """``ckpt-step000000040.pt`` holding step 4 beside steps 12 and 16: chosen by content, it would win every
    resume; it is damaged (renamed or copied over), so it is skipped with a warning and left where it is."""
    import shutil
    import warnings

    manager = CheckpointManager(tmp_path, keep_last=2, run_id="run-a")
    for step in (4, 12, 16):
        manager.save({"weights": torch.full((2,), float(step))}, step=step)
    old = tmp_path / "checkpoints" / checkpoint_name(12)
    liar = tmp_path / "checkpoints" / checkpoint_name(40)
    shutil.copyfile(old, liar)  # step 12's file under step 40's name
    fresh = CheckpointManager(tmp_path, keep_last=2, run_id="run-a")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fresh.latest().name == checkpoint_name(16)
        found = find_resume_checkpoint("auto", tmp_path)
    assert found is not None and found.name == checkpoint_name(16)
    assert any("holds step 12, not the step 40 its name says" in str(w.message) for w in caught)
    fresh.save({"weights": torch.zeros(2)}, step=20)
    fresh.save({"weights": torch.zeros(2)}, step=24)
    assert liar.exists()  # never pruned: not a checkpoint this run can vouch for
    assert steps(fresh) == [20, 24]


def test_a_manifest_that_is_a_fifo_or_a_link_is_refused_without_hanging(tmp_path):
    import signal

    manager = CheckpointManager(tmp_path / "fifo", keep_last=2, monitor="loss")
    manager.save({}, step=1, metric=1.0)
    manifest = tmp_path / "fifo" / "checkpoints" / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    linked = CheckpointManager(tmp_path / "link", keep_last=2, monitor="loss")
    linked.save({}, step=1, metric=1.0)
    (tmp_path / "link" / "checkpoints" / "manifest.json").unlink()
    (tmp_path / "link" / "checkpoints" / "manifest.json").symlink_to("/dev/zero")
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("hung on the manifest")))
    signal.alarm(20)
    try:
        for folder in ("fifo", "link"):
            again = CheckpointManager(tmp_path / folder, keep_last=2, monitor="loss")
            with pytest.raises(TrainwiseError, match="manifest"):
                again.save({}, step=2, metric=0.5)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert manifest.is_fifo()  # left as it was: not this run's file
