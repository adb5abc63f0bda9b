"""Resume with random augmentation inside loader workers: bitwise at epoch boundaries and mid-epoch.

A dataset that draws from torch's (or Python's and NumPy's) global RNG in ``__getitem__`` is loaded by
``seeded_loader`` with persistent workers; an interrupted and resumed run must see the very batches an
uninterrupted one sees, and the batches must not depend on the number of workers.
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from trainwise import Trainer, seed_everything
from trainwise.data import ResumableLoader, seeded_loader
from trainwise.seeding import get_rng_state, set_rng_state

SAMPLES, BATCH = 24, 4  # 6 batches an epoch


class TorchNoise(Dataset):
    """Each sample is its index plus torch.rand noise drawn in the process that loads it."""

    def __init__(self) -> None:
        self.scale = 1.0  # an attribute the loader's dataset must keep reachable

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((3,), float(i)) + self.scale * torch.rand(3)
        return x, torch.tensor(i % 3)


class PythonNumpyNoise(Dataset):
    """Each sample is its index plus noise from Python's and NumPy's global RNGs."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i), random.random(), float(np.random.rand())], dtype=torch.float64)


DATASETS = {"torch": TorchNoise, "numpy_random": PythonNumpyNoise}


def _loader(dataset: Dataset, workers: int) -> ResumableLoader:
    return ResumableLoader(seeded_loader(dataset, batch_size=BATCH, seed=0, num_workers=workers))


def _flat(batches: list) -> torch.Tensor:
    return torch.cat([b[0] if isinstance(b, (list, tuple)) else b for b in batches])


def _disturb() -> None:
    """Use every global RNG, as the training between two checkpoints would (dropout, a random crop)."""
    torch.rand(7)
    random.random()
    np.random.rand()


def _straight(kind: str, workers: int, epochs: int = 2) -> list[torch.Tensor]:
    seed_everything(0)
    loader = _loader(DATASETS[kind](), workers)
    out = []
    for _ in range(epochs):
        out.append(_flat(list(loader)))
        _disturb()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_epoch_boundary_resume_with_workers_is_bitwise(kind):
    reference = _straight(kind, workers=2)
    seed_everything(0)
    first = _loader(DATASETS[kind](), 2)
    epoch1 = _flat(list(first))
    _disturb()
    checkpoint = {"loader": first.state_dict(), "rng": get_rng_state()}
    del first  # its workers go; the resumed run starts new ones
    seed_everything(123)  # a fresh process: nothing left of the first run's RNG states
    resumed = _loader(DATASETS[kind](), 2)
    resumed.load_state_dict(checkpoint["loader"])
    set_rng_state(checkpoint["rng"])
    epoch2 = _flat(list(resumed))
    assert torch.equal(epoch1, reference[0])
    assert torch.equal(epoch2, reference[1])


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "resume_workers"), [("torch", 2), ("numpy_random", 2), ("torch", 0)])
def test_mid_epoch_resume_with_workers_is_bitwise(kind, resume_workers):
    reference = _straight(kind, workers=2)
    seed_everything(0)
    first = _loader(DATASETS[kind](), 2)
    seen = []
    for batch in first:
        seen.append(batch)
        if len(seen) == 3:
            checkpoint = {"loader": first.state_dict(), "rng": get_rng_state()}
            break
    del first
    seed_everything(123)
    resumed = _loader(DATASETS[kind](), resume_workers)
    resumed.load_state_dict(checkpoint["loader"])
    set_rng_state(checkpoint["rng"])
    assert resumed.resume_offset == 3
    rest = list(resumed)
    _disturb()
    epoch2 = _flat(list(resumed))
    assert torch.equal(_flat(seen + rest), reference[0])
    assert torch.equal(epoch2, reference[1])


@pytest.mark.slow
def test_augmentation_does_not_depend_on_workers_and_changes_each_epoch():
    with_workers = _straight("torch", workers=2)
    without = _straight("torch", workers=0)
    for a, b in zip(with_workers, without, strict=True):
        assert torch.equal(a, b)
    noise = [x - x.floor() for x in with_workers]
    order = [x.floor()[:, 0].long() for x in with_workers]
    by_index = [n[torch.argsort(o)] for n, o in zip(noise, order, strict=True)]
    assert not torch.equal(by_index[0], by_index[1])  # sample i is augmented differently in epoch 2
    assert len({round(v, 6) for v in by_index[0][:, 0].tolist()}) == SAMPLES  # and differently from sample j
    other = seeded_loader(TorchNoise(), batch_size=BATCH, seed=1)
    assert not torch.equal(_flat(list(other)).sort(0).values, with_workers[0].sort(0).values)  # seed matters


def test_loading_in_the_main_process_leaves_the_global_rngs_as_they_were():
    seed_everything(0)
    loader = seeded_loader(PythonNumpyNoise(), batch_size=BATCH, seed=0)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    list(loader)
    after = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1])
    assert torch.equal(before[0], after[0])
    assert before[1] == after[1]
    assert np.array_equal(before[2], after[2])


