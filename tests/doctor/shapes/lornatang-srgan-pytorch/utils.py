import torch
from torch import nn


def merge_weights(net: nn.Module, incoming: dict) -> nn.Module:
    current = net.state_dict()
    kept = {k: v for k, v in incoming.items() if k in current and v.shape == current[k].shape}
    current.update(kept)
    net.load_state_dict(current)  # silent: TW302
    return net


def load_pretrained(net: nn.Module, weights_file: str) -> nn.Module:
    saved = torch.load(weights_file, map_location="cpu")  # expect: TW301
    return merge_weights(net, saved["weights"])


def load_for_resume(net: nn.Module, opt, weights_file: str):
    saved = torch.load(weights_file, map_location="cpu")  # expect: TW301
    net = merge_weights(net, saved["weights"])
    opt.load_state_dict(saved["opt"])
    return net, opt, saved["epoch"], saved["best_psnr"]
