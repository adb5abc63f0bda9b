import torch
import torch.nn as nn

from check import validation
from reader import TextReader


def train(cfg, device, train_loader, val_loader, codec):
    model = TextReader(cfg)
    if cfg.start_from:
        stored = torch.load(cfg.start_from)  # expect: TW301
        if cfg.new_head:
            model.head = nn.Linear(model.width, len(stored["module.head.weight"]))
        model = torch.nn.DataParallel(model).to(device)
        if cfg.finetune:
            model.load_state_dict(stored, strict=False)  # expect: TW302
        else:
            model.load_state_dict(stored)
    loss_fn = nn.CTCLoss(zero_infinity=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for step, (images, targets, target_len) in enumerate(train_loader):
        model.train()
        preds = model(images.to(device), None).log_softmax(2).permute(1, 0, 2)
        pred_len = torch.full((images.size(0),), preds.size(0), dtype=torch.int32)
        loss = loss_fn(preds, targets, pred_len, target_len)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % cfg.val_every == 0:
            model.eval()
            with torch.no_grad():
                print(validation(model, loss_fn, val_loader, codec, cfg, device))
