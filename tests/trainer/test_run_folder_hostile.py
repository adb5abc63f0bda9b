"""A hostile run folder: nothing a run writes lands outside what it owns, and a refused resume changes nothing.

Before (issue 27): a ``.trainwise.lock`` symlink to a user's file was truncated and given our pid; a
``metrics.jsonl`` symlink was appended through on resume (a dangling one created a file outside the folder);
a ``checkpoints`` symlink to another run's folder was resumed from and pruned (its files deleted); a prepared
``mlflow.json`` naming another MLflow run was logged into and its status rewritten; a refused resume
overwrote ``config.json`` and appended a ``start`` record.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import CheckpointManager, Trainer, TrainwiseError
from trainwise.run_folder import CHECKPOINTS, FILES, FOLDERS, LOCK, RUN_ID_KEY, RunFolder

VICTIM = b"a user's precious file\n" * 61  # 1,403 bytes, as in the report
KINDS = ("symlink", "dangling", "directory", "fifo")


def _fit(run_dir: Path, epochs: int = 1, **options):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))
    options = {"batch_size": 8, "plot": False, **options}
    return Trainer(epochs=epochs, device="cpu", progress="off", diagnose=False, run_dir=str(run_dir),
                   **options).fit(nn.Linear(4, 3), data)


def _hashes(root: Path) -> dict[str, str]:
    """Every file under ``root`` (symlinks as their target text), by relative path: what a run may not change."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = "special"
    return found


def _outside(tmp_path: Path, run: Path) -> set[str]:
    """The entries of ``tmp_path`` outside the run folder and the folders an overwrite moved it to."""
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
            if run not in (p, *p.parents) and not any(a.name.startswith(f"{run.name}.previous-")
                                                     for a in (p, *p.parents))}


def _plant(run: Path, name: str, kind: str, victim: Path) -> None:
    """Replace ``run/name`` with a hostile entry of ``kind``."""
    target = run / name
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "dangling":
        target.symlink_to(victim.parent / "nowhere" / "made-by-trainwise")
    elif kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(target)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One finished run, copied by each test that needs one (a fit per test would be slow)."""
    run = tmp_path_factory.mktemp("base") / "run"
    _fit(run, keep_last=1)
    return run


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM)
    return path


# names whose legitimate form is a folder: a plain directory there is fine
HOSTILE = [(name, kind) for name in (*FILES, *FOLDERS) for kind in KINDS
           if not (name in FOLDERS and kind == "directory")]


def _refused_naming(exc: TrainwiseError, run: Path, name: str) -> None:
    message = str(exc)
    assert "\n" not in message and message.endswith(".")
    if name == LOCK:
        assert f"{run / LOCK} (the run folder's lock file)" in message
    else:
        assert f"{run / name} ({name}) is " in message or "already holds a run" in message, message


@pytest.mark.parametrize(("name", "kind"), HOSTILE)
def test_a_fresh_run_refuses_a_hostile_entry_and_writes_nothing_outside(tmp_path, victim, name, kind):
    run = tmp_path / "run"
    run.mkdir()
    _plant(run, name, kind, victim)
    outside = _outside(tmp_path, run)
    with pytest.raises(TrainwiseError) as caught:
        _fit(run)
    _refused_naming(caught.value, run, name)
    assert victim.read_bytes() == VICTIM
    assert _outside(tmp_path, run) == outside


@pytest.mark.parametrize(("name", "kind"), HOSTILE)
def test_a_resume_refuses_a_hostile_entry_in_one_sentence_naming_it(tmp_path, finished_run, victim, name, kind):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    _plant(run, name, kind, victim)
    outside, before = _outside(tmp_path, run), _hashes(run)
    with pytest.raises(TrainwiseError) as caught:
        _fit(run, 2, keep_last=1, resume="auto")
    message = str(caught.value)
    assert "\n" not in message
    what = "the run folder's lock file" if name == LOCK else name
    assert f"{run / name} ({what}) is " in message
    assert victim.read_bytes() == VICTIM
    assert _outside(tmp_path, run) == outside
    assert _hashes(run) == before  # refused before anything was written


@pytest.mark.parametrize("name", [name for name in (*FILES, *FOLDERS)])
def test_overwrite_moves_a_hostile_entry_aside_without_following_it(tmp_path, finished_run, victim, name):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    _plant(run, name, "symlink", victim)
    outside = _outside(tmp_path, run)
    if name == LOCK:  # the lock is never moved: refused, naming it
        with pytest.raises(TrainwiseError, match=r"lock file\) is a symlink, not a regular file"):
            _fit(run, overwrite=True)
    else:
        _fit(run, overwrite=True, keep_last=1)
        (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.previous-")]
        assert (aside / name).is_symlink()  # moved as the link it was
    assert victim.read_bytes() == VICTIM
    assert _outside(tmp_path, run) == outside


def test_a_lock_symlink_to_a_users_file_is_never_truncated(tmp_path, victim):
    """Item 1: before, a fresh run truncated the victim to 0 bytes and wrote its pid into it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).symlink_to(victim)
    with pytest.raises(TrainwiseError) as caught:
        _fit(run)
    assert str(caught.value) == (
        f"{run / LOCK} (the run folder's lock file) is a symlink, not a regular file, so trainwise will not "
        "write it; remove it or choose another run_dir."
    )
    assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("kind", ["symlink", "dangling"])
