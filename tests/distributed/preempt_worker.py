"""The training script of tests/distributed/test_preemption_ddp.py: 2 processes with gloo, a callback that sends
a preemption signal to its own process after a chosen step on chosen ranks; each rank writes what fit returned.

    RANK=0 WORLD_SIZE=2 ... python preempt_worker.py OUT_PREFIX RUN_DIR --signal-ranks 1 --signal-step 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainwise import Preempted, Trainer


def data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator)
    return TensorDataset(x, (x[:, 0] + 0.5 * x[:, 1] > 0).long())


def wrappers_alive() -> int:
    """DDP wrappers still alive: one that outlives the process group into interpreter exit aborts gloo
    ("terminate called without an active exception", exit -6 instead of 143), as CI saw once."""
    gc.collect()
    return sum(isinstance(o, torch.nn.parallel.DistributedDataParallel) for o in gc.get_objects())


class SignalAfterStep:
    """Sends ``name`` to this process at ``on_step_end`` of ``step``: a scheduler's SIGTERM at a known point."""

    def __init__(self, step: int, name: str) -> None:
        self.step, self.name = step, name

    def on_step_end(self, state) -> None:
        if state.step == self.step:
            os.kill(os.getpid(), getattr(signal, self.name))


class ReadyAfterStep:
    """Writes ``path`` at ``on_step_end`` of ``step`` and then slows every step, so that a signal sent from
    outside (to torchrun's agent, which forwards it) arrives while the run trains."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_step_end(self, state) -> None:
        if state.step == self.step:
            with open(self.path, "w") as handle:
                handle.write("ready")
        if state.step >= self.step:
            time.sleep(0.3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("run_dir")
    parser.add_argument("--signal-ranks", default="")  # "0", "1" or "0,1"
    parser.add_argument("--signal-step", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--ready-file", default="")  # rank 0 writes it after --signal-step, then steps slowly
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    signalled = args.signal_step and str(rank) in args.signal_ranks.split(",")
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    trainer = Trainer(
        epochs=3, batch_size=4, accumulation_steps=2, device="cpu", precision="fp32", progress="off", plot=False,
        diagnose=False, run_dir=args.run_dir, resume=args.resume, dist_timeout=20.0, seed=0,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.2),
        callbacks=[SignalAfterStep(args.signal_step, "SIGTERM")] if signalled and not args.ready_file
        else [ReadyAfterStep(args.signal_step, args.ready_file)] if args.ready_file and rank == 0 else [],
    )
    # 64 samples: 32 a rank, 8 batches of 4, 4 optimizer steps an epoch
    loader = DataLoader(data(64, 0), batch_size=4, shuffle=False)
    outcome: dict = {"rank": rank}
    try:
        result = trainer.fit(net, loader, data(20, 1))
    except Preempted as exc:
        outcome.update(stopped=exc.result.stopped, steps=exc.result.steps, signal=exc.signal,
                       handler_restored=signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
                       wrappers_alive=wrappers_alive())  # while the exception's frames still hold the run
        with open(f"{args.out}.{rank}.json", "w") as handle:
            json.dump(outcome, handle)
        raise
    outcome.update(stopped=result.stopped, steps=result.steps, wrappers_alive=wrappers_alive())
    with open(f"{args.out}.{rank}.json", "w") as handle:
        json.dump(outcome, handle)


if __name__ == "__main__":
    main()
