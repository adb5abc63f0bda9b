import argparse
import glob
import os
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

cli = argparse.ArgumentParser()
cli.add_argument("--seed", type=int, default=5)
cli.add_argument("--epochs", type=int, default=500)
cli.add_argument("--patience", type=int, default=50)
cli.add_argument("--quick", action="store_true")
opts = cli.parse_args()
random.seed(opts.seed)
np.random.seed(opts.seed)
torch.manual_seed(opts.seed)


class NeighbourMix(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, links):
        return F.log_softmax(links @ self.proj(self.drop(x)), dim=1)


n_nodes = 300
node_x = torch.rand(n_nodes, 16)
links = torch.eye(n_nodes)
node_y = torch.randint(0, 4, (n_nodes,))
fit_ids, check_ids, final_ids = torch.arange(0, 200), torch.arange(200, 250), torch.arange(250, 300)
model = NeighbourMix(16, 4)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


def hit_rate(out, y):
    return (out.argmax(1) == y).float().mean()


def train(epoch):
    model.train()
    optimizer.zero_grad()
    out = model(node_x, links)
    fit_loss = F.nll_loss(out[fit_ids], node_y[fit_ids])
    fit_loss.backward()
    optimizer.step()
    if not opts.quick:
        model.eval()
        out = model(node_x, links)  # expect: TW104
    check_loss = F.nll_loss(out[check_ids], node_y[check_ids])
    check_acc = hit_rate(out[check_ids], node_y[check_ids])
    print(f"epoch {epoch} check loss {check_loss.item():.4f} acc {check_acc.item():.3f}")
    return check_loss.item()


def run_test():
    model.eval()
    out = model(node_x, links)  # expect: TW104
    final_acc = hit_rate(out[final_ids], node_y[final_ids])
    print(f"final acc {final_acc.item():.3f}")


history, best, best_epoch, waited = [], float("inf"), 0, 0
for epoch in range(opts.epochs):
    history.append(train(epoch))  # silent: TW102
    torch.save(model.state_dict(), f"{epoch}.ckpt")
    if history[-1] < best:
        best, best_epoch, waited = history[-1], epoch, 0
    else:
        waited += 1
    if waited == opts.patience:
        break
for old in glob.glob("*.ckpt"):
    if int(old.split(".")[0]) != best_epoch:
        os.remove(old)
model.load_state_dict(torch.load(f"{best_epoch}.ckpt"))  # expect: TW301
run_test()
