"""Seeding and determinism: one call seeds every RNG; loaders repeat bit for bit, workers included."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainwise.errors import TrainwiseError

_MAX_SEED = 2**32 - 1


def seed_everything(seed: int, *, deterministic: bool = False) -> int:
    """Seed Python, NumPy and torch (CPU and every CUDA device); optionally make kernels deterministic.

    ``deterministic=True`` also calls ``torch.use_deterministic_algorithms(True)``, turns cuDNN benchmarking
    off and cuDNN determinism on, and sets ``CUBLAS_WORKSPACE_CONFIG`` (needed by deterministic cuBLAS).
    ``deterministic=False`` leaves those switches as they are. Returns the seed so that it can be logged.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise TrainwiseError(f"seed must be an integer between 0 and {_MAX_SEED}, got {seed!r}.")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    os.environ["PYTHONHASHSEED"] = str(seed)  # inherited by spawned worker processes
    if deterministic:
        set_deterministic(True)
    return seed


def set_deterministic(enabled: bool) -> None:
    """Switch deterministic kernels on or off (torch, cuDNN, cuBLAS workspace)."""
    if enabled:
        # cuBLAS reads this when its handle is created; setting it before the first matmul is enough.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    if enabled:
        torch.backends.cudnn.benchmark = False  # autotuning may pick a different kernel each run


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` that seeds Python's and NumPy's global RNGs in a worker from torch's per-worker seed.

    torch (since 1.9) already reseeds them in each worker from the loader's base seed; this makes the same
    explicit for loaders built elsewhere, and is what TW201's fix names. An RNG object a dataset holds
    (``np.random.default_rng``, ``random.Random``) is not reseeded by either: seed it per worker from
    ``torch.utils.data.get_worker_info().seed``.
    """
    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    np.random.seed(worker_seed)


def loader_generator(seed: int) -> torch.Generator:
    """A CPU generator for a DataLoader's shuffling and worker base seeds."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def seeded_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_workers: int = 0,
    drop_last: bool = False,
    pin_memory: bool = False,
    collate_fn: Any = None,
    persistent_workers: bool | None = None,
) -> DataLoader:
    """A DataLoader whose order and worker randomness depend only on ``seed``, for any ``num_workers``."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise TrainwiseError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if persistent_workers is None:
        persistent_workers = num_workers > 0
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=_sampler(dataset, shuffle=shuffle, seed=seed),
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=pin_memory,
        collate_fn=collate_fn,
        generator=loader_generator(seed),
        worker_init_fn=seed_worker,
        persistent_workers=persistent_workers,
    )


def prepare_loader(loader: DataLoader, *, seed: int) -> DataLoader:
    """Rebuild a user's DataLoader with a seeded generator and worker seeding, keeping everything else.

    A user's ``worker_init_fn`` still runs, after trainwise's seeding.
    """
    if not isinstance(loader, DataLoader):
        raise TrainwiseError(f"expected a torch DataLoader, got {type(loader).__name__}.")
    if loader.batch_sampler is not None and loader.batch_size is None:
        raise TrainwiseError(
            "this DataLoader uses a custom batch_sampler; give that sampler a seeded generator yourself, "
            "or pass the dataset and batch_size to trainwise instead."
        )
    user_init = loader.worker_init_fn
    init = seed_worker if user_init is None else _chain_worker_init(user_init)
    from torch.utils.data import RandomSampler

    if isinstance(loader.sampler, RandomSampler):
        sampler = _sampler(loader.dataset, shuffle=True, seed=seed)
    else:
        sampler = loader.sampler  # sequential, or the user's own
    return rebuild_loader(loader, sampler=sampler, worker_init_fn=init, generator=loader_generator(seed))


def rebuild_loader(
    loader: DataLoader, *, sampler: Any, worker_init_fn: Any = None, generator: torch.Generator | None = None
) -> DataLoader:
    """The same DataLoader (dataset, batch size, workers, collate, pinning...) with another sampler, worker
    initialiser and generator."""
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
    )


def _sampler(dataset: Dataset, *, shuffle: bool, seed: int) -> Any:
    """A sampler with its own generator, so the order does not depend on ``num_workers``.

    The DataLoader draws worker base seeds from its own generator once per iterator; sharing one generator
    would make the shuffle order change with the number of workers and with persistent workers.
    """
    from torch.utils.data import RandomSampler, SequentialSampler

    if not shuffle:
        return SequentialSampler(dataset)
    return RandomSampler(dataset, generator=loader_generator(seed))


class _chain_worker_init:  # a class, not a closure, so that it pickles for spawned workers
    def __init__(self, user_init: Any) -> None:
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        seed_worker(worker_id)
        self.user_init(worker_id)


def get_rng_state() -> dict[str, Any]:
    """Every global RNG state (Python, NumPy, torch CPU and CUDA), for checkpoints."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
