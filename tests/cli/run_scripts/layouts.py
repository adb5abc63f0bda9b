"""The same three mistakes in the two layouts of real scripts: `python layouts.py main` builds each model and its
optimizer inside main() (pytorch/examples, transformers' run_clm_no_trainer), `python layouts.py module` at module
level. `trainwise run` must find each at the same early step in both (tests/cli/test_cli_run.py)."""
import sys

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 30


def batches():
    torch.manual_seed(0)
    return [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(STEPS)]


def net():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def kept_graph(model, optimizer):
    """TW102: the running total keeps every step's graph."""
    total = 0
    for x, y in batches():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss
    return total.item()


def never_zeroed(model, optimizer):
    """TW105: no zero_grad(), so every step applies all the earlier gradients again."""
    for x, y in batches():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def float16(model, optimizer):
    """TW109: float16 autocast without a GradScaler."""
    for x, y in batches():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


MISTAKES = [kept_graph, never_zeroed, float16]


def main():
    for mistake in MISTAKES:
        model = net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        mistake(model, optimizer)


if sys.argv[1] == "main":
    main()
else:
    for mistake in MISTAKES:
        model = net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        mistake(model, optimizer)
print("trained")
