import torch
import torch.nn as nn


class CrossStageTrunk(nn.Module):
    def __init__(self, widths):
        super().__init__()
        blocks, c_in = [], 3
        for c_out in widths:
            blocks += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.BatchNorm2d(c_out), nn.Mish()]
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        return self.blocks(x)


def cross_stage_trunk(pretrained):
    trunk = CrossStageTrunk([32, 64, 128, 256])
    if pretrained:
        trunk.load_state_dict(torch.load("weights/trunk_start.pth"))  # expect: TW301
    return trunk
