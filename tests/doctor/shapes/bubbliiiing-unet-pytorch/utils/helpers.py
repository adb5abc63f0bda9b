import random

import numpy as np
import torch


def fix_seeds(seed=7):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id, rank, seed):
    same_seed = rank + seed
    random.seed(same_seed)  # expect: TW201
    np.random.seed(same_seed)
    torch.manual_seed(same_seed)
