import torch


def make_optimizers(probes, lr, use_bfloat16=False):
    optimizers = [torch.optim.AdamW(p.parameters(), lr=lr) for p in probes]
    scalers = [torch.cuda.amp.GradScaler() if use_bfloat16 else None for _ in probes]
    return optimizers, scalers


def run_epoch(device, training, encoder, probes, scalers, optimizers, loader, loss_fn, use_bfloat16):
    for images, labels in loader:
        with torch.cuda.amp.autocast(dtype=torch.float16, enabled=use_bfloat16):
            images, labels = images.to(device), labels.to(device)
            with torch.no_grad():
                feats = encoder(images)
            outputs = [p(feats) for p in probes]
        losses = [loss_fn(o, labels) for o in outputs]
        if training:
            if use_bfloat16:
                [s.scale(v).backward() for s, v in zip(scalers, losses)]  # silent: TW401
                [s.step(o) for s, o in zip(scalers, optimizers)]
                [s.update() for s in scalers]
            else:
                [v.backward() for v in losses]
                [o.step() for o in optimizers]
