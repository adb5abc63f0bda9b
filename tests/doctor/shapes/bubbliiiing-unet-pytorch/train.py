from functools import partial

import numpy as np
import torch
import torch.backends.cudnn as cudnn
from torch.utils.data import DataLoader

from nets.segnet import SegNet
from utils.fit import run_epoch
from utils.helpers import fix_seeds, seed_worker

if __name__ == "__main__":
    seed, rank = 7, 0
    workers = 4
    freeze_epochs, total_epochs = 10, 40
    weights_path = "logs/segnet_start.pth"
    fix_seeds(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = SegNet(n_classes=2).train()
    if weights_path:
        own = net.state_dict()
        stored = torch.load(weights_path, map_location=device)  # expect: TW301
        fitting = {k: v for k, v in stored.items() if k in own and np.shape(own[k]) == np.shape(v)}
        own.update(fitting)
        net.load_state_dict(own)
    net_train = torch.nn.DataParallel(net)
    cudnn.benchmark = True  # expect: TW202
    net_train = net_train.cuda()
    net.freeze_encoder()
    opt = torch.optim.Adam(net.parameters(), 1e-4)
    train_set = [(torch.rand(3, 64, 64), torch.zeros(64, 64, dtype=torch.long)) for _ in range(32)]
    val_set = train_set[:8]
    train_loader = DataLoader(train_set, batch_size=4, shuffle=True, num_workers=workers,
                              worker_init_fn=partial(seed_worker, rank=rank, seed=seed))
    val_loader = DataLoader(val_set, batch_size=4, shuffle=True, num_workers=workers,
                            worker_init_fn=partial(seed_worker, rank=rank, seed=seed))  # latent: TW201
    pixel_loss = torch.nn.CrossEntropyLoss()
    for epoch in range(total_epochs):
        if epoch == freeze_epochs:
            net.unfreeze_encoder()
        run_epoch(net_train, net, opt, train_loader, val_loader, pixel_loss, f"logs/ep{epoch:03d}.pth")  # silent: TW108
