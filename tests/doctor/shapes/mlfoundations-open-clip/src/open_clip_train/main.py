import torch


def prepare(cfg, device):
    scaler = None
    if cfg.precision == "fp16_mixed":
        scaler = torch.amp.GradScaler(device=device)
    return scaler
