import torch
import torch.nn as nn

from networks import ContrastEncoder


def build(cfg):
    encoder = ContrastEncoder(cfg.arch)
    head = nn.Linear(encoder.width, cfg.n_classes)
    stored = torch.load(cfg.encoder_file, map_location="cpu")  # expect: TW301
    encoder.load_state_dict(stored["encoder"])
    return encoder, head, nn.CrossEntropyLoss()


def fit_head(loader, encoder, head, loss_fn, optimizer):
    encoder.eval()
    head.train()
    for images, labels in loader:
        with torch.no_grad():
            feats = encoder.body(images.cuda(non_blocking=True))
        loss = loss_fn(head(feats.detach()), labels.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def validate(loader, encoder, head):
    encoder.eval()
    head.eval()
    right = 0
    with torch.no_grad():
        for images, labels in loader:
            right += (head(encoder.body(images)).argmax(1) == labels).sum().item()
    return right / len(loader.dataset)


def main(cfg, train_loader, val_loader):
    encoder, head, loss_fn = build(cfg)
    optimizer = torch.optim.SGD(head.parameters(), lr=cfg.lr, momentum=0.9)
    best = 0.0
    for epoch in range(1, cfg.epochs + 1):  # silent: TW103
        fit_head(train_loader, encoder, head, loss_fn, optimizer)
        best = max(best, validate(val_loader, encoder, head))
    print(f"best {best:.3f}")
