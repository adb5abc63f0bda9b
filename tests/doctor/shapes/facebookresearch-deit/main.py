import numpy as np
import timm
import torch
import torch.backends.cudnn as cudnn

from engine import evaluate, train_one_epoch


def main(cfg, train_loader, val_loader, teacher_loss):
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    cudnn.benchmark = True  # silent: TW202
    model = timm.create_model(cfg.arch, pretrained=False, num_classes=cfg.n_classes)
    if cfg.finetune:
        stored = torch.load(cfg.finetune, map_location="cpu")["model"]  # expect: TW301
        own = model.state_dict()
        for key in ("head.weight", "head.bias"):
            if key in stored and stored[key].shape != own[key].shape:
                del stored[key]
        model.load_state_dict(stored, strict=False)  # expect: TW302
    if cfg.attention_only:
        for name, p in model.named_parameters():
            if ".attn." in name:
                p.requires_grad = True
            else:
                p.requires_grad = False  # silent: TW108
        model.head.weight.requires_grad = True
        model.head.bias.requires_grad = True
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr)
    if cfg.teacher:
        teacher = timm.create_model(cfg.teacher_arch, num_classes=cfg.n_classes)
        teacher.load_state_dict(torch.load(cfg.teacher, map_location="cpu")["model"])  # expect: TW301
        teacher.to(device).eval()
    if cfg.resume:
        stored = torch.load(cfg.resume, map_location="cpu")  # expect: TW301
        model.load_state_dict(stored["model"])
        optimizer.load_state_dict(stored["optimizer"])
    for epoch in range(cfg.epochs):
        train_one_epoch(model, teacher_loss, train_loader, optimizer, device)
        print(epoch, evaluate(val_loader, model, device))
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pth")
