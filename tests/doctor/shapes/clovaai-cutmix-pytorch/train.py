import numpy as np
import torch
import torch.nn as nn

from nets import SmallResNet


def patch_mix(images, labels, alpha=1.0):
    share = np.random.beta(alpha, alpha)
    order = torch.randperm(images.size(0))
    side = int(images.size(2) * np.sqrt(1 - share))
    images[:, :, :side, :side] = images[order, :, :side, :side]
    return images, labels, labels[order], 1 - side * side / (images.size(2) * images.size(3))


def fit(train_loader, net, loss_fn, opt):
    net.train()
    for images, labels in train_loader:
        images, first, second, share = patch_mix(images.cuda(), labels.cuda())
        logits = net(images)
        loss = share * loss_fn(logits, first) + (1 - share) * loss_fn(logits, second)
        opt.zero_grad()  # silent: TW105
        loss.backward()
        opt.step()


def validate(val_loader, net, loss_fn):
    net.eval()
    wrong, seen = 0, 0
    for images, labels in val_loader:
        logits = net(images.cuda())  # expect: TW104
        wrong += (logits.argmax(1) != labels.cuda()).sum().item()
        seen += labels.size(0)
    return wrong / seen


def main(train_loader, val_loader, epochs=300):
    net = torch.nn.DataParallel(SmallResNet()).cuda()
    loss_fn = nn.CrossEntropyLoss().cuda()
    opt = torch.optim.SGD(net.parameters(), 0.1, momentum=0.9, nesterov=True)
    for epoch in range(epochs):
        fit(train_loader, net, loss_fn, opt)
        error = validate(val_loader, net, loss_fn)
        torch.save({"epoch": epoch, "weights": net.state_dict(), "error": error}, "runs/last.pth")
