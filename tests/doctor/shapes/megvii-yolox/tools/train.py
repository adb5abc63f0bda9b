import os
import random
import warnings

import torch
import torch.backends.cudnn as cudnn


def set_threads():
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def launch(recipe, opts):
    if recipe.seed is not None:
        random.seed(recipe.seed)
        torch.manual_seed(recipe.seed)
        cudnn.deterministic = True
        warnings.warn("seeded run: deterministic convolutions requested", stacklevel=1)

    set_threads()
    cudnn.benchmark = True  # expect: TW202

    runner = recipe.make_runner(opts)
    runner.fit()
