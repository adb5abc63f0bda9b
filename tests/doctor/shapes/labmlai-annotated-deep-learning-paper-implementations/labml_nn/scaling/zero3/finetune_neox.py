import torch


def make_optimizer(sharded_model, lr: float):
    return torch.optim.Adam(sharded_model.optimizer_shard(), lr=lr)
