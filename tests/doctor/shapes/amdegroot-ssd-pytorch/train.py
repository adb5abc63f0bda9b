import argparse

import torch
from torch.utils.data import DataLoader

from detector import make_det_net

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default="")
cli.add_argument("--trunk_file", default="trunk.pth")
opts = cli.parse_args()


def train(dataset, box_loss, steps=1000):
    det_net = make_det_net()
    if opts.resume:
        det_net.restore(opts.resume)
    else:
        trunk_state = torch.load(opts.trunk_file)  # expect: TW301
        det_net.trunk.load_state_dict(trunk_state)
    sgd = torch.optim.SGD(det_net.parameters(), lr=1e-3, momentum=0.9)
    det_net.train()
    where_sum, what_sum = 0.0, 0.0
    batches = iter(DataLoader(dataset, batch_size=16, shuffle=True))
    for step in range(steps):
        images, targets = next(batches)
        pred = det_net(images)
        sgd.zero_grad()  # silent: TW105
        where_loss, what_loss = box_loss(pred, targets)
        (where_loss + what_loss).backward()
        sgd.step()
        where_sum += where_loss.item()  # silent: TW102
        what_sum += what_loss.item()
    torch.save(det_net.state_dict(), "det_net.pth")
