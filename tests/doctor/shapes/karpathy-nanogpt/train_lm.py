import os
from contextlib import nullcontext

import numpy as np
import torch

from tiny_lm import LMConfig, TinyLM

out_dir, start = "runs", "fresh"
micro_steps, batch_size, context, max_iters = 8, 16, 128, 2000
device = "cuda" if torch.cuda.is_available() else "cpu"
use_compile = True
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
device_kind = "cuda" if "cuda" in device else "cpu"
amp_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
amp_ctx = nullcontext() if device_kind == "cpu" else torch.amp.autocast(device_type=device_kind, dtype=amp_dtype)  # silent: TW109
tokens = np.memmap(os.path.join("data", "tokens.bin"), dtype=np.uint16, mode="r")


def sample_batch():
    starts = torch.randint(len(tokens) - context, (batch_size,))
    x = torch.stack([torch.from_numpy(tokens[s:s + context].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(tokens[s + 1:s + 1 + context].astype(np.int64)) for s in starts])
    return x.to(device), y.to(device)


settings = dict(n_layer=4, n_head=4, width=256, context=context)
if start == "fresh":
    lm = TinyLM(LMConfig(**settings))
else:
    saved = torch.load(os.path.join(out_dir, "last.pt"), map_location=device)  # expect: TW301
    settings.update({k: saved["settings"][k] for k in ("n_layer", "n_head", "width", "context")})
    lm = TinyLM(LMConfig(**settings))
    lm.load_state_dict(saved["weights"])
lm.to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
optimizer = torch.optim.AdamW(lm.parameters(), lr=3e-4)
if use_compile:
    lm = torch.compile(lm)  # silent: TW115

x, y = sample_batch()
for it in range(max_iters):
    for micro in range(micro_steps):
        with amp_ctx:
            _, loss = lm(x, y)
            loss = loss / micro_steps
        x, y = sample_batch()
        scaler.scale(loss).backward()  # silent: TW106  # silent: TW401
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
