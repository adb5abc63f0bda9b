import numpy as np
import torch
import torch.nn as nn


def grid_sincos(width, side):
    pos = np.arange(side * side, dtype=np.float64)[:, None]
    freq = 1.0 / 10000 ** (np.arange(width // 2, dtype=np.float64) / (width // 2))
    return np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1)


class VideoViT(nn.Module):
    def __init__(self, width=192, side=14):
        super().__init__()
        self.side = side
        self.pos_embed = nn.Parameter(torch.zeros(1, side * side, width), requires_grad=False)
        self.fill_pos_embed(self.pos_embed.data)

    def fill_pos_embed(self, pos_embed):
        table = grid_sincos(pos_embed.size(-1), self.side)
        pos_embed.copy_(torch.from_numpy(table).float().unsqueeze(0))  # silent: TW116
