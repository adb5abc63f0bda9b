import os

import torch
from torch import nn
from torch.nn import functional as F
from torchvision import models


class Upscaler(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.head = nn.Conv2d(3, width, 3, padding=1)
        self.up = nn.Sequential(nn.Conv2d(width, 3 * 4, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, x):
        return self.up(F.relu(self.head(x)))


class PerceptualLoss(nn.Module):
    def __init__(self, weights_file: str | None, depth: int = 16):
        super().__init__()
        backbone = models.vgg16_bn()
        if weights_file and os.path.exists(weights_file):
            saved = torch.load(weights_file, map_location="cpu")  # expect: TW301
            backbone.load_state_dict(saved.get("weights", saved))
        self.features = backbone.features[:depth]
        for weight in self.features.parameters():
            weight.requires_grad = False  # silent: TW108
        self.features.eval()

    def forward(self, produced, target):
        return F.mse_loss(self.features(produced), self.features(target))
