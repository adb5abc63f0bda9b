import torch.nn as nn
from torch.hub import load_state_dict_from_url


class DeepTrunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3)
        self.bn1 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, 1000)


def deep_trunk(pretrained=False):
    trunk = DeepTrunk()
    if pretrained:
        trunk.load_state_dict(load_state_dict_from_url("https://example.org/trunk/deep_trunk_v1.pth"), strict=False)  # latent: TW302
    del trunk.fc
    return trunk
