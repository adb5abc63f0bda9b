import torch


def make_optimizer(encoder, predictor, lr, mixed_precision=False):
    params = list(encoder.parameters()) + list(predictor.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr)
    grad_scaler = torch.cuda.amp.GradScaler() if mixed_precision else None
    return optimizer, grad_scaler
