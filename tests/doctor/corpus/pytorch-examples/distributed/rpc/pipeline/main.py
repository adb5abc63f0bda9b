# Public-code corpus case (trainwise doctor, issue 30): pytorch-examples/distributed/rpc/pipeline/main.py
# Source: https://github.com/pytorch/examples/blob/77f55b912142e11fcfdf5b530231fb9c52f181e8/distributed/rpc/pipeline/main.py
# Repository: pytorch/examples at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8
# Path: distributed/rpc/pipeline/main.py
# Licence: BSD-3-Clause (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 7-12 ---
import torch
import torch.nn as nn
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.optim as optim
# --- lines 196-201 ---
def create_optimizer_for_remote_params(worker_name, param_rrefs, lr=0.05):
    """Create torch.compiled optimizers on  each worker"""
    params = [p.to_here() for p in param_rrefs]
    opt = optim.SGD(params, lr=lr)
    opt.step = torch.compile(opt.step)  # silent: TW115
    return opt
# --- lines 204-207 ---
def run_master(split_size):

    # put the two model parts on worker1 and worker2 respectively
    model = DistResNet50(split_size, ["worker1", "worker2"])
# --- lines 214-224 ---
    # Create optimizers on remote workers
    opt1_rref = rpc.remote(
        "worker1",
        create_optimizer_for_remote_params,
        args=("worker1", p1_param_rrefs)
    )
    opt2_rref = rpc.remote(
        "worker2",
        create_optimizer_for_remote_params,
        args=("worker2", p2_param_rrefs)
    )
# --- lines 230-248 ---
    for i in range(num_batches):
        print(f"Processing batch {i}")
        # generate random inputs and labels
        inputs = torch.randn(batch_size, 3, image_w, image_h)
        labels = torch.zeros(batch_size, num_classes) \
                      .scatter_(1, one_hot_indices, 1)

        # The distributed autograd context is the dedicated scope for the
        # distributed backward pass to store gradients, which can later be
        # retrieved using the context_id by the distributed optimizer.
        with dist_autograd.context() as context_id:
            outputs = model(inputs)
            dist_autograd.backward(context_id, [loss_fn(outputs, labels)])
            
            opt1_rref.rpc_sync().step()
            opt2_rref.rpc_sync().step()
            
            opt1_rref.rpc_sync().zero_grad()
            opt2_rref.rpc_sync().zero_grad()
