"""A hand-written training loop built from trainwise primitives, for the exact-resume test.

    python resume_loop.py OUT --workers 2                      # uninterrupted: writes OUT/final.pt
    python resume_loop.py OUT --workers 2 --kill-after-step 6  # SIGKILLs itself one micro-batch later
    python resume_loop.py OUT --workers 2 --resume             # continues from OUT's newest checkpoint
    python resume_loop.py OUT2 --resume-from OUT/checkpoints/ckpt-step000000004.pt   # from a given file

Dropout, AdamW, a step scheduler, accumulation over 2 micro-batches with a short last window, a shuffled
loader: everything that must continue exactly after a resume.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from trainwise import GradientAccumulator, seed_everything
from trainwise.checkpoint import CheckpointManager, load_checkpoint
from trainwise.data import ResumableLoader, seeded_loader

EPOCHS = 3
SAMPLES = 52  # 7 batches of 8 (the last has 4): windows of 2, 2, 2, 1 -> 4 optimizer steps per epoch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-after-step", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--keep", type=int, default=2, help="checkpoints kept (keep_last)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    seed_everything(0, deterministic=True)
    data = torch.Generator().manual_seed(123)
    dataset = TensorDataset(torch.randn(SAMPLES, 10, generator=data), torch.randint(0, 3, (SAMPLES,), generator=data))
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 3)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    accumulator = GradientAccumulator(optimizer, steps=2, scheduler=scheduler)
    loader = ResumableLoader(seeded_loader(dataset, batch_size=8, seed=0, num_workers=args.workers))
    manager = CheckpointManager(args.out, keep_last=args.keep)
    state = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "accumulator": accumulator,
        "loader": loader,
        "epoch": 0,
        "step": 0,
    }
    if args.resume:
        found = manager.load_latest(state)
        assert found is not None, "nothing to resume from"
        print(f"resumed from {found[0].name} at epoch {state['epoch']}, batch {loader.resume_offset}")
    elif args.resume_from:
        load_checkpoint(args.resume_from, state)
        print(f"resumed from {os.path.basename(args.resume_from)} at epoch {state['epoch']}, "
              f"batch {loader.resume_offset}")

    kill_countdown = None
    for epoch in range(state["epoch"], EPOCHS):
        state["epoch"] = epoch
        model.train()
        last_index = len(loader) - 1
        for index, (x, y) in enumerate(loader, start=loader.resume_offset):
            if kill_countdown is not None:
                os.kill(os.getpid(), signal.SIGKILL)  # work done after the checkpoint is lost
            loss = F.cross_entropy(model(x), y)
            accumulator.backward(loss, count=len(y))
            if accumulator.window_full or index == last_index:
                accumulator.step()
                state["step"] += 1
                manager.save(state, step=state["step"])  # at the step boundary: RNG, loader position
                if state["step"] == args.kill_after_step:
                    kill_countdown = 1
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(args.out, "final.pt"))
    print(f"done after {state['step']} steps")


if __name__ == "__main__":
    main()
