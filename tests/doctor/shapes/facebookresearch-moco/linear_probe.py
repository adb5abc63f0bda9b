import os

import torch
import torch.nn as nn
import torchvision.models as models


def probe_training(cfg, train_loader, val_loader):
    model = models.__dict__[cfg.arch]()
    for name, p in model.named_parameters():
        if name not in ("fc.weight", "fc.bias"):
            p.requires_grad = False
    nn.init.normal_(model.fc.weight, std=0.01)
    nn.init.zeros_(model.fc.bias)
    if cfg.pretrained and os.path.isfile(cfg.pretrained):
        stored = torch.load(cfg.pretrained, map_location="cpu")["state_dict"]  # expect: TW301
        kept = {k.removeprefix("query_encoder."): v for k, v in stored.items()
                if k.startswith("query_encoder.") and not k.startswith("query_encoder.fc")}
        outcome = model.load_state_dict(kept, strict=False)  # silent: TW302
        assert set(outcome.missing_keys) == {"fc.weight", "fc.bias"}
    loss_fn = nn.CrossEntropyLoss()
    head_params = list(filter(lambda p: p.requires_grad, model.parameters()))  # silent: TW107
    assert len(head_params) == 2
    optimizer = torch.optim.SGD(head_params, cfg.lr, momentum=0.9)
    for epoch in range(cfg.epochs):  # silent: TW103
        probe_epoch(train_loader, model, loss_fn, optimizer)
        print(epoch, validate(val_loader, model))


def probe_epoch(train_loader, model, loss_fn, optimizer):
    model.eval()  # silent: TW108
    for images, labels in train_loader:
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(val_loader, model):
    model.eval()
    right = 0
    with torch.no_grad():
        for images, labels in val_loader:
            right += (model(images).argmax(1) == labels).sum().item()
    return right / len(val_loader.dataset)
