import argparse
import random

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn


def train(cfg, device):
    reader = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(37))
    reader = torch.nn.DataParallel(reader).to(device)
    reader.train()
    if cfg.start_from:
        if cfg.finetune:
            reader.load_state_dict(torch.load(cfg.start_from), strict=False)  # expect: TW302  # expect: TW301
        else:
            reader.load_state_dict(torch.load(cfg.start_from))  # expect: TW301
    return reader


if __name__ == "__main__":
    cli = argparse.ArgumentParser()
    cli.add_argument("--start_from", default="")
    cli.add_argument("--finetune", action="store_true")
    cli.add_argument("--seed", type=int, default=1111)
    cfg = cli.parse_args()
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    cudnn.benchmark = True
    cudnn.deterministic = True  # expect: TW202
    train(cfg, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
