"""The doctor finds TW102 twice: in an older loop kept in a function the script never calls, and in the top-level
loop that runs. The run's TW102 (at the marked `optimizer.step()`) must confirm the top-level one; the function's
stays "static, not seen at run time" (tests/cli/test_cli_run.py)."""
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))


def train_old(model, optimizer, epochs):
    """An older loop, left in the file, never called."""
    total = 0
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss  # static only
    return total


model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0
for _ in range(5):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()  # TW102
    total += loss  # confirmed
print("trained")
