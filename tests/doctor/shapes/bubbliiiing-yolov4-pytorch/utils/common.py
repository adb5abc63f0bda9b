import random

import numpy as np
import torch


def make_repeatable(seed=3):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def init_worker(worker_id, rank, seed):
    shared = rank + seed
    random.seed(shared)  # expect: TW201
    np.random.seed(shared)
    torch.manual_seed(shared)