def test_loader_dataset_keeps_attributes_length_and_pickles():
    dataset = TorchNoise()
    loader = seeded_loader(dataset, batch_size=BATCH, seed=0)
    assert len(loader.dataset) == SAMPLES and loader.dataset.scale == 1.0
    copy = pickle.loads(pickle.dumps(loader.dataset))
    assert len(copy) == SAMPLES and copy.scale == 1.0
    x, y = loader.dataset[5]  # a plain index still loads (unseeded)
    assert x.min() >= 5 and x.max() < 6 and int(y) == 2
    loader.dataset.scale = 0.0  # setting an attribute reaches the dataset that loads the samples
    assert dataset.scale == 0.0
    plain = torch.arange(SAMPLES, dtype=torch.float32).repeat_interleave(3).view(-1, 3)
    assert torch.equal(_flat(list(loader)).sort(0).values, plain)


def _fit(run_dir, *, interrupt_at=None, resume=None):
    seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 3))
    calls = {"train": 0}

    def loss_fn(outputs, targets):
        if torch.is_grad_enabled():
            calls["train"] += 1
            if calls["train"] == interrupt_at:
                raise KeyboardInterrupt
        return F.cross_entropy(outputs, targets)

    try:  # an interrupted fit raises KeyboardInterrupt carrying its result
        result = Trainer(
            epochs=3, batch_size=BATCH, num_workers=2, device="cpu", progress="off", plot=False, seed=0,
            checkpoint_every=4, run_dir=str(run_dir), loss_fn=loss_fn, resume=resume, diagnose=False,
        ).fit(model, TorchNoise())
    except KeyboardInterrupt as exc:
        result = exc.result
    return model, result


@pytest.mark.slow
@pytest.mark.parametrize(("interrupt_at", "resumed_step"), [(10, 8), (13, 12)], ids=["mid_epoch", "epoch_boundary"])
def test_trainer_resume_with_workers_and_augmentation_is_bitwise(tmp_path, interrupt_at, resumed_step):
    # 6 batches an epoch, a checkpoint every 4 steps: at batch 10 the newest is step 8 (2 batches into
    # epoch 2); at batch 13 it is step 12 (the end of epoch 2), so epoch 3 starts in the resumed run
    reference, full = _fit(tmp_path / "full")
    _, cut = _fit(tmp_path / "cut", interrupt_at=interrupt_at)
    assert cut.stopped == "interrupted"
    resumed, result = _fit(tmp_path / "cut", resume="auto")
    log = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert next(r for r in log if r["kind"] == "resumed")["step"] == resumed_step
    assert result.steps == full.steps == 18
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


class LateNumpyNoise(Dataset):
    """torch noise for every sample; NumPy noise only for samples 12 and up (first drawn mid-epoch)."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        numpy_noise = float(np.random.rand()) if i >= 12 else 0.0
        return torch.tensor([float(i), float(torch.rand(())), numpy_noise], dtype=torch.float64)


def test_the_rngs_are_seeded_once_a_batch_not_once_a_sample(monkeypatch):
    import trainwise.data.seeding as seeding

    calls = []
    real = seeding._seed_globals
    monkeypatch.setattr(seeding, "_seed_globals", lambda seed, **kw: (calls.append(seed), real(seed, **kw)))
    batches = list(seeded_loader(TorchNoise(), batch_size=BATCH, seed=0))
    assert len(batches) == SAMPLES // BATCH and len(calls) == len(batches)  # not SAMPLES: 11 µs each
    assert len(set(calls)) == len(calls)


def test_numpy_first_drawn_mid_epoch_is_seeded_from_that_batch_on_in_the_main_process():
    """NumPy's global state is only watched (cheap) until the dataset draws from it; the batch that first does
    is loaded again with NumPy seeded, so the batches equal those of workers, and the caller's NumPy state
    is left as it was."""
    with_workers = [b.clone() for b in seeded_loader(LateNumpyNoise(), batch_size=BATCH, seed=0, num_workers=2)]
    seed_everything(3)
    before = np.random.get_state()[1].copy(), torch.get_rng_state(), random.getstate()
    loader = seeded_loader(LateNumpyNoise(), batch_size=BATCH, seed=0)
    in_main = list(loader)
    assert np.array_equal(np.random.get_state()[1], before[0])
    assert torch.equal(torch.get_rng_state(), before[1]) and random.getstate() == before[2]
    for a, b in zip(with_workers, in_main, strict=True):
        assert torch.equal(a, b)
    assert loader.dataset.__dict__.get("_numpy_drawn") is True


def test_a_dataset_that_never_draws_from_numpy_leaves_it_untouched():
    seed_everything(4)
    loader = seeded_loader(TorchNoise(), batch_size=BATCH, seed=0)
    before = np.random.get_state()[1].copy()
    list(loader)
    assert np.array_equal(np.random.get_state()[1], before) and "_numpy_drawn" not in loader.dataset.__dict__
