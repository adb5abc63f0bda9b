import matplotlib.pyplot as plt
import torch
import torch.utils.data as tud
from torch import nn

xs = torch.linspace(-3, 3, 400).unsqueeze(1)
ys = xs.pow(3) + 0.3 * torch.randn_like(xs)
probe_x, probe_y = xs[::10], ys[::10]
batches = tud.DataLoader(tud.TensorDataset(xs, ys), batch_size=32, shuffle=True)


class Stack(nn.Module):
    def __init__(self, normalize: bool, depth: int = 4):
        super().__init__()
        self.normalize = normalize
        self.hidden = nn.ModuleList(nn.Linear(1 if i == 0 else 16, 16) for i in range(depth))
        self.norms = nn.ModuleList(nn.BatchNorm1d(16) for _ in range(depth if normalize else 0))
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        activations = []
        for i, layer in enumerate(self.hidden):
            x = layer(x)
            if self.normalize:
                x = self.norms[i](x)
            x = torch.tanh(x)
            activations.append(x)
        return self.out(x), activations


pair = [Stack(False), Stack(True)]
optims = [torch.optim.Adam(m.parameters(), lr=0.02) for m in pair]
mse = nn.MSELoss()

if __name__ == "__main__":
    history = [[], []]
    for epoch in range(8):
        snapshots, finals = [], []
        for m, h in zip(pair, history):
            m.eval()
            guess, acts = m(probe_x)
            h.append(mse(guess, probe_y).item())
            snapshots.append(acts)  # silent: TW102
            finals.append(guess)  # silent: TW102
            m.train()
        plt.hist([a[-1].detach().numpy().ravel() for a in snapshots], bins=20)
        plt.pause(0.1)
        for bx, by in batches:
            for m, opt in zip(pair, optims):
                guess, _ = m(bx)
                loss = mse(guess, by)
                opt.zero_grad()
                loss.backward()
                opt.step()
