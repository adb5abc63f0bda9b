import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvNormAct(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())

    def forward(self, x):
        return self.body(x)


class PoolingPyramid(nn.Module):
    def __init__(self, channels, grid_sizes):
        super().__init__()
        self.branches = []  # silent: TW114
        for _ in grid_sizes:
            self.branches.append(ConvNormAct(channels, channels // len(grid_sizes)))
        self.branch_modules = nn.ModuleList(self.branches)
        self.grid_sizes = grid_sizes

    def forward(self, x):
        h, w = x.shape[2:]
        parts = [x]
        for branch, grid in zip(self.branch_modules, self.grid_sizes):
            pooled = F.adaptive_avg_pool2d(x, grid)
            parts.append(F.interpolate(branch(pooled), size=(h, w), mode="bilinear", align_corners=False))
        return torch.cat(parts, dim=1)
