"""Seeding: Python, NumPy and torch; loaders repeat bit for bit with workers; deterministic switches."""

import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, random_split

from trainwise import TrainwiseError, seed_everything
from trainwise.data import SeededDataset, prepare_loader, seeded_loader


@pytest.fixture(autouse=True)
def _restore_determinism():
    flags = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(flags[0])
    torch.backends.cudnn.deterministic = flags[1]
    if env is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_seed_everything_repeats_all_rngs():
    seed_everything(7)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_deterministic_switches():
    seed_everything(1, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")


def test_bad_seed():
    with pytest.raises(TrainwiseError, match="seed must be an integer"):
        seed_everything(-1)


class _Augmenting(Dataset):
    """Returns randomness drawn inside the worker from Python, NumPy and torch."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([i, random.random(), np.random.rand(), torch.rand(1).item()], dtype=torch.float64)


def _epochs(loader, n=2):
    return [torch.cat(list(loader)) for _ in range(n)]


def test_seeded_loader_repeats_with_workers_and_workers_differ():
    a = _epochs(seeded_loader(_Augmenting(), batch_size=4, seed=3, num_workers=2))
    b = _epochs(seeded_loader(_Augmenting(), batch_size=4, seed=3, num_workers=2))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(a[0][:, 0], a[1][:, 0])  # shuffled differently each epoch
    py_draws = a[0][:, 1]
    assert len(set(py_draws.tolist())) == 16  # workers do not share Python/NumPy RNG state
    c = _epochs(seeded_loader(_Augmenting(), batch_size=4, seed=4, num_workers=2))
    assert not torch.equal(a[0], c[0])


def test_prepare_loader_keeps_options_and_user_worker_init():
    loader = DataLoader(_Augmenting(), batch_size=4, shuffle=True, num_workers=2, drop_last=True)
    a = torch.cat(list(prepare_loader(loader, seed=5)))
    b = torch.cat(list(prepare_loader(loader, seed=5)))
    assert torch.equal(a, b)
    prepared = prepare_loader(loader, seed=5)
    assert prepared.batch_size == 4 and prepared.drop_last and prepared.num_workers == 2
    sequential = prepare_loader(DataLoader(_Augmenting(), batch_size=4), seed=0)
    assert torch.cat(list(sequential))[:, 0].tolist() == list(range(16))


def test_prepare_loader_seeds_each_sample_so_workers_do_not_matter():
    def batches(workers):
        loader = DataLoader(_Augmenting(), batch_size=4, shuffle=True, num_workers=workers)
        return _epochs(prepare_loader(loader, seed=5))

    for with_workers, without in zip(batches(2), batches(0), strict=True):
        assert torch.equal(with_workers, without)
    tensors = TensorDataset(torch.arange(8))
    assert seeded_loader(tensors, batch_size=4, seed=0).dataset is tensors  # nothing random to seed
    part = Subset(tensors, [0, 1, 2])
    assert seeded_loader(part, batch_size=4, seed=0).dataset is part
    augmented = random_split(_Augmenting(), [8, 8])[0]  # a Subset: torch's __getitems__ only passes indices on
    assert isinstance(seeded_loader(augmented, batch_size=4, seed=0).dataset, SeededDataset)


@pytest.mark.slow
def test_determinism_restored_imports_nothing_when_nothing_changed():
    """torch.use_deterministic_algorithms imports torch._inductor (about a second): a fit that leaves the
    switch alone must not call it on exit, and one that changed it (warn_only too) gets it back."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from trainwise.seeding import determinism_restored\n"
        "with determinism_restored(): pass\n"
        "assert 'torch._inductor' not in sys.modules, 'imported torch._inductor'\n"
        "with determinism_restored():\n"
        "    torch.use_deterministic_algorithms(True, warn_only=True)\n"
        "assert not torch.are_deterministic_algorithms_enabled()\n"
        "assert not torch.is_deterministic_algorithms_warn_only_enabled()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_fit_leaves_the_accelerator_generators_at_its_seed(tmp_path, monkeypatch):
    """The run's seed reaches CUDA's generators last: nothing after seeding (the data fingerprint reads samples
    under a fixed seed) reseeds a device generator it cannot restore, or every GPU run would draw from seed 0."""
    import torch.cuda

    from trainwise import Trainer

    seeds: list[int] = []
    real = torch.cuda.manual_seed_all
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: (seeds.append(int(seed)), real(seed))[1])
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    Trainer(epochs=1, batch_size=16, device="cpu", progress="off", run_dir=str(tmp_path), plot=False,
            seed=123).fit(lambda: torch.nn.Linear(4, 2), data)
    assert seeds and seeds[-1] == 123, seeds
