from functools import partial

import torch
import torch.backends.cudnn as cudnn
from torch.utils.data import DataLoader

from nets.detector import GridDetector
from utils.common import init_worker, make_repeatable
from utils.fit import one_epoch

if __name__ == "__main__":
    seed, rank = 3, 0
    workers = 4
    freeze_backbone, freeze_epochs, total_epochs = True, 50, 300
    start_file = "weights/detector_start.pth"
    make_repeatable(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    det = GridDetector(n_anchors=3, n_classes=20)
    if start_file:
        own = det.state_dict()
        stored = torch.load(start_file, map_location=device)  # expect: TW301
        own.update({k: v for k, v in stored.items() if k in own and own[k].shape == v.shape})
        det.load_state_dict(own)
    det_train = torch.nn.DataParallel(det.train())
    cudnn.benchmark = True  # expect: TW202
    det_train = det_train.cuda()
    if freeze_backbone:
        for p in det.backbone.parameters():
            p.requires_grad = False
    opt = torch.optim.SGD(det.parameters(), lr=1e-2, momentum=0.937)
    samples = [(torch.rand(3, 128, 128), torch.zeros(2, 5)) for _ in range(64)]
    train_loader = DataLoader(samples, batch_size=8, shuffle=True, num_workers=workers,
                              worker_init_fn=partial(init_worker, rank=rank, seed=seed))
    val_loader = DataLoader(samples[:16], batch_size=8, shuffle=True, num_workers=workers,
                            worker_init_fn=partial(init_worker, rank=rank, seed=seed))  # latent: TW201
    grid_loss = torch.nn.SmoothL1Loss()
    unfrozen = False
    for epoch in range(total_epochs):
        if epoch >= freeze_epochs and not unfrozen and freeze_backbone:
            for p in det.backbone.parameters():
                p.requires_grad = True
            unfrozen = True
        one_epoch(det_train, det, grid_loss, opt, train_loader, val_loader, f"logs/ep{epoch:03d}.pth")  # silent: TW108
