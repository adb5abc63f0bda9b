"""Each mistake the runtime guards catch, in plain loops, one model each: `trainwise run` must report every one
with its code at the line marked `# TWxxx` (tests/cli/test_cli_run.py). Kept tiny: a few steps on 8 samples."""
import gc
import os

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))


def net(*extra):
    return nn.Sequential(nn.Linear(4, 8), *extra, nn.ReLU(), nn.Linear(8, 2))


# TW102: a running total keeps every step's graph
model = net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0
for _ in range(5):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()  # TW102
    total += loss

# TW103: evaluated under no_grad with dropout in train mode
model = net(nn.Dropout(0.5))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(2):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
with torch.no_grad():
    accuracy = (model(x).argmax(1) == y).float().mean()  # TW103

# TW104: evaluated in eval mode with autograd on, never backpropagated
model = net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    model.train()
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    model.eval()
    val_loss = F.cross_entropy(model(x), y).item()  # TW104

# TW105: gradients never zeroed
model = net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    F.cross_entropy(model(x), y).backward()
    optimizer.step()  # TW105

# TW108: a frozen BatchNorm left in train mode
model = net(nn.BatchNorm1d(8))
model[1].requires_grad_(False)
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
for _ in range(3):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()  # TW108
    optimizer.step()

# TW109: float16 autocast without a GradScaler
model = net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(2):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()  # TW109

# TW113: a non-finite gradient
model = net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(2):
    optimizer.zero_grad()
    (model(x).sum() * float("inf")).backward()
    optimizer.step()  # TW113
del model, optimizer
gc.collect()  # the model dropped, and freed, before its guard's interval check: still reported, at its line


# TW114: submodules in a plain list
class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 2)
        self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]

    def forward(self, x):
        for block in self.blocks:
            x = block(x).relu()
        return self.head(x)


model = Blocks()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(2):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()  # TW114
    optimizer.step()
os.makedirs("out", exist_ok=True)
os.chdir("out")  # a script may change folder: the report still lands, and names paths, from where it started
print("trained")
