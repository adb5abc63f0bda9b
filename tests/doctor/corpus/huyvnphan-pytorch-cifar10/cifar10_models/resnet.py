# Public-code corpus case (trainwise doctor, issue 29): huyvnphan-pytorch-cifar10/cifar10_models/resnet.py
# Source: https://github.com/huyvnphan/PyTorch_CIFAR10/blob/641cac24371b17052b9bb6e56af1c83b5e97cd7f/cifar10_models/resnet.py
# Repository: huyvnphan/PyTorch_CIFAR10 at commit 641cac24371b17052b9bb6e56af1c83b5e97cd7f
# Path: cifar10_models/resnet.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 1-3 ---
import torch
import torch.nn as nn
import os

# --- lines 262-272 ---
def _resnet(arch, block, layers, pretrained, progress, device, **kwargs):
    model = ResNet(block, layers, **kwargs)
    if pretrained:
        script_dir = os.path.dirname(__file__)
        state_dict = torch.load(  # expect: TW301
            script_dir + "/state_dicts/" + arch + ".pt", map_location=device
        )
        model.load_state_dict(state_dict)
    return model


