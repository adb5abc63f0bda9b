"""A checkpoint records the intra-op thread count and a resume trains with it again.

On CPU the Trainer lowers torch's thread count while loader workers run; float sums depend on the thread
count, so a resume on a machine (or with a worker count) that gives another one was not bitwise.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer


class _Probe(nn.Module):
    """Records torch's thread count at each training forward."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.seen: list[int] = []

    def forward(self, x):
        if self.training:
            self.seen.append(torch.get_num_threads())
        return self.linear(x)


def _fit(run_dir, model, epochs, **options):
    generator = torch.Generator().manual_seed(0)  # the same data in both fits: a resume compares its fingerprint
    data = TensorDataset(torch.randn(16, 4, generator=generator), torch.randint(0, 3, (16,), generator=generator))
    return Trainer(epochs=epochs, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False,
                   run_dir=str(run_dir), **options).fit(model, data)


def test_a_resume_uses_the_thread_count_of_the_checkpoint(tmp_path):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _fit(tmp_path / "run", _Probe(), 1)
        torch.set_num_threads(2)
        probe = _Probe()
        _fit(tmp_path / "run", probe, 2, resume="auto")
        assert probe.seen and set(probe.seen) == {1}
        assert torch.get_num_threads() == 2  # put back after fit
    finally:
        torch.set_num_threads(before)
