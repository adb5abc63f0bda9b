import os

import torch


def load_backbone_weights(backbone, weights_file, entry=None):
    if not os.path.isfile(weights_file):
        print(f"no weights at {weights_file}: the backbone keeps its random init")
        return
    stored = torch.load(weights_file, map_location="cpu")  # expect: TW301
    if entry is not None and entry in stored:
        stored = stored[entry]
    stored = {k.removeprefix("module."): v for k, v in stored.items()}
    stored = {k.removeprefix("student."): v for k, v in stored.items()}
    report = backbone.load_state_dict(stored, strict=False)  # silent: TW302
    print(f"weights from {weights_file}: {report}")
