# Public-code corpus case (trainwise doctor, issue 30): facebookresearch-vjepa2/app/vjepa/utils.py
# Source: https://github.com/facebookresearch/vjepa2/blob/c2963a47433ecca0ad4f06ec28bcfa8cb5b5cefb/app/vjepa/utils.py
# Repository: facebookresearch/vjepa2 at commit c2963a47433ecca0ad4f06ec28bcfa8cb5b5cefb
# Path: app/vjepa/utils.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 10-10 ---
import torch
# --- lines 210-227 ---
def init_opt(
    is_anneal,
    encoder,
    predictor,
    iterations_per_epoch,
    start_lr,
    ref_lr,
    warmup,
    num_epochs,
    wd=1e-6,
    final_wd=1e-6,
    final_lr=0.0,
    mixed_precision=False,
    ipe_scale=1.25,
    betas=(0.9, 0.999),
    eps=1e-8,
    zero_init_bias_wd=True,
):
# --- lines 243-243 ---
    optimizer = torch.optim.AdamW(param_groups, betas=betas, eps=eps)
# --- lines 266-267 ---
    scaler = torch.cuda.amp.GradScaler() if mixed_precision else None
    return optimizer, scaler, scheduler, wd_scheduler
