"""Two processes on CPU with gloo, launched like a user would (torchrun), against one plain process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainwise import load_weights
from trainwise.checkpoint import CheckpointManager, read_checkpoint

HERE = Path(__file__).parent
WORKER = HERE / "dist_worker.py"
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(*args: str, timeout: float = 120) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(WORKER), *args],
                          env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _python(*args: str) -> None:
    done = subprocess.run([sys.executable, str(WORKER), *args], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One plain process with batch 2B, 3 epochs (the same script, unchanged)."""
    out = tmp_path_factory.mktemp("single")
    _python(str(out / "r.pt"), str(out / "run"), "--batch", "8", "--epochs", "3")
    return torch.load(out / "r.pt")


def test_ddp_matches_one_process_then_resumes(single: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _torchrun(str(tmp_path / "two.pt"), str(run), "--epochs", "2")
    two = torch.load(tmp_path / "two.pt")
    # same losses and exactly the same global validation accuracy (21 samples: not divisible by 2)
    for mine, ref in zip(two["history"], single["history"][:2]):
        assert mine["step"] == ref["step"]
        assert mine["val_accuracy"] == ref["val_accuracy"]
        assert mine["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-6)
        assert mine["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6)
    # the checkpoint was written once, from the unwrapped module: no "module." prefix, loads into a plain model
    latest = CheckpointManager(run).latest()
    assert latest is not None
    saved = read_checkpoint(latest)["state"]["model"]
    assert not any(key.startswith("module.") for key in saved)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    load_weights(plain, saved, strict=True)
    _same_weights(plain.state_dict(), two["weights"])
    # resume under torchrun for a third epoch: the same weights as 3 uninterrupted epochs on one process
    _torchrun(str(tmp_path / "resumed.pt"), str(run), "--epochs", "3", "--resume", "auto")
    resumed = torch.load(tmp_path / "resumed.pt")
    assert resumed["steps"] == single["steps"]
    _same_weights(resumed["weights"], single["weights"])
    assert resumed["history"][-1]["val_accuracy"] == single["history"][-1]["val_accuracy"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_killed_rank_makes_the_other_exit_within_the_timeout(tmp_path: Path) -> None:
    """Plain processes with torchrun's variables (no agent to clean up): the survivor must exit by itself."""
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / "k.pt"), str(tmp_path / "run"),
                                       "--mode", "kill"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    procs[1].wait(timeout=60)
    died = time.monotonic()
    assert procs[1].returncode == -9
    try:
        procs[0].wait(timeout=5.0 + 25)  # dist_timeout=5 s in the worker, plus a margin for a slow machine
    except subprocess.TimeoutExpired:
        procs[0].kill()
        pytest.fail("rank 0 still hangs after its peer died")
    assert procs[0].returncode != 0
    assert time.monotonic() - died < 30


def test_fsdp_shards_train_like_one_process_and_convert_to_one_file(single: dict, tmp_path: Path) -> None:
    """FSDP2 fully_shard runs on CPU with gloo in this torch; the sharded checkpoint converts to one file."""
    from trainwise.distributed import sharded_to_single_file

    run = tmp_path / "run"
    _torchrun(str(tmp_path / "fsdp2.pt"), str(run), "--mode", "fsdp", "--epochs", "2")
    # sharded folders without their checkpoint file: one this run's (a kill between its shards and its file),
    # one another run's, one that names no run: only this run's is removed by its next save
    run_id = json.loads((run / "config.json").read_text())["run_id"]
    for step, owner in ((7, run_id), (8, "0123456789abcdef"), (9, None)):
        left = run / "checkpoints" / f"sharded-step{step:09d}"
        left.mkdir()
        (left / "__0_0.distcp").write_bytes(b"shards")
        if owner is not None:
            (left / ".trainwise-run.json").write_text(json.dumps({"run_id": owner, "step": step}))
    # resume the sharded run for a third epoch: model and optimizer from the shards, the rest from the file
    _torchrun(str(tmp_path / "fsdp.pt"), str(run), "--mode", "fsdp", "--epochs", "3", "--resume", "auto")
    left = sorted(p.name for p in (run / "checkpoints").glob("sharded-step00000000[789]"))
    assert left == ["sharded-step000000008", "sharded-step000000009"]  # before: this run's stayed too
    for name in left:
        shutil.rmtree(run / "checkpoints" / name)
    fsdp = torch.load(tmp_path / "fsdp.pt")
    assert fsdp["steps"] == single["steps"] and len(fsdp["history"]) == 3
    assert fsdp["history"][-1]["val_accuracy"] == single["history"][-1]["val_accuracy"]
    folders = sorted((run / "checkpoints").glob("sharded-step*"))
    kept = sorted(p.name for p in (run / "checkpoints").glob("ckpt-step*.pt"))
    assert [f.name.removeprefix("sharded-") for f in folders] == [k[5:-3] for k in kept]  # pruned together
    state = sharded_to_single_file(folders[-1], tmp_path / "model.pt")
    plain = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    load_weights(plain, str(tmp_path / "model.pt"), strict=True)
    _same_weights(plain.state_dict(), single["weights"])
    assert state.keys() == single["weights"].keys()


def test_fsdp_refuses_a_symlinked_shard_folder_without_writing_through_it(tmp_path: Path) -> None:
    """Every process writes its shards into checkpoints/sharded-stepN: a symlink planted there (to a folder of
    someone else's) is refused on every process in one sentence; nothing lands in the folder it points to."""
    run, victim = tmp_path / "run", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    _torchrun(str(tmp_path / "one.pt"), str(run), "--mode", "fsdp", "--epochs", "1")  # steps 1-2
    (run / "checkpoints" / "sharded-step000000004").symlink_to(victim)  # where epoch 2's shards would go
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(WORKER),
                           str(tmp_path / "two.pt"), str(run), "--mode", "fsdp", "--epochs", "2", "--resume", "auto"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "sharded-step000000004 (a sharded checkpoint's folder) is a symlink" in done.stdout + done.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
