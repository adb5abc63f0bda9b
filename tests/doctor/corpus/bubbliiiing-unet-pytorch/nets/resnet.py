# Public-code corpus case (trainwise doctor, issue 29): bubbliiiing-unet-pytorch/nets/resnet.py
# Source: https://github.com/bubbliiiing/unet-pytorch/blob/5bcd6b4c832648beed1b92e78ed1e85c56343eca/nets/resnet.py
# Repository: bubbliiiing/unet-pytorch at commit 5bcd6b4c832648beed1b92e78ed1e85c56343eca
# Path: nets/resnet.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 1-4 ---
import math

import torch.nn as nn
import torch.utils.model_zoo as model_zoo

# --- lines 178-185 ---
def resnet50(pretrained=False, **kwargs):
    model = ResNet(Bottleneck, [3, 4, 6, 3], **kwargs)
    if pretrained:
        model.load_state_dict(model_zoo.load_url('https://s3.amazonaws.com/pytorch/models/resnet50-19c8e357.pth', model_dir='model_data'), strict=False)  # latent: TW302
    
    del model.avgpool
    del model.fc
    return model
