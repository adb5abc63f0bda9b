import torch


def dtype_from_name(name=None):
    if name is None:
        return None
    assert name in ("bfloat16", "float16"), name
    return torch.bfloat16 if name == "bfloat16" else torch.float16
