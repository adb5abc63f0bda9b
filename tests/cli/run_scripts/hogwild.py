"""pytorch/examples' mnist_hogwild, made small and with the spawn start method (macOS's and Windows' default,
and CUDA's requirement): the model is evaluated once, shared, and trained by a worker process."""
import sys

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def train(rank, model):
    torch.manual_seed(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        optimizer.zero_grad()
        F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        optimizer.step()


def test(model, x):
    model.eval()
    with torch.no_grad():
        return model(x).sum().item()


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(16, 4)
    model = Net()
    before = test(model, x)
    model.share_memory()
    processes = []
    for rank in range(int(sys.argv[1])):
        p = mp.get_context("spawn").Process(target=train, args=(rank, model))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print("workers", [p.exitcode for p in processes], "trained", test(model, x) != before)
