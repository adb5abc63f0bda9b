"""Kill -9 at random moments during saves: the newest complete checkpoint always loads, no partial file counts.

A forked child saves checkpoints in a loop and tells the parent when each save starts; the parent SIGKILLs
it a random moment later (within about one save's duration), so most kills land inside torch.save, the
fsync, the rename, the pruning or the manifest write. After every kill, every checkpoint the manager lists
must load with weights_only and hold exactly what was saved under that step.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import pytest
import torch

from trainwise.checkpoint import CheckpointManager, load_checkpoint
from trainwise.files import is_temp_file

TRIALS = 24
DEADLINE_S = 50
PAYLOAD = 1_000_000  # float32 elements: a 4 MB checkpoint, so a save takes a few milliseconds or more


def _metric(step: int) -> float:
    """The monitored metric (mode "min") saved with ``step``: 2 * step mod 13, so the best so far is step 1 (2.0),
    from step 7 on step 7 (1.0), from step 13 on step 13 (0.0) for good (a tie keeps the earlier step)."""
    return float((step * 7919) % 13)


def _step(path) -> int:
    return int(path.name[len("ckpt-step"):-len(".pt")])


def _saver(folder: str, conn) -> None:  # runs in the forked child until it is killed
    torch.set_num_threads(1)  # no OpenMP pool after fork
    manager = CheckpointManager(folder, keep_last=2, monitor="loss")
    latest = manager.latest()
    step = _step(latest) if latest else 0
    while True:
        step += 1
        payload = torch.full((PAYLOAD,), float(step))
        conn.send(step)
        manager.save({"payload": payload, "step": step}, step=step, metric=_metric(step))


def _check_folder(manager: CheckpointManager) -> int:
    names = sorted(p.name for p in manager.folder.iterdir())
    listed = manager.checkpoints()
    assert all(not is_temp_file(p) for p in listed)
    assert len(listed) <= 3 + 1  # keep_last=2 plus the best, plus one not yet pruned when killed
    for path in listed:
        state = {"payload": None, "step": None}
        load_checkpoint(path, state, rng=False)
        step = _step(path)
        assert state["step"] == step, names
        assert torch.equal(state["payload"], torch.full((PAYLOAD,), float(step))), names
    return _step(listed[-1]) if listed else 0


@pytest.mark.slow
def test_kill_9_during_saves_never_loses_the_newest_complete_checkpoint(tmp_path):
    context = multiprocessing.get_context("fork")
    rng = random.Random(1234)
    folder = tmp_path / "run"
    started = time.monotonic()
    newest_seen = 0
    leftovers = 0
    trials = 0
    while trials < TRIALS and time.monotonic() - started < DEADLINE_S:
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_saver, args=(str(folder), send), daemon=True)
        child.start()
        send.close()
        try:
            for _ in range(rng.randint(1, 3)):  # let a few saves start
                assert receive.poll(30), "the saving process did not start a save"
                receive.recv()
            time.sleep(rng.uniform(0.0, 0.03))  # then kill somewhere inside (or just after) a save
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
            receive.close()
        assert child.exitcode == -signal.SIGKILL
        trials += 1
        leftovers += any(is_temp_file(p) for p in (folder / "checkpoints").iterdir())
        manager = CheckpointManager(folder, keep_last=2, monitor="loss")  # removes the dead child's temp files
        newest = _check_folder(manager)
        assert newest >= newest_seen  # a later run never ends up with an older newest checkpoint
        newest_seen = newest
        # Every step up to the newest was saved complete once (a child resumes after the newest on disk), and
        # pruning never deletes the best: so the best of steps 1..newest is still on disk and is manager.best.
        best = manager.best
        if newest == 0:
            assert best is None  # killed inside the very first save: no checkpoint yet
        else:
            expected = min(range(1, newest + 1), key=lambda step: (_metric(step), step))
            assert best is not None and _step(best) == expected, (expected, best, manager.checkpoints())
    assert trials >= 20, f"only {trials} trials within {DEADLINE_S} s"
    assert newest_seen > 0
    print(f"{trials} kills, {leftovers} left a temporary file behind (a kill inside a write)")
