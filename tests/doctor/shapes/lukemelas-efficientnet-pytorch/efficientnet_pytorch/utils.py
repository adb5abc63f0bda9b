import torch
from torch.hub import load_state_dict_from_url

WEIGHT_URLS = {"tiny-b0": "https://example.org/weights/tiny-b0.pth"}


def attach_pretrained(net, variant, local_file=None, with_head=True):
    if isinstance(local_file, str):
        weights = torch.load(local_file)  # expect: TW301
    else:
        weights = load_state_dict_from_url(WEIGHT_URLS[variant])

    if with_head:
        report = net.load_state_dict(weights, strict=False)  # silent: TW302
        assert not report.missing_keys, f"absent from the weights: {report.missing_keys}"
    else:
        for key in ("head.weight", "head.bias"):
            weights.pop(key)
        report = net.load_state_dict(weights, strict=False)  # silent: TW302
        assert set(report.missing_keys) == {"head.weight", "head.bias"}, report.missing_keys
    assert not report.unexpected_keys, f"not in the network: {report.unexpected_keys}"
    return net
