import torch.nn as nn

from nets.deep_trunk import deep_trunk
from nets.encoder import PlainEncoder


class SegNet(nn.Module):
    def __init__(self, n_classes=2, trunk="plain", pretrained=False):
        super().__init__()
        self.trunk_kind = trunk
        self.encoder = PlainEncoder() if trunk == "plain" else deep_trunk(pretrained)
        self.decode = nn.Sequential(nn.Upsample(scale_factor=8), nn.Conv2d(128, n_classes, 1))

    def forward(self, x):
        return self.decode(self.encoder(x)[-1])

    def freeze_encoder(self):
        for p in self.encoder.parameters():
            p.requires_grad = False

    def unfreeze_encoder(self):
        for p in self.encoder.parameters():
            p.requires_grad = True
