# Public-code corpus case (trainwise doctor, issue 29): bubbliiiing-yolov4-pytorch/nets/CSPdarknet.py
# Source: https://github.com/bubbliiiing/yolov4-pytorch/blob/9571c250a3e26946eabc39398320fba8a045a90b/nets/CSPdarknet.py
# Repository: bubbliiiing/yolov4-pytorch at commit 9571c250a3e26946eabc39398320fba8a045a90b
# Path: nets/CSPdarknet.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 1-6 ---
import math
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

# --- lines 170-175 ---
def darknet53(pretrained):
    model = CSPDarkNet([1, 2, 8, 8, 4])
    if pretrained:
        model.load_state_dict(torch.load("model_data/CSPdarknet53_backbone_weights.pth"))  # expect: TW301
    return model

