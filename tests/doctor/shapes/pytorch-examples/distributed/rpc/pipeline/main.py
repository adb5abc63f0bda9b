import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.optim as optim

from stages import TwoStageNet


def remote_optimizer(param_refs, lr=0.02):
    params = [ref.to_here() for ref in param_refs]
    opt = optim.SGD(params, lr=lr)
    opt.step = torch.compile(opt.step)  # silent: TW115
    return opt


def drive(n_batches, batch=16, classes=10):
    net = TwoStageNet(["stage0", "stage1"])
    first_refs, second_refs = net.parameter_rrefs()
    opt_a = rpc.remote("stage0", remote_optimizer, args=(first_refs,))
    opt_b = rpc.remote("stage1", remote_optimizer, args=(second_refs,))
    criterion = nn.MSELoss()
    for k in range(n_batches):
        x = torch.randn(batch, 3, 64, 64)
        y = torch.zeros(batch, classes).scatter_(1, torch.randint(0, classes, (batch, 1)), 1)
        with dist_autograd.context() as ctx_id:
            dist_autograd.backward(ctx_id, [criterion(net(x), y)])
            opt_a.rpc_sync().step()
            opt_b.rpc_sync().step()
            opt_a.rpc_sync().zero_grad()
            opt_b.rpc_sync().zero_grad()
        print(f"batch {k} done")
