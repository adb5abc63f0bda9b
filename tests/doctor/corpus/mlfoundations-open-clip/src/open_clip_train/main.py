# Public-code corpus case (trainwise doctor, issue 30): mlfoundations-open-clip/src/open_clip_train/main.py
# Source: https://github.com/mlfoundations/open_clip/blob/89fb801f1e6087880e951fc8354b8a2077b79c6d/src/open_clip_train/main.py
# Repository: mlfoundations/open_clip at commit 89fb801f1e6087880e951fc8354b8a2077b79c6d
# Path: src/open_clip_train/main.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 15-15 ---
import torch
# --- lines 97-97 ---
def main(args):
# --- lines 447-450 ---
    optimizer = None
    scaler = None

    if args.train_data or args.dataset_type in ("synthetic", "synthetic-audio"):
# --- lines 487-495 ---
        scaler = None
        need_scaler = (args.precision == "amp")
        if args.fsdp:
            need_scaler = (fsdp_mp_dtype == torch.float16)
        if need_scaler:
            try:
                scaler = torch.amp.GradScaler(device=device)
            except (AttributeError, TypeError):
                scaler = torch.cuda.amp.GradScaler()
