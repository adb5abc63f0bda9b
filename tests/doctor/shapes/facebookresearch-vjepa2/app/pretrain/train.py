import torch
import torch.nn.functional as F

from app.pretrain.helpers import make_optimizer


def main(cfg, encoder, predictor, loader):
    dtype_name = cfg["meta"].get("dtype")
    if dtype_name.lower() == "bfloat16":
        dtype, mixed_precision = torch.bfloat16, True
    elif dtype_name.lower() == "float16":
        dtype, mixed_precision = torch.float16, True
    else:
        dtype, mixed_precision = torch.float32, False
    optimizer, scaler = make_optimizer(encoder, predictor, cfg["lr"], mixed_precision=mixed_precision)
    for epoch in range(cfg["epochs"]):
        for clips, masked in loader:
            with torch.cuda.amp.autocast(dtype=dtype, enabled=mixed_precision):
                with torch.no_grad():
                    target = encoder(clips)
                guess = predictor(encoder(masked))
                loss = F.smooth_l1_loss(guess, target)
            optimizer.zero_grad()
            if mixed_precision:
                scaler.scale(loss).backward()  # expect: TW401
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
