import torch
from torch import nn
from torchvision.models import vgg11

from model.two_stage import TwoStageDetector


def plain_parts(weights_file=""):
    base = vgg11(weights=None)
    if weights_file:
        base.load_state_dict(torch.load(weights_file))  # expect: TW301
    layers = list(base.features)[:20]
    for layer in layers[:6]:
        for p in layer.parameters():
            p.requires_grad = False  # silent: TW108
    head = nn.Sequential(nn.LazyLinear(256), nn.ReLU(), nn.Linear(256, 25))
    return nn.Sequential(*layers), head


def plain_detector(weights_file=""):
    trunk, head = plain_parts(weights_file)
    return TwoStageDetector(trunk, head)
