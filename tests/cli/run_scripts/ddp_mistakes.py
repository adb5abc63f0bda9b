"""DDP on two CPU processes (gloo), run by torchrun under `trainwise run`: TW105 on every rank, TW103 on rank 1
only (tests/distributed/test_run_torchrun.py)."""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
for _ in range(3):
    F.cross_entropy(model(x), y).backward()
    optimizer.step()  # TW105
if rank == 1:
    with torch.no_grad():
        model.module(x)  # TW103
dist.destroy_process_group()
print(f"rank {rank} done\n", end="")  # one write: unbuffered ranks sharing a pipe must not split the line
