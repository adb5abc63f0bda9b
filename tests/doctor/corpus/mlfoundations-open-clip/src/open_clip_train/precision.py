# Public-code corpus case (trainwise doctor, issue 30): mlfoundations-open-clip/src/open_clip_train/precision.py
# Source: https://github.com/mlfoundations/open_clip/blob/89fb801f1e6087880e951fc8354b8a2077b79c6d/src/open_clip_train/precision.py
# Repository: mlfoundations/open_clip at commit 89fb801f1e6087880e951fc8354b8a2077b79c6d
# Path: src/open_clip_train/precision.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 1-15 ---
import torch
from contextlib import suppress
from functools import partial


def get_autocast(precision, device_type='cuda', fsdp=False):
    if fsdp:
        return suppress

    if precision =='amp':
        amp_dtype = torch.float16
    elif precision == 'amp_bfloat16' or precision == 'amp_bf16':
        amp_dtype = torch.bfloat16
    else:
        return suppress
