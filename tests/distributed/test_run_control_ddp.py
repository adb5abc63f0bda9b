"""RunControl in a hand-written loop under 2 gloo processes (issue 47): a preemption signal to one rank or to both
rides the accumulator's count all-reduce (its one generic slot; the accumulator holds no stop state) and every
rank stops after the same step, the one after the window that carried it; a rank that got no signal names
none. The primitives alone, as a user would compose them (the Trainer's own run: test_preemption_ddp.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent('''
    import json, os, signal, sys
    import torch
    import torch.distributed as dist
    from trainwise import GradientAccumulator
    from trainwise.checkpoint.resume import LoopCounters
    from trainwise.interrupts import Preempted
    from trainwise.run_control import RunControl

    rank, signalled = int(os.environ["RANK"]), sys.argv[1].split(",")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    accumulator = GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1), distributed=True)
    control = RunControl(LoopCounters(), preempt=("SIGUSR1",), distributed=True)
    control.share(accumulator)
    steps, seen = 0, {"steps": None}
    try:
        with control, control.training():
            for _ in range(20):
                accumulator.backward(model(torch.randn(4, 4)).pow(2).mean(), count=4)
                accumulator.step()
                steps += 1
                if steps == 3 and str(rank) in signalled:
                    os.kill(os.getpid(), signal.SIGUSR1)
                if control.asked and (stop := control.at_step()) is not None:
                    raise stop.error(f"preempted at step {steps}")
    except Preempted as exc:
        seen = {"steps": steps, "signal": exc.signal}
    dist.destroy_process_group()
    print(json.dumps(seen))
''')


def _port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.parametrize("ranks", ["1", "0,1"])
def test_a_preemption_to_one_rank_or_both_stops_both_after_the_same_step(tmp_path, ranks):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port, procs = _port(), []
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    for rank in (0, 1):
        env = {**base, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, str(script), ranks], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    done = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], done[0][1][-3000:] + done[1][1][-3000:]
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in done]
    # the signal after step 3 rides step 4's all-reduce, which step 5 reads: both stop after step 5
    assert [s["steps"] for s in seen] == [5, 5]
    assert [s["signal"] for s in seen] == [
        "SIGUSR1" if str(rank) in ranks.split(",") else "a signal to another process" for rank in (0, 1)]
