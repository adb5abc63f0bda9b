"""More than one machine: two torchrun agents on this host as two "nodes" (c10d rendezvous, one process each,
gloo on CPU) against one agent with two processes, running the same script unchanged.

This file is also that script: torchrun runs it as ``test_multinode.py OUT RUN_DIR --seed S``. Besides training
it records, for the test only, what each process saw (its torchrun variables, the indices the data set served
it, the files it wrote under the run folder) in ``OUT/rank-R.json``; rank 0 saves the final weights in
``OUT/weights.pt``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import torch
from dist_worker import data, model  # the data and model of the other distributed tests
from test_ddp import _env, _free_port
from torch.utils.data import Dataset

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve()
TRAIN, VAL = 32, 16  # both divisible by the world size (2) and by batch x world size: no ragged shard
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CHANGES = ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.truncate", "shutil.rmtree")


# -- the training script (run by torchrun) ---------------------------------------------------------------------


class Recorded(Dataset):
    """A data set that remembers which indices it served in this process, in order."""

    def __init__(self, inner: Dataset) -> None:
        self.inner, self.served, self.group = inner, [], None

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        import torch.distributed as dist

        self.served.append(int(index))
        if dist.is_initialized():
            self.group = [dist.get_rank(), dist.get_world_size()]
        return self.inner[index]


def _watch_writes(run_dir: Path) -> list[list[str]]:
    """Every file this process creates, opens for writing, renames or deletes under ``run_dir`` (audit hook)."""
    root, seen = os.path.abspath(run_dir), []

    def inside(path: object) -> str | None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None  # a file descriptor
        full = os.path.abspath(os.fsdecode(path))
        return os.path.relpath(full, root) if full == root or full.startswith(root + os.sep) else None

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[2], int) and args[2] & WRITE_FLAGS:
            paths = args[:1]
        elif event in CHANGES:
            paths = args[:2] if event in ("os.rename", "os.replace") else args[:1]
        else:
            return
        for path in paths:
            rel = inside(path)
            if rel is not None:
                seen.append([event, rel])

    sys.addaudithook(hook)
    return seen


def main() -> None:
    from trainwise import Trainer, unwrap_model
    from trainwise.distributed import local_device

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("run_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out, run_dir = Path(args.out), Path(args.run_dir)
    writes = _watch_writes(run_dir)
    net = model()
    train, val = Recorded(data(TRAIN, 0)), Recorded(data(VAL, 1))
    trainer = Trainer(
        epochs=2, batch_size=4, device="cpu", precision="fp32", distributed="auto", dist_timeout=30.0,
        seed=args.seed, deterministic=True, checkpoints=True, run_dir=str(run_dir),
        progress="off", plot=False, diagnose=False, log_every=1,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
    )
    trainer.fit(net, train, val)
    rank = int(os.environ.get("RANK", "0"))
    record = {
        "env": {name: os.environ.get(name) for name in TORCHRUN_ENV},
        "group": train.group,  # (rank, world size) of the process group while training
        "cuda_device": str(local_device(torch.device("cuda"))),  # the device trainwise picks on a GPU machine
        "train": train.served,
        "val": val.served,
        "writes": writes,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in unwrap_model(net).state_dict().items()}, out / "weights.pt")


# -- the test ----------------------------------------------------------------------------------------------------


def _launch(commands: list[list[str]], timeout: float = 120) -> tuple[list[int | None], str]:
    """Start every torchrun agent and wait for all; once one fails or ``timeout`` passes, stop the others."""
    env = {**_env(), "CUDA_VISIBLE_DEVICES": ""}
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in commands]
        procs = [subprocess.Popen(c, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
                 for c, log in zip(commands, logs)]
        deadline, note = time.monotonic() + timeout, ""
        try:
            while any(p.poll() is None for p in procs):
                if any(p.returncode not in (None, 0) for p in procs):
                    note = "\n[an agent failed: the others were stopped]"
                    break
                if time.monotonic() > deadline:
                    note = f"\n[stopped after {timeout} s]"
                    break
                time.sleep(0.1)
        finally:
            for proc in procs:  # SIGTERM: an agent then stops its workers (they run in their own sessions)
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        text = note
        for i, (proc, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            text += f"\n--- agent {i}: exit {proc.returncode} ---\n{log.read()[-4000:]}"
    return [p.returncode for p in procs], text


def _torchrun(*options: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *options, "--max-restarts", "0"]


def _run(kind: str, out: Path, seed: int = 0) -> dict:
    """``kind``: "two-nodes" (two agents, one process each) or "one-node" (one agent, two processes)."""
    out.mkdir()
    script = [str(SCRIPT), str(out), str(out / "run"), "--seed", str(seed)]
    for attempt in range(2):  # a second try only if the rendezvous port was taken meanwhile
        if kind == "one-node":
            commands = [_torchrun("--standalone", "--nproc-per-node", "2") + script]
        else:
            endpoint, run_id = f"localhost:{_free_port()}", uuid.uuid4().hex
            # --node-rank is what users pass; c10d ignores it (with a warning) and orders the nodes itself.
            # On one host both agents would try to host the rendezvous store: is_host says which one does.
            # --local-addr: the address rank 0's agent gives its workers as MASTER_ADDR (no DNS needed).
            commands = [
                _torchrun("--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                          "--rdzv-conf", f"is_host={int(node == 0)}", "--local-addr", "127.0.0.1") + script
                for node in (0, 1)
            ]
        codes, output = _launch(commands)
        collided = "address already in use" in output.lower() or "EADDRINUSE" in output
        if all(code == 0 for code in codes) or not collided or attempt == 1:
            break
        shutil.rmtree(out)  # the retry starts from an empty folder
        out.mkdir()
    assert all(code == 0 for code in codes), f"{kind}: torchrun failed:{output}"
    ranks = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)}
    return {"ranks": ranks, "weights": torch.load(out / "weights.pt"), "run": out / "run", "output": output}


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run("one-node", tmp_path_factory.mktemp("multinode") / "one-node")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run("two-nodes", tmp_path_factory.mktemp("multinode") / "two-nodes")


def test_two_agents_make_one_group_with_local_rank_0_on_each(two_nodes: dict) -> None:
    for rank, seen in two_nodes["ranks"].items():
        env = seen["env"]
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and seen["group"] == [rank, 2]
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"  # one process per "node"
        assert seen["cuda_device"] == "cuda:0"  # the device index follows LOCAL_RANK, not RANK
    assert {seen["env"]["GROUP_RANK"] for seen in two_nodes["ranks"].values()} == {"0", "1"}  # two nodes


def test_same_weights_as_one_node_with_two_processes(two_nodes: dict, one_node: dict) -> None:
    # torch.equal, not allclose: the same two ranks run the same arithmetic on the same shards, and the
    # gradient all-reduce of two operands is a + b on both layouts, so the result is bitwise the same
    a, b = two_nodes["weights"], one_node["weights"]
    assert a.keys() == b.keys()
    assert all(torch.equal(a[key], b[key]) for key in a), {k: (a[k] - b[k]).abs().max().item() for k in a}


def test_data_sharded_by_global_rank(two_nodes: dict, one_node: dict) -> None:
    # each rank first reads the first and the last sample once for the resume fingerprint (run facts)
    assert all(seen["train"][:2] == [0, TRAIN - 1] for seen in two_nodes["ranks"].values())
    served = {rank: seen["train"][2:] for rank, seen in two_nodes["ranks"].items()}
    per_epoch = TRAIN // 2
    assert [len(s) for s in served.values()] == [2 * per_epoch] * 2  # 2 epochs, nothing fetched twice
    for epoch in range(2):
        shards = [set(s[epoch * per_epoch:(epoch + 1) * per_epoch]) for s in served.values()]
        assert len(shards[0]) == len(shards[1]) == per_epoch
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(TRAIN))  # disjoint, complete
    for rank in (0, 1):  # the same shard, in the same order, as the same global rank on one node
        assert served[rank] == one_node["ranks"][rank]["train"][2:]
        assert two_nodes["ranks"][rank]["val"] == one_node["ranks"][rank]["val"]
    vals = [set(seen["val"]) for seen in two_nodes["ranks"].values()]
    assert not vals[0] & vals[1] and vals[0] | vals[1] == set(range(VAL))


def test_run_folder_written_once_by_global_rank_0(two_nodes: dict) -> None:
    run = two_nodes["run"]
    files = {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}
    assert {"metrics.jsonl", "config.json"} <= files
    # one set of checkpoints: one per epoch (4 optimizer steps each), no duplicate, nothing half-written
    assert sorted(p.name for p in (run / "checkpoints").glob("ckpt-*")) == [
        "ckpt-step000000004.pt", "ckpt-step000000008.pt"]
    assert not [f for f in files if ".tmp" in f]
    log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in log].count("start") == 1  # one writer of the log
    assert [r["epoch"] for r in log if r["kind"] == "epoch"] == [1, 2]
    # global rank 1 created, wrote, renamed or deleted nothing there; every file in it comes from rank 0
    assert two_nodes["ranks"][1]["writes"] == []
    assert files <= {rel for _, rel in two_nodes["ranks"][0]["writes"]}


if __name__ == "__main__":
    main()
