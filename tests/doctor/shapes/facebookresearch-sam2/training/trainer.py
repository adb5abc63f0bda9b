import math
from dataclasses import dataclass

import torch

from training.utils.amp import dtype_from_name


@dataclass
class MixedPrecisionConf:
    enabled: bool = False
    dtype_name: str = "float16"


class SegmentTrainer:
    def __init__(self, model, optimizer, amp_conf: MixedPrecisionConf, device="cuda"):
        self.model, self.optimizer, self.amp_conf = model, optimizer, amp_conf
        self.scaler = torch.amp.GradScaler(device, enabled=amp_conf.enabled)

    def step(self, frames, masks, loss_fn):
        with torch.autocast("cuda", enabled=self.amp_conf.enabled, dtype=dtype_from_name(self.amp_conf.dtype_name)):
            loss = loss_fn(self.model(frames), masks)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"non-finite loss {loss.item()}")
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()  # expect: TW401
        self.scaler.step(self.optimizer)
        self.scaler.update()
