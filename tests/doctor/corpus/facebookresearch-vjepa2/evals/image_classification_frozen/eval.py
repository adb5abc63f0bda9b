# Public-code corpus case (trainwise doctor, issue 30): facebookresearch-vjepa2/evals/image_classification_frozen/eval.py
# Source: https://github.com/facebookresearch/vjepa2/blob/c2963a47433ecca0ad4f06ec28bcfa8cb5b5cefb/evals/image_classification_frozen/eval.py
# Repository: facebookresearch/vjepa2 at commit c2963a47433ecca0ad4f06ec28bcfa8cb5b5cefb
# Path: evals/image_classification_frozen/eval.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 22-24 ---
import numpy as np
import torch
import torch.multiprocessing as mp
# --- lines 263-275 ---
def run_one_epoch(
    device,
    training,
    encoder,
    classifiers,
    scaler,
    optimizer,
    scheduler,
    wd_scheduler,
    data_loader,
    use_bfloat16,
):

# --- lines 281-305 ---
    for itr, data in enumerate(data_loader):
        if training:
            [s.step() for s in scheduler]
            [wds.step() for wds in wd_scheduler]

        with torch.cuda.amp.autocast(dtype=torch.float16, enabled=use_bfloat16):
            imgs, labels = data[0].to(device), data[1].to(device)
            with torch.no_grad():
                outputs = encoder(imgs)
                if not training:
                    outputs = [c(outputs) for c in classifiers]
            if training:
                outputs = [c(outputs) for c in classifiers]

        losses = [criterion(o, labels) for o in outputs]
        top1_accs = [100.0 * o.max(dim=1).indices.eq(labels).sum() / len(imgs) for o in outputs]
        top1_accs = [float(AllReduce.apply(t)) for t in top1_accs]
        for t1m, t1a in zip(top1_meters, top1_accs):
            t1m.update(t1a)

        if training:
            if use_bfloat16:
                [s.scale(l).backward() for s, l in zip(scaler, losses)]  # silent: TW401
                [s.step(o) for s, o in zip(scaler, optimizer)]
                [s.update() for s in scaler]
# --- lines 407-409 ---
def init_opt(classifiers, iterations_per_epoch, opt_kwargs, num_epochs, use_bfloat16=False):
    optimizers, schedulers, wd_schedulers, scalers = [], [], [], []
    for c, kwargs in zip(classifiers, opt_kwargs):
# --- lines 422-426 ---
        optimizers += [torch.optim.AdamW(param_groups)]
        schedulers += [WarmupCosineLRSchedule(optimizers[-1], T_max=int(num_epochs * iterations_per_epoch))]
        wd_schedulers += [CosineWDSchedule(optimizers[-1], T_max=int(num_epochs * iterations_per_epoch))]
        scalers += [torch.cuda.amp.GradScaler() if use_bfloat16 else None]
    return optimizers, scalers, schedulers, wd_schedulers
