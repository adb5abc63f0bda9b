# Public-code corpus case (trainwise doctor, issue 15): pytorch-examples/distributed/tensor_parallelism/tensor_parallel_example.py
# Source: https://github.com/pytorch/examples/blob/77f55b912142e11fcfdf5b530231fb9c52f181e8/distributed/tensor_parallelism/tensor_parallel_example.py
# Repository: pytorch/examples at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8
# Path: distributed/tensor_parallelism/tensor_parallel_example.py
# Licence: BSD-3-Clause (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for IPython magics (replaced by `pass`) and the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 35-39 ---
import os
import sys
import torch
import torch.nn as nn
import torch.distributed as dist
# --- lines 91-91 ---
tp_model = ToyModel().to(device_type)
# --- lines 104-123 ---
# Create an optimizer for the parallelized module.
lr = 0.25
optimizer = torch.optim.AdamW(tp_model.parameters(), lr=lr, foreach=True)


# Perform a num of iterations of forward/backward
# and optimizations for the sharded module.
num_iters = 10
rank_log(_rank, logger, "Tensor Parallel training starting...")

for i in range(num_iters):
    # For TP, input needs to be same across all TP ranks.
    # Setting the random seed is to mimic the behavior of dataloader.
    torch.manual_seed(i)
    inp = torch.rand(20, 10, device=device_type)
    output = tp_model(inp)
    output.sum().backward()
    optimizer.step()  # expect: TW105
    rank_log(_rank, logger, f"Tensor Parallel iter {i} completed")