def test_a_metrics_log_symlink_is_never_appended_through(tmp_path, finished_run, victim, kind):
    """Item 2: before, resume='auto' appended records to the victim; a dangling link made a file outside."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    _plant(run, "metrics.jsonl", kind, victim)
    with pytest.raises(TrainwiseError, match=r"metrics\.jsonl \(metrics\.jsonl\) is a symlink"):
        _fit(run, 2, resume="auto")
    assert victim.read_bytes() == VICTIM
    assert not (tmp_path / "nowhere").exists()


def test_a_dangling_metrics_log_in_a_fresh_folder_creates_nothing_outside(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (run / "metrics.jsonl").symlink_to(tmp_path / "elsewhere" / "metrics.jsonl")
    with pytest.raises(TrainwiseError):
        _fit(run, resume="auto")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_checkpoints_symlinked_to_another_runs_folder_are_neither_resumed_nor_pruned(tmp_path):
    """Item 3: before, run B resumed from run A's checkpoints, wrote into A's folder and pruned A's files."""
    a, b = tmp_path / "a", tmp_path / "b"
    _fit(a, 3, keep_last=2)
    before = _hashes(a / CHECKPOINTS)
    newest = CheckpointManager(a).latest()
    b.mkdir()
    (b / CHECKPOINTS).symlink_to(a / CHECKPOINTS)
    with pytest.raises(TrainwiseError) as caught:
        _fit(b, 5, keep_last=1, resume="auto")
    # refused before the resume reads anything: the folder's owner record names A, whose checkpoints/ it is
    assert str(caught.value).startswith(f"{b / CHECKPOINTS} is the checkpoints folder of the run folder "
                                        f"{os.path.realpath(a)} too")
    assert newest.exists()
    assert "\n" not in str(caught.value)
    assert _hashes(a / CHECKPOINTS) == before
    assert not (b / "config.json").exists() and not (b / "metrics.jsonl").exists()  # compared first


def test_pruning_deletes_only_this_runs_checkpoints(tmp_path):
    """A shared checkpoint folder: another run's files, older and newer by step, are kept."""
    other = CheckpointManager(tmp_path, keep_last=5, run_id="other")
    for step in (1, 50):
        other.save({"x": torch.tensor(step)}, step=step)
    mine = CheckpointManager(tmp_path, keep_last=1, run_id="mine")
    for step in (2, 3, 4):
        mine.save({"x": torch.tensor(step)}, step=step)
    names = sorted(p.name for p in mine.checkpoints())
    assert names == ["ckpt-step000000001.pt", "ckpt-step000000004.pt", "ckpt-step000000050.pt"]
    with pytest.raises(TrainwiseError, match="a checkpoint of another run"):
        mine.read_latest()  # the newest is another run's: refused, not resumed from


def test_a_checkpoints_folder_on_another_disk_keeps_working(tmp_path):
    """A symlinked checkpoints/ (a bigger disk) is a legitimate set-up: fit, resume and pruning all work."""
    disk, run = tmp_path / "big-disk" / "ckpts", tmp_path / "run"
    disk.mkdir(parents=True)
    run.mkdir()
    (run / CHECKPOINTS).symlink_to(disk)
    _fit(run, 2, keep_last=1)
    result = _fit(run, 4, keep_last=1, resume="auto")
    assert [r["epoch"] for r in result.history] == [1, 2, 3, 4]
    saved = sorted(p.name for p in disk.iterdir() if p.name.startswith("ckpt-"))
    assert saved == [f"ckpt-step{result.steps:09d}.pt"]
    run_id = json.loads((run / "config.json").read_text())[RUN_ID_KEY]
    assert torch.load(disk / saved[0], weights_only=True)["meta"][RUN_ID_KEY] == run_id


def test_a_resume_keeps_the_run_id(tmp_path):
    run = tmp_path / "run"
    _fit(run, 1)
    first = RunFolder(run).run_id()
    _fit(run, 2, resume="auto")
    assert first is not None and RunFolder(run).run_id() == first


