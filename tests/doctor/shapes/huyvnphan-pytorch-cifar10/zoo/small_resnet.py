import os

import torch
import torch.nn as nn


class TinyResNet(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x):
        return self.fc(self.stem(x).mean(dim=(2, 3)))


def tiny_resnet(pretrained=False, device="cpu"):
    net = TinyResNet()
    if pretrained:
        here = os.path.dirname(__file__)
        weights = torch.load(  # expect: TW301
            os.path.join(here, "weights", "tiny_resnet.pt"), map_location=device
        )
        net.load_state_dict(weights)
    return net
