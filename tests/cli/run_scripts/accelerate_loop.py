"""Accelerate's documented loop on the CPU, with the running total keeping every step's graph: `trainwise run`
must report TW102 at this script's `optimizer.step()` (marked), not inside accelerate's optimizer wrapper, and
pair it with the doctor's TW102 at `total += loss` (tests/cli/test_cli_run.py)."""
import torch
from accelerate import Accelerator
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
total = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    accelerator.backward(loss)
    optimizer.step()  # TW102
    total += loss
print("trained")
