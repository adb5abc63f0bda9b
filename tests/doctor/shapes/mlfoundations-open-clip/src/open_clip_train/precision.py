from contextlib import nullcontext
from functools import partial

import torch


def pick_autocast(precision, device_type="cuda"):
    if precision == "fp16_mixed":
        dtype = torch.float16
    elif precision == "bf16_mixed":
        dtype = torch.bfloat16
    else:
        return nullcontext
    return partial(torch.autocast, device_type=device_type, dtype=dtype)
