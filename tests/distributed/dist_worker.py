"""One training script for the distributed tests: run it with plain python or under torchrun, unchanged.

    python dist_worker.py OUT RUN_DIR --mode train --epochs 2
    torchrun --standalone --nproc-per-node 2 dist_worker.py OUT RUN_DIR --mode train --epochs 2
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainwise import Trainer

PER_PROCESS_BATCH = 4


def data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return TensorDataset(x, y)


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


class KillAt(torch.nn.Module):
    """Kills its own process (SIGKILL, no cleanup) at the given forward call on the given rank."""

    def __init__(self, inner: torch.nn.Module, *, rank: int, call: int) -> None:
        super().__init__()
        self.inner, self.rank, self.call, self.calls = inner, rank, call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if int(os.environ.get("RANK", "0")) == self.rank and self.calls == self.call:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("run_dir")
    parser.add_argument("--mode", default="ddp", choices=["ddp", "fsdp", "kill"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=PER_PROCESS_BATCH)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    net = model()
    if args.mode == "kill":
        net = KillAt(net, rank=1, call=3)
    train = DataLoader(data(30, 0), batch_size=args.batch, shuffle=False)  # shuffle=False: comparable order
    trainer = Trainer(
        # under FSDP, eval batches of 5 give the two processes 3 and 2 validation batches (11 and 10 samples):
        # the shorter shard must pad its forwards, or FSDP's per-forward all-gather would hang
        epochs=args.epochs, batch_size=args.batch, eval_batch_size=5 if args.mode == "fsdp" else 4,
        accumulation_steps=2, device="cpu",
        precision="fp32", progress="off", plot=False, diagnose=False, log_every=1, run_dir=args.run_dir,
        resume=args.resume, distributed="fsdp" if args.mode == "fsdp" else "auto", dist_timeout=5.0,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5), patience=5,
    )
    result = trainer.fit(net, train, data(21, 1))  # 21 validation samples: odd, not divisible by 2
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        from trainwise import unwrap_model

        weights = {}
        if args.mode != "fsdp":
            weights = {k: v.detach().clone() for k, v in unwrap_model(net).state_dict().items()}
        torch.save({"history": result.history, "weights": weights, "steps": result.steps}, args.out)


if __name__ == "__main__":
    main()
