import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from segkit.models.utils import PoolingPyramid


def fit(cfg, train_set, val_set):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_dl = DataLoader(train_set, batch_size=cfg.batch, shuffle=True, num_workers=2)
    val_dl = DataLoader(val_set, batch_size=cfg.batch, num_workers=2)
    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), PoolingPyramid(64, (1, 2, 4)), nn.Conv2d(112, cfg.classes, 1))
    net = nn.DataParallel(net.to(device))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    step = 0
    if cfg.resume and os.path.isfile(cfg.resume):
        saved = torch.load(cfg.resume)  # expect: TW301
        net.load_state_dict(saved["net"])  # silent: TW302
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
    seg_loss = nn.CrossEntropyLoss()
    while step < cfg.steps:
        for pics, masks in train_dl:
            step += 1
            net.train()
            opt.zero_grad()
            loss = seg_loss(net(pics.to(device)), masks.to(device))
            loss.backward()
            opt.step()
            if step % cfg.check_every == 0:
                net.eval()
                total = 0.0
                with torch.no_grad():
                    for v_pics, v_masks in val_dl:
                        scores = net(v_pics.to(device))  # silent: TW104
                        total += seg_loss(scores, v_masks.to(device)).item()
                torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step}, "seg_best.pt")
