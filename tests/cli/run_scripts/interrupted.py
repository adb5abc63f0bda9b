"""A training loop stopped by Ctrl-C (the test sends SIGINT once it says "training"): under `trainwise run` the
process must die of SIGINT as under python, after the script's atexit handlers and trainwise's report
(tests/cli/test_cli_run.py). The loop is bounded, so that a lost signal fails the test instead of hanging it."""
import atexit
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

atexit.register(print, "atexit: saved", flush=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
deadline = time.monotonic() + 60
for step in range(1_000_000):
    F.cross_entropy(model(x), y).backward()
    optimizer.step()  # TW105
    if step == 5:  # TW105 was found at step 1
        print("training", flush=True)
    if time.monotonic() > deadline:
        sys.exit("no SIGINT came within 60 s")
    time.sleep(0.001)
