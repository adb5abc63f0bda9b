"""Preemption and a dead rank with 2 gloo processes, started with torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR...) as plain processes so that each one's exit code is seen (torchrun's agent would SIGTERM the
other worker once one exits). A SIGTERM to one rank or to both: the ranks agree on the step through the
window's count all-reduce (no collective of its own), rank 0 writes one checkpoint there, both exit 143, and
the resumed run ends bitwise equal to an uninterrupted one. Before, SIGTERM ended the rank at once (-15) and
the other one with gloo's traceback. Under torch.distributed.run itself, a SIGTERM to the launcher (how a
cluster stops a job) is forwarded to both workers, with the same outcome. A rank that dies: the survivor says
so in one line, within the timeout."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from trainwise.checkpoint import CheckpointManager, read_checkpoint

HERE = Path(__file__).parent
WORKER = HERE / "preempt_worker.py"
pytestmark = pytest.mark.slow


def _port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _launch(command: list[str], *, cwd: Path | None = None, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    port, procs = _port(), []
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    for rank in (0, 1):
        env = {**base, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _worker(out: Path, run_dir: Path, *args: str) -> list[subprocess.CompletedProcess]:
    return _launch([sys.executable, str(WORKER), str(out), str(run_dir), *args])


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(CheckpointManager(run_dir).latest())["state"]["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    folder = tmp_path_factory.mktemp("full")
    done = _worker(folder / "out", folder / "run")
    assert [d.returncode for d in done] == [0, 0], done[0].stderr[-3000:] + done[1].stderr[-3000:]
    assert json.loads((folder / "out.0.json").read_text())["steps"] == 12
    assert [json.loads((folder / f"out.{rank}.json").read_text())["wrappers_alive"] for rank in (0, 1)] == [0, 0]
    return _weights(folder / "run")


@pytest.mark.parametrize("ranks", ["1", "0,1"])
def test_sigterm_to_one_rank_or_both_stops_both_at_one_step_and_resumes_bitwise(uninterrupted, tmp_path, ranks):
    run = tmp_path / "run"
    done = _worker(tmp_path / "out", run, "--signal-ranks", ranks, "--signal-step", "3")
    assert [d.returncode for d in done] == [143, 143], done[0].stderr[-3000:] + done[1].stderr[-3000:]
    seen = [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in (0, 1)]
    # the flag set after step 3 rides step 4's all-reduce, which step 5 reads: both ranks stop after step 5
    assert [s["steps"] for s in seen] == [5, 5] and {s["stopped"] for s in seen} == {"preempted"}
    assert all(s["handler_restored"] for s in seen)
    assert [s["wrappers_alive"] for s in seen] == [0, 0]  # the process group really goes before exit
    assert CheckpointManager(run).latest().name == "ckpt-step000000005.pt"  # one checkpoint, rank 0's
    end = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert end["kind"] == "end" and end["status"] == "preempted" and end["step"] == 5
    resumed = _worker(tmp_path / "resumed", run, "--resume", "auto")
    assert [d.returncode for d in resumed] == [0, 0], resumed[0].stderr[-3000:]
    assert json.loads((tmp_path / "resumed.0.json").read_text())["steps"] == 12
    weights = _weights(run)
    assert weights.keys() == uninterrupted.keys()
    for key in weights:
        assert torch.equal(weights[key], uninterrupted[key]), key


def test_sigterm_to_torchrun_reaches_both_workers_which_stop_at_one_step_and_resume_bitwise(uninterrupted, tmp_path):
    # how a cluster stops a job: SIGTERM to the launcher (torch.distributed.run), whose agent forwards it to
    # every worker and waits for them before it kills them
    run, ready = tmp_path / "run", tmp_path / "ready"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", _port(),
         str(WORKER), str(tmp_path / "out"), str(run), "--signal-step", "3", "--ready-file", str(ready)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not ready.exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), launcher.communicate(timeout=30)[1][-3000:]
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=90)
    assert launcher.returncode != 0  # the job was stopped, not completed
    seen = [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in (0, 1)]
    assert {s["stopped"] for s in seen} == {"preempted"}, err[-3000:]
    steps = {s["steps"] for s in seen}
    assert len(steps) == 1 and 3 <= steps.pop() < 12  # one step, agreed by both
    assert [s["wrappers_alive"] for s in seen] == [0, 0]
    latest = CheckpointManager(run).latest()
    assert latest.name == f"ckpt-step{seen[0]['steps']:09d}.pt"
    resumed = _worker(tmp_path / "resumed", run, "--resume", "auto")
    assert [d.returncode for d in resumed] == [0, 0], resumed[0].stderr[-3000:]
    weights = _weights(run)
    for key in uninterrupted:
        assert torch.equal(weights[key], uninterrupted[key]), key


FACTORIES = textwrap.dedent('''
    import os
    import torch
    from torch.utils.data import TensorDataset


    class DiesAt(torch.nn.Module):
        """Rank 1 ends its process (os._exit(1), no clean-up) at its 7th training forward, mid-epoch 2."""

        def __init__(self):
            super().__init__()
            self.inner, self.calls = torch.nn.Linear(6, 2), 0

        def forward(self, x):
            self.calls += self.training
            if os.environ.get("RANK") == "1" and self.calls == 7 and self.training:
                os._exit(1)
            return self.inner(x)


    def make_model():
        return DiesAt()


    def make_data():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(48, 6, generator=g)
        return TensorDataset(x, (x[:, 0] > 0).long())
''')

CONFIG = textwrap.dedent('''
    [model]
    factory = "factories:make_model"

    [data]
    factory = "factories:make_data"

    [trainer]
    epochs = 3
    batch_size = 4
    device = "cpu"
    progress = "off"
    plot = false
    dist_timeout = 5.0
    run_dir = "{run_dir}"
''')


def test_a_dead_rank_is_one_sentence_from_the_survivor_within_the_timeout(tmp_path):
    (tmp_path / "factories.py").write_text(FACTORIES)
    (tmp_path / "fit.toml").write_text(CONFIG.format(run_dir=tmp_path / "run"))
    cli = Path(sys.executable).with_name("trainwise")
    started = time.monotonic()
    done = _launch([str(cli), "fit", "fit.toml"], cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 5.0 + 40  # dist_timeout, plus start-up on a slow machine
    assert done[1].returncode == 1
    survivor = done[0]
    assert survivor.returncode == 2, survivor.stderr[-3000:]
    lines = survivor.stderr.strip().splitlines()
    assert len(lines) == 1, survivor.stderr[-3000:]  # before: 28 lines ending in gloo's Connection reset by peer
    assert lines[0].startswith("trainwise fit: error: process 1 of 2 died")
    # 6 steps an epoch for each rank: epoch 1's checkpoint is the latest good one
    assert f"the latest good checkpoint is {tmp_path / 'run' / 'checkpoints' / 'ckpt-step000000006.pt'}" in lines[0]


DIES_BEFORE_THE_LOOP = textwrap.dedent('''
    import os
    import torch
    from torch.utils.data import Dataset


    class Samples(Dataset):
        """With TW_TEST_DIE=1, rank 1 ends its process at its first sample read: while fit starts (the run's
        facts read the first and last samples), before any collective of the loop."""

        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(48, 6, generator=g)
            self.y = (self.x[:, 0] > 0).long()

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            if os.environ.get("TW_TEST_DIE") == "1" and os.environ.get("RANK") == "1":
                os._exit(1)
            return self.x[i], self.y[i]


    def make_model():
        return torch.nn.Linear(6, 2)


    def make_data():
        return Samples()
''')


def test_a_rank_that_dies_before_the_loop_is_one_sentence_naming_the_checkpoint(tmp_path, monkeypatch):
    """Before: a peer lost while the run started (the run folder's and the resume's broadcasts) gave gloo's
    traceback; only the loop's collectives were turned into the one sentence."""
    (tmp_path / "factories.py").write_text(DIES_BEFORE_THE_LOOP)
    (tmp_path / "fit.toml").write_text(CONFIG.format(run_dir=tmp_path / "run").replace("epochs = 3", "epochs = 1"))
    cli = Path(sys.executable).with_name("trainwise")
    first = _launch([str(cli), "fit", "fit.toml"], cwd=tmp_path, timeout=60)
    assert [d.returncode for d in first] == [0, 0], first[0].stderr[-3000:] + first[1].stderr[-3000:]
    monkeypatch.setenv("TW_TEST_DIE", "1")
    done = _launch([str(cli), "fit", "fit.toml", "resume=auto"], cwd=tmp_path, timeout=60)
    assert done[1].returncode == 1
    survivor = done[0]
    assert survivor.returncode == 2, survivor.stderr[-3000:]
    lines = survivor.stderr.strip().splitlines()
    assert len(lines) == 1, survivor.stderr[-3000:]
    assert lines[0].startswith("trainwise fit: error: process 1 of 2 died"), lines[0]
    assert f"the latest good checkpoint is {tmp_path / 'run' / 'checkpoints' / 'ckpt-step000000006.pt'}" in lines[0]
