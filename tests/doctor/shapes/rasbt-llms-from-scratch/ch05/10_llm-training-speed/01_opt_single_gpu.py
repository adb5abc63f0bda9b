import torch

from tiny_gpt import TinyGPT, fit_with_timing


def main(model_cfg, run_cfg, train_dl, val_dl):
    device = torch.device("cuda")
    lm = TinyGPT(model_cfg)
    lm = torch.compile(lm)  # silent: TW115
    lm.to(device).to(torch.bfloat16)
    opt = torch.optim.AdamW(lm.parameters(), lr=run_cfg["lr"], fused=True)
    return fit_with_timing(
        model=lm,
        train_loader=train_dl,
        val_loader=val_dl,
        optimizer=opt,
        device=device,
        epochs=run_cfg["epochs"],
    )
