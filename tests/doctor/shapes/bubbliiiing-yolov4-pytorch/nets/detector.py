import torch.nn as nn

from nets.backbone import cross_stage_trunk


class GridDetector(nn.Module):
    def __init__(self, n_anchors, n_classes, pretrained=False):
        super().__init__()
        self.backbone = cross_stage_trunk(pretrained)
        self.head = nn.Conv2d(256, n_anchors * (5 + n_classes), 1)

    def forward(self, x):
        return [self.head(self.backbone(x))]
