# Public-code corpus case (trainwise doctor, issue 15): pytorch-examples/distributed/tensor_parallelism/fsdp_tp_example.py
# Source: https://github.com/pytorch/examples/blob/77f55b912142e11fcfdf5b530231fb9c52f181e8/distributed/tensor_parallelism/fsdp_tp_example.py
# Repository: pytorch/examples at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8
# Path: distributed/tensor_parallelism/fsdp_tp_example.py
# Licence: BSD-3-Clause (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for IPython magics (replaced by `pass`) and the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 32-37 ---
import sys
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
# --- lines 98-98 ---
model = Transformer.from_model_args(simple_llama2_config).to(device_type)
# --- lines 149-149 ---
sharded_model = fully_shard(model, mesh=dp_mesh)
# --- lines 153-174 ---
# Create an optimizer for the parallelized and sharded model.
lr = 3e-3
rank_log(_rank, logger, f"Creating AdamW optimizer with learning rate {lr}")
optimizer = torch.optim.AdamW(sharded_model.parameters(), lr=lr, foreach=True)

# Training loop:
# Perform a num of iterations of forward/backward
# and optimizations for the sharded module.
rank_log(_rank, logger, "\nStarting 2D training...")
num_iterations = 10
batch_size = 2

for i in range(num_iterations):
    # seeding with dp_rank to ensure identical inputs for TP groups
    torch.manual_seed(i + dp_rank)
    inp = torch.randint(32000, (8, 256), device=device_type)

    output = sharded_model(inp)
    output.sum().backward()
    optimizer.step()  # expect: TW105
    rank_log(_rank, logger, f"2D iter {i} complete")

