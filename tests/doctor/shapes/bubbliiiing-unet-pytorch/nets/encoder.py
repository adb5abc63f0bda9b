import torch.nn as nn


def plain_stage(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))


class PlainEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([plain_stage(3, 32), plain_stage(32, 64), plain_stage(64, 128)])

    def forward(self, x):
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats
