# Public-code corpus case (trainwise doctor, issue 30): facebookresearch-sam2/training/utils/train_utils.py
# Source: https://github.com/facebookresearch/sam2/blob/2b90b9f5ceec907a1c18123530e92e794ad901a4/training/utils/train_utils.py
# Repository: facebookresearch/sam2 at commit 2b90b9f5ceec907a1c18123530e92e794ad901a4
# Path: training/utils/train_utils.py
# Licence: Apache-2.0 (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 19-19 ---
import torch
# --- lines 138-145 ---
def get_amp_type(amp_type: Optional[str] = None):
    if amp_type is None:
        return None
    assert amp_type in ["bfloat16", "float16"], "Invalid Amp type."
    if amp_type == "bfloat16":
        return torch.bfloat16
    else:
        return torch.float16
