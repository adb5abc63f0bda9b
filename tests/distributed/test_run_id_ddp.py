"""Under several processes every process holds the run id rank 0 recorded in config.json: a new one for a
fresh run, the folder's own for a resume (rank 0 decides, the others receive it), and a resume refused on rank 0
(another run's newest checkpoint in checkpoints/) is refused on every process with the same sentence."""

from __future__ import annotations

import gc
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

from trainwise import CheckpointManager, Trainer, TrainwiseError
from trainwise.run_folder import RUN_ID_KEY
from trainwise.runlog import open_run

pytestmark = pytest.mark.slow


def _worker(rank: int, port: int, run_dir: str, out: str, foreign: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    seen: dict[str, object] = {}
    try:
        for resume in (None, "auto"):  # a fresh run, then its resume
            _, lock, log = open_run(run_dir, {"lr": 0.1}, resume=resume)
            seen[str(resume)] = log.run_id
            log.close()
            lock.release()
            dist.barrier()
        if rank == 0:  # another run's newer checkpoint appears in this run's checkpoints/
            (Path(run_dir) / "checkpoints").mkdir()
            os.link(foreign, Path(run_dir) / "checkpoints" / Path(foreign).name)
        dist.barrier()
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g))
        try:
            Trainer(epochs=1, batch_size=4, run_dir=run_dir, resume="auto", progress="off", plot=False,
                    diagnose=False, device="cpu", dist_timeout=60).fit(torch.nn.Linear(4, 2), data)
            seen["foreign"] = "trained"
        except TrainwiseError as exc:
            seen["foreign"] = str(exc)
        Path(f"{out}.{rank}").write_text(json.dumps(seen))
        gc.collect()  # a DDP wrapper in a reference cycle goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_every_process_holds_rank_0s_run_id_and_refuses_another_runs_checkpoint_together(tmp_path):
    run_dir = tmp_path / "run"
    other = CheckpointManager(tmp_path / "other", run_id="0123456789abcdef")  # another run's checkpoint
    other.save({"model": torch.nn.Linear(4, 2)}, step=99)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = str(tmp_path / "seen")
    mp.spawn(_worker, args=(port, str(run_dir), out, str(other.latest())), nprocs=2, join=True)
    seen = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]
    recorded = json.loads((run_dir / "config.json").read_text())[RUN_ID_KEY]
    assert seen[0]["None"] == seen[1]["None"] == recorded and len(recorded) == 16
    assert seen[0]["auto"] == seen[1]["auto"] == recorded  # a resume keeps the folder's id on every process
    assert seen[0]["foreign"] == seen[1]["foreign"]
    assert "a checkpoint of another run (run id 0123456789abcdef" in seen[0]["foreign"]
