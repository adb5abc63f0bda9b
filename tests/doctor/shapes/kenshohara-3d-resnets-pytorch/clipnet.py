import torch
from torch import nn


def build_clip_net(depth):
    layers = [nn.Conv3d(3, 16, 3, padding=1), nn.BatchNorm3d(16), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Conv3d(16, 16, 3, padding=1), nn.BatchNorm3d(16), nn.ReLU()]
    layers += [nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 400)]
    return nn.Sequential(*layers)


def load_kinetics_weights(net, weights_file, num_labels):
    saved = torch.load(weights_file, map_location="cpu")  # expect: TW301
    net.load_state_dict(saved["weights"])
    net[-1] = nn.Linear(net[-1].in_features, num_labels)
    return net
