import torch
import torch.nn as nn


class Residual(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.InstanceNorm2d(width, affine=True, track_running_stats=True),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.InstanceNorm2d(width, affine=True, track_running_stats=True),
        )

    def forward(self, x):
        return x + self.body(x)


class Translator(nn.Module):
    def __init__(self, width=32, n_domains=4, blocks=3):
        super().__init__()
        parts = [nn.Conv2d(3 + n_domains, width, 7, padding=3, bias=False),
                 nn.InstanceNorm2d(width, affine=True, track_running_stats=True), nn.ReLU(inplace=True)]
        parts += [Residual(width) for _ in range(blocks)]
        parts += [nn.Conv2d(width, 3, 7, padding=3, bias=False), nn.Tanh()]
        self.body = nn.Sequential(*parts)

    def forward(self, x, domain):
        domain = domain.view(domain.size(0), domain.size(1), 1, 1).expand(-1, -1, x.size(2), x.size(3))
        return self.body(torch.cat([x, domain], dim=1))


class Critic(nn.Module):
    def __init__(self, size=64, width=32, n_domains=4):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 4, stride=2, padding=1), nn.LeakyReLU(0.01),
                                  nn.Conv2d(width, width * 2, 4, stride=2, padding=1), nn.LeakyReLU(0.01))
        self.realness = nn.Conv2d(width * 2, 1, 3, padding=1, bias=False)

    def forward(self, x):
        return self.realness(self.body(x))
