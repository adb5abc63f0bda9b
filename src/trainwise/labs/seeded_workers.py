"""Fundamental 10: augmentation drawn from NumPy's global RNG inside DataLoader workers is not controlled by
``np.random.seed``; ``seeded_loader`` / ``prepare_loader`` make it repeat bit for bit, with any number of workers.

Each worker process gets its NumPy, Python and torch seeds from a base seed that the DataLoader draws from
torch's generator (so the workers do not repeat each other), never from the seed the main process gave NumPy.
A script that seeds NumPy and Python but not torch therefore augments differently on every run: a new process
starts torch's generator from a random seed (here two fixed ones, so that the lab itself repeats).
"""

from __future__ import annotations

from trainwise.labs import Lab, LabResult

SAMPLES, BATCH, WORKERS = 16, 4, 2
RUN_SEEDS = (1001, 2002)  # torch's generator as two fresh processes would start it (random there, fixed here)

class _NoisyDataset:
    """Samples whose augmentation (noise) comes from NumPy's global RNG, as in many a ``__getitem__`` (a map-style
    dataset needs no base class; importing torch's would make listing the labs import torch)."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        import numpy as np
        import torch

        return index, torch.from_numpy(np.random.normal(size=3))


def _augmentations(loader) -> dict:
    """Each sample's augmentation, by sample index (the order of the batches does not matter)."""
    return {int(i): noise for indices, batch in loader for i, noise in zip(indices, batch)}


def _differing(a: dict, b: dict) -> int:
    import torch

    return sum(not torch.equal(a[i], b[i]) for i in a)


def measure() -> LabResult:
    import random

    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from trainwise.data.seeding import prepare_loader, seeded_loader

    saved = random.getstate(), np.random.get_state()

    def run(make, *, torch_seed: int, numpy_seed: int = 0) -> dict:
        torch.manual_seed(torch_seed)  # what a new process would start torch from
        random.seed(numpy_seed)  # what the script seeds
        np.random.seed(numpy_seed)
        return _augmentations(make())

    def plain(workers: int = WORKERS):
        return DataLoader(_NoisyDataset(), batch_size=BATCH, shuffle=True, num_workers=workers)

    first, second = RUN_SEEDS
    figures: dict = {"samples": SAMPLES}
    try:
        a = run(plain, torch_seed=first)
        b = run(plain, torch_seed=second)
        figures["plain DataLoader, NumPy seeded alike: samples augmented differently in a second run"] = \
            _differing(a, b)
        c = run(plain, torch_seed=first, numpy_seed=1)
        figures["plain DataLoader: samples whose augmentation changed with NumPy's seed (0 -> 1)"] = \
            _differing(a, c)
        d = run(lambda: plain(0), torch_seed=first)
        figures["plain DataLoader: samples augmented differently with 0 and 2 workers"] = _differing(a, d)
        values = [tuple(noise.tolist()) for noise in a.values()]
        figures["plain DataLoader: samples whose augmentation another sample repeated"] = \
            len(values) - len(set(values))

        for name, make in (
            ("seeded_loader", lambda workers: seeded_loader(
                _NoisyDataset(), batch_size=BATCH, seed=0, num_workers=workers, persistent_workers=False)),
            ("prepare_loader", lambda workers: prepare_loader(plain(workers), seed=0)),
        ):
            a = run(lambda m=make: m(WORKERS), torch_seed=first)
            b = run(lambda m=make: m(WORKERS), torch_seed=second, numpy_seed=1)
            d = run(lambda m=make: m(0), torch_seed=second)
            figures[f"{name}: samples augmented differently in a second run (other torch and NumPy seeds)"] = \
                _differing(a, b)
            figures[f"{name}: samples augmented differently with 0 and 2 workers"] = _differing(a, d)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])

    runs = figures["plain DataLoader, NumPy seeded alike: samples augmented differently in a second run"]
    numpy_seed = figures["plain DataLoader: samples whose augmentation changed with NumPy's seed (0 -> 1)"]
    workers = figures["plain DataLoader: samples augmented differently with 0 and 2 workers"]
    right = [k for k in figures if k.startswith(("seeded_loader", "prepare_loader"))]
    worst = max(figures[k] for k in right)
    verdict = "repeated every augmentation bit for bit" if worst == 0 else "did not repeat"
    reading = (f"With a plain DataLoader and {WORKERS} workers, a second run with NumPy and random seeded alike "
               f"(torch not) augmented {runs} of {SAMPLES} samples differently, changing NumPy's seed changed "
               f"{numpy_seed} of them (the workers are seeded from torch's generator, not from np.random.seed) and "
               f"0 workers instead of {WORKERS} changed {workers}; with seeded_loader and prepare_loader (seed=0), "
               f"a second run with other global seeds and a run with 0 workers {verdict} ({worst} of {SAMPLES} "
               "samples differed).")
    shown = runs >= SAMPLES // 2 and workers >= SAMPLES // 2 and numpy_seed == 0 and worst == 0
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="seeded-workers", fundamental=10, title="augmentation in loader workers: unseeded vs seeded_loader",
          codes=("TW201",), measure=measure)
