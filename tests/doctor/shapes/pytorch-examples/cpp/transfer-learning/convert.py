import torch
from torchvision import models

backbone = models.resnet34(weights=models.ResNet34_Weights.DEFAULT)
for weight in backbone.parameters():
    weight.requires_grad = False

trunk = torch.nn.Sequential(*list(backbone.children())[:-1])
sample = torch.rand(2, 3, 160, 160)
traced = torch.jit.trace(trunk, sample)  # expect: TW117
traced.save("trunk_traced.pt")
