import argparse
import os

import torch
import torch.nn as nn

from nets import SmallResNet

cli = argparse.ArgumentParser()
cli.add_argument("--weights", default="runs/last.pth")
opts = cli.parse_args()


def validate(val_loader, net, loss_fn):
    net.eval()
    wrong, total_loss = 0, 0.0
    for images, labels in val_loader:
        labels = labels.cuda()
        logits = net(images)  # expect: TW104
        total_loss += loss_fn(logits, labels).item()
        wrong += (logits.argmax(1) != labels).sum().item()
    return wrong / len(val_loader.dataset), total_loss / len(val_loader)


def main(val_loader):
    net = torch.nn.DataParallel(SmallResNet()).cuda()
    if not os.path.isfile(opts.weights):
        raise FileNotFoundError(opts.weights)
    stored = torch.load(opts.weights)  # expect: TW301
    net.load_state_dict(stored["weights"])  # silent: TW302
    print(validate(val_loader, net, nn.CrossEntropyLoss().cuda()))