def test_a_folder_from_before_run_ids_still_resumes(tmp_path):
    """Checkpoints and config.json without a run id (an older trainwise): resumed as before, documented."""
    run = tmp_path / "run"
    _fit(run, 1)
    config = json.loads((run / "config.json").read_text())
    del config[RUN_ID_KEY]
    (run / "config.json").write_text(json.dumps(config))
    for path in CheckpointManager(run).checkpoints():
        checkpoint = torch.load(path, weights_only=True)
        del checkpoint["meta"][RUN_ID_KEY]
        path.unlink()
        torch.save(checkpoint, path)
    result = _fit(run, 2, resume="auto")
    assert [r["epoch"] for r in result.history] == [1, 2]
    assert RunFolder(run).run_id() is None


@pytest.mark.parametrize("change", [{"batch_size": 4}, {"seed": 7}])
def test_a_refused_resume_leaves_every_file_byte_identical(tmp_path, finished_run, change):
    """Item 5: before, config.json was rewritten with the refused configuration and a start record appended."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    before = _hashes(run)
    with pytest.raises(TrainwiseError, match="cannot continue it exactly"):
        _fit(run, 2, keep_last=1, resume="auto", **change)
    assert _hashes(run) == before


needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="the mlflow extra is not installed")


@needs_mlflow
@pytest.mark.slow
def test_a_prepared_mlflow_json_naming_another_mlflow_run_is_never_logged_into(tmp_path, monkeypatch):
    """Item 4: before, a resume logged into the run mlflow.json named and rewrote its status and end tag."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trainwise-tests")
    client = MlflowClient(uri)
    experiment = client.create_experiment("theirs")
    theirs = client.create_run(experiment, run_name="theirs").info.run_id
    client.set_terminated(theirs, status="KILLED")
    run = tmp_path / "run"
    _fit(run, 1, loggers=["mlflow"])
    ours = json.loads((run / "mlflow.json").read_text())
    assert ours["trainwise_run_id"] == RunFolder(run).run_id()
    for prepared in ({"tracking_uri": uri, "run_id": theirs},  # no trainwise run id
                     {"tracking_uri": uri, "run_id": theirs, "trainwise_run_id": "0123456789abcdef"}):
        (run / "mlflow.json").write_text(json.dumps(prepared))
        _fit(run, 1, loggers=["mlflow"], resume="auto")
        after = client.get_run(theirs)
        assert after.info.status == "KILLED" and "trainwise.end_state" not in after.data.tags
        assert json.loads((run / "mlflow.json").read_text())["run_id"] not in (theirs, ours["run_id"])


@pytest.mark.slow
@pytest.mark.parametrize("name", [LOCK, "metrics.jsonl", "config.json"])
def test_the_cli_refuses_a_hostile_entry_with_exit_2_and_no_traceback(tmp_path, victim, name):
    run = tmp_path / "demo"
    run.mkdir()
    (run / name).symlink_to(victim)
    out = subprocess.run([sys.executable, "-m", "trainwise.cli", "demo", "--epochs", "1", "--run-dir", str(run)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert victim.read_bytes() == VICTIM


def test_a_run_does_not_read_back_whom_its_own_new_checkpoints_belong_to(tmp_path, monkeypatch):
    """Each save prunes; the file it has just written is known to be this run's without loading its meta
    again (a load per save was most of a background save's time on a small model)."""
    mine = CheckpointManager(tmp_path, keep_last=2, run_id="mine")
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    for step in range(1, 7):
        mine.save({"x": torch.tensor(step)}, step=step, background=step % 2 == 0)
    mine.wait()
    assert [p.name for p in mine.checkpoints()] == ["ckpt-step000000005.pt", "ckpt-step000000006.pt"]
    assert loads == []


def test_a_checkpoint_replaced_after_its_save_is_read_again_before_pruning(tmp_path):
    """The run remembers its own file by size and modification time: another run's file put in its place
    (same name) is read again, found not to be this run's, and kept."""
    mine = CheckpointManager(tmp_path, keep_last=1, run_id="mine")
    mine.save({"x": torch.tensor(1)}, step=1)
    other = CheckpointManager(tmp_path / "elsewhere", keep_last=1, run_id="other")
    foreign = other.save({"x": torch.tensor(1), "pad": torch.zeros(64)}, step=1)
    os.replace(foreign, mine.folder / foreign.name)
    mine.save({"x": torch.tensor(2)}, step=2)
    assert [p.name for p in mine.checkpoints()] == ["ckpt-step000000001.pt", "ckpt-step000000002.pt"]
    assert torch.load(mine.folder / "ckpt-step000000001.pt", weights_only=True)["meta"][RUN_ID_KEY] == "other"
