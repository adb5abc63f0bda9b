import random

import numpy as np
import torch


def reseed_worker(worker_number):
    base = torch.initial_seed() % 2**32
    random.seed(base + worker_number)
    np.random.seed((base + worker_number) % 2**32)


class RunningMean:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def add(self, value, n):
        self.total += value * n
        self.count += n
