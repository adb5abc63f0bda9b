import torch
import torch.nn as nn
from torch.optim import Adam

dev = "cuda" if torch.cuda.is_available() else "cpu"


class LocalLayer(nn.Linear):
    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out)
        self.opt = Adam(self.parameters(), lr=0.03)
        self.margin = 2.0

    def forward(self, x):
        return torch.relu(super().forward(x / (x.norm(dim=1, keepdim=True) + 1e-4)))


class LocalNet(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.blocks = []  # expect: TW114
        for a, b in zip(widths[:-1], widths[1:]):
            self.blocks = self.blocks + [LocalLayer(a, b).to(dev)]

    def score(self, x):
        h, total = x, 0
        for block in self.blocks:
            h = block(h)
            total = total + h.pow(2).mean(1)
        return total


if __name__ == "__main__":
    net = LocalNet([784, 256, 256])
    print(net.score(torch.rand(8, 784, device=dev)))
    torch.save(net.state_dict(), "local_net.pt")
