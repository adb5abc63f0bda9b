import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from segkit.models.utils import PoolingPyramid
from segkit.utils import drop_parallel_prefix


def validate_checkpoint(cfg, val_set):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    val_dl = DataLoader(val_set, batch_size=cfg.batch, num_workers=4)
    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), PoolingPyramid(64, (1, 2, 4)), nn.Conv2d(112, cfg.classes, 1))
    weights = drop_parallel_prefix(torch.load(cfg.weights)["net"])  # expect: TW301
    net.load_state_dict(weights)  # silent: TW302
    net.eval()
    net.to(device)
    hits = []
    for pics, masks in val_dl:
        pics = pics.to(device)
        if cfg.mirror:
            scores = net(pics)  # expect: TW104
            mirrored = net(torch.flip(pics, dims=[3]))
            scores = (scores + torch.flip(mirrored, dims=[3])) / 2
        else:
            scores = net(pics)
        pred = scores.argmax(1).cpu().numpy()
        hits.append(np.mean(pred == masks.numpy()))
    return float(np.mean(hits))
