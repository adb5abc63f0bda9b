"""Seeded loaders: an order and augmentation randomness that depend only on the seed, for any number of
workers, persistent or not, and after any resume (the global RNGs themselves: :mod:`trainwise.seeding`)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, TensorDataset, get_worker_info

from trainwise.errors import TrainwiseError


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
    """A DataLoader whose order and augmentation randomness depend only on ``seed``, for any ``num_workers``.

    The global RNGs (torch CPU, Python, NumPy) are seeded for each batch from ``(seed, epoch, position in
    the epoch)`` in whichever process loads it (see :func:`seeded_sampling`), so a random augmentation in
    ``__getitem__`` is the same with 0 or 8 workers, persistent or not, and after any resume.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise TrainwiseError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if persistent_workers is None:
        persistent_workers = num_workers > 0
    dataset, sampler = seeded_sampling(dataset, _sampler(_unseeded(dataset), shuffle=shuffle, seed=seed), seed=seed,
                                       collate_fn=collate_fn)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=pin_memory,
        collate_fn=seeded_collate(collate_fn, dataset),
        generator=loader_generator(seed),
        worker_init_fn=seed_worker,
        persistent_workers=persistent_workers,
    )


def prepare_loader(loader: DataLoader, *, seed: int) -> DataLoader:
    """Rebuild a user's DataLoader with a seeded generator and worker seeding, keeping everything else.

    A user's ``worker_init_fn`` still runs, after trainwise's seeding. A loader with its own ``batch_sampler``
    gets it wrapped in :class:`SeededBatchSampler` (refused, in one sentence, if its order is not reproducible).
    A shuffled or sequential loader also gets per-batch seeding (:func:`seeded_sampling`), as in
    :func:`seeded_loader`; a loader with its own sampler or batch sampler keeps its workers' own streams.
    """
    if not isinstance(loader, DataLoader):
        raise TrainwiseError(f"expected a torch DataLoader, got {type(loader).__name__}.")
    user_init = loader.worker_init_fn
    init = seed_worker if user_init is None else _chain_worker_init(user_init)
    if loader.batch_sampler is not None and loader.batch_size is None:  # its own batch_sampler (bucketing...)
        batches = loader.batch_sampler
        if not isinstance(batches, SeededBatchSampler):
            batches = SeededBatchSampler(batches, seed=seed)
            batches.check()
        return rebuild_loader(loader, batch_sampler=batches, worker_init_fn=init, generator=loader_generator(seed))
    from torch.utils.data import RandomSampler, SequentialSampler

    dataset, sampler = loader.dataset, loader.sampler  # the user's own sampler: kept as it is
    collate_fn = loader.collate_fn
    if isinstance(sampler, (RandomSampler, SequentialSampler)):
        plain = _unseeded(dataset)
        collate_fn = _unseeded_collate(collate_fn)
        dataset, sampler = seeded_sampling(
            plain, _sampler(plain, shuffle=isinstance(sampler, RandomSampler), seed=seed), seed=seed,
            collate_fn=collate_fn,
        )
        collate_fn = seeded_collate(collate_fn, dataset)
    return rebuild_loader(loader, sampler=sampler, worker_init_fn=init, generator=loader_generator(seed),
                          dataset=dataset, collate_fn=collate_fn)


def rebuild_loader(
    loader: DataLoader,
    *,
    sampler: Any = None,
    worker_init_fn: Any = None,
    generator: torch.Generator | None = None,
    batch_sampler: Any = None,
    collate_fn: Any = None,
    dataset: Any = None,
    drop_last: bool | None = None,
) -> DataLoader:
    """The same DataLoader (dataset, batch size, workers, collate, pinning...) with another sampler (or batch
    sampler), worker initialiser and generator, and optionally another collate function, dataset or drop_last."""
    if batch_sampler is not None:  # the batch sampler decides the batches: no batch_size, sampler, drop_last
        batching: dict[str, Any] = {"batch_sampler": batch_sampler}
    else:
        batching = {"batch_size": loader.batch_size, "sampler": sampler,
                    "drop_last": loader.drop_last if drop_last is None else drop_last}
    return DataLoader(
        loader.dataset if dataset is None else dataset,
        **batching,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn if collate_fn is None else collate_fn,
        pin_memory=loader.pin_memory,
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


# -- per-batch seeding -------------------------------------------------------------------------------------

_MASK64 = 2**64 - 1
_new_tuple = tuple.__new__
_NOTHING = object()


class SampleKey(NamedTuple):
    """What a seeded sampler hands the DataLoader for one sample: the dataset index and the seed its batch is
    loaded under when it comes first in the batch (so the seed travels to whichever worker loads it)."""

    index: Any
    seed: int


def seeded_sampling(dataset: Dataset, sampler: Any, *, seed: int, collate_fn: Any = None) -> tuple[Dataset, Any]:
    """``(dataset, sampler)`` for a DataLoader in which every batch is loaded with the global RNGs seeded
    from ``(seed, epoch, position in the epoch)``, so that augmentation does not depend on which worker
    loads a batch nor on what that worker loaded before (persistent workers, resumes). A sample fetched on
    its own (no batching) is seeded on its own.

    The sampler yields :class:`SampleKey` items, its epoch given by the state of its generator when the
    epoch starts (a shuffling sampler's own; a sequential one gets a generator advanced once an epoch), which
    ``ResumableLoader`` checkpoints. The dataset unpacks them (attributes, ``len()`` and pickling are those of
    ``dataset``); in the main process (``num_workers=0``) it puts the global RNGs back after each fetch.
    A ``collate_fn`` of the user's (which may draw: a masking collator) is seeded too, from where the batch's
    loading left the RNGs, once wrapped by :func:`seeded_collate`. Returned unchanged: a ``TensorDataset`` and a
    dataset with its own ``__getitems__`` (nothing random to seed, or its batched fetch kept) under torch's
    own collation, and a sampler that is already seeded.
    """
    plain = _unseeded(dataset)
    loading = _loading(plain)
    if isinstance(sampler, _KeyedSampler) or (loading != "random" and not _may_draw(collate_fn)):
        return dataset, sampler
    return SeededDataset(plain), _KeyedSampler(sampler, seed=seed)


def seeded_collate(collate_fn: Any, dataset: Any) -> Any:
    """``collate_fn`` run with the global RNGs where loading its batch left them (see :class:`SeededCollate`),
    for a loader over a :class:`SeededDataset`; returned unchanged otherwise, and for torch's own collation."""
    if not isinstance(dataset, SeededDataset) or not _may_draw(collate_fn) or isinstance(collate_fn, SeededCollate):
        return collate_fn
    object.__setattr__(dataset, "_collate_follows", True)  # its own attribute, not the wrapped dataset's
    return SeededCollate(collate_fn, dataset)


def _may_draw(collate_fn: Any) -> bool:
    """Whether a collate function may draw random numbers: not torch's own, nor one that declares it draws none
    (a ``draws_no_random = True`` attribute, as trainwise's ``StackSamples`` has)."""
    from torch.utils.data import default_collate, default_convert

    return (collate_fn is not None and collate_fn not in (default_collate, default_convert)
            and not getattr(collate_fn, "draws_no_random", False))


def _unseeded_collate(collate_fn: Any) -> Any:
    return collate_fn.collate_fn if isinstance(collate_fn, SeededCollate) else collate_fn


class SeededCollate:
    """A user's ``collate_fn`` that draws its random numbers (masking, noise) as part of its batch: in a worker
    it goes on from the seeded loading; in the main process it runs from the RNG states the batch's loading
    ended in, and the training loop's RNGs are put back afterwards. So a batch is collated the same whether
    it is collated ahead of the step, again after a resume, or in a worker."""

    def __init__(self, collate_fn: Callable[[Any], Any], dataset: SeededDataset) -> None:
        self.collate_fn = collate_fn
        self.dataset = dataset

    def __getattr__(self, name: str) -> Any:
        if name == "collate_fn":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.collate_fn, name)

    def __call__(self, batch: Any) -> Any:
        if get_worker_info() is not None:
            return self.collate_fn(batch)
        after = self.dataset.__dict__.pop("_after_load", None)
        if after is None:  # a batch not loaded through seeded keys
            return self.collate_fn(batch)
        seed, torch_state, python_state, numpy_state = after
        saved = random.getstate(), torch.default_generator.get_state(), np.random.get_state()
        try:
            torch.default_generator.set_state(torch_state)
            random.setstate(python_state)
            if numpy_state is not None:
                np.random.set_state(numpy_state)
                return self.collate_fn(batch)
            numpy_before = _numpy_state_bytes()
            collated = self.collate_fn(batch)
            if numpy_before is not None and _numpy_state_bytes() == numpy_before:
                return collated
            # it drew from NumPy's global RNG: collate again with NumPy seeded as a worker has it, and seed
            # NumPy for every later batch's loading too
            object.__setattr__(self.dataset, "_numpy_drawn", True)
            torch.default_generator.set_state(torch_state)
            random.setstate(python_state)
            _seed_globals(seed)
            torch.default_generator.set_state(torch_state)
            random.setstate(python_state)
            return self.collate_fn(batch)
        finally:
            random.setstate(saved[0])
            torch.default_generator.set_state(saved[1])
            np.random.set_state(saved[2])

    def __repr__(self) -> str:
        return f"SeededCollate({self.collate_fn!r})"


def _loading(dataset: Any) -> str:
    """How a DataLoader loads ``dataset``: "plain" (only TensorDatasets: nothing random), "batched" (its own
    ``__getitems__``, kept), else "random" (``__getitem__`` per sample, which may draw). torch's Subset,
    StackDataset and ConcatDataset only pass indices on, so what is inside them decides."""
    from torch.utils.data import ConcatDataset, StackDataset, Subset

    if type(dataset) is TensorDataset:
        return "plain"
    parts: list[Any] | None = None
    if isinstance(dataset, Subset) and type(dataset).__getitem__ is Subset.__getitem__:
        parts = [dataset.dataset]
    elif type(dataset) is StackDataset:
        inner = dataset.datasets
        parts = list(inner.values() if isinstance(inner, dict) else inner)
    elif isinstance(dataset, ConcatDataset) and not hasattr(dataset, "__getitems__"):
        kinds = {_loading(part) for part in dataset.datasets}
        return "plain" if kinds == {"plain"} else "random"  # loaded per sample whatever the parts can do
    if parts is not None:
        kinds = {_loading(part) for part in parts}
        return "batched" if "batched" in kinds else "random" if "random" in kinds else "plain"
    return "batched" if hasattr(dataset, "__getitems__") else "random"


class _KeyedSampler:
    """Yields ``SampleKey(index, sample_seed)`` for each index of ``sampler``, the seeds drawn from ``seed``
    and a key of the epoch (a hash of the generator's state as the epoch starts)."""

    def __init__(self, sampler: Any, *, seed: int) -> None:
        self.sampler = sampler
        self.seed = seed
        inner = getattr(sampler, "generator", None)
        self._advance = not isinstance(inner, torch.Generator)  # nothing moves it each epoch: we do
        self.generator = loader_generator(_mix(seed, 0x5EED)) if self._advance else inner

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[SampleKey]:
        # a generator function: the epoch key is read when the first index is asked for, right where the
        # wrapped sampler draws its order, so a resume that restores the generator replays both
        state = self.generator.get_state()
        epoch_key = int.from_bytes(hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest(), "little")
        if self._advance:
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        base = _mix(self.seed, epoch_key)
        # seed = base + position, mixed only where a batch is seeded from it; the keys are made at C speed
        # (about 0.2 µs a sample: this runs for every sample of every epoch)
        indices = iter(self.sampler)
        first = next(indices, _NOTHING)
        if first is _NOTHING:
            return
        indices = itertools.chain((first,), indices)
        if type(first) is not int:
            indices = map(_plain_index, indices)
        yield from map(_new_tuple, itertools.repeat(SampleKey), zip(indices, itertools.count(base)))


class SeededDataset(Dataset):
    """A map-style dataset that loads each batch of :class:`SampleKey` items (or a key on its own) with torch's
    CPU, Python's and NumPy's global RNGs seeded from its first key's seed; any other index loads unseeded.
    Everything else is the wrapped dataset's."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # `loader.dataset.train = False` must reach the dataset that loads the samples
        if name == "dataset":
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, SampleKey):
            return self.dataset[key]
        return self._load(key.seed, lambda: self.dataset[key.index])

    def __getitems__(self, keys: list[Any]) -> list[Any]:
        """A batch: the RNGs seeded once, from its first key (a batch is always loaded whole, by one process,
        so its samples draw the same values with any number of workers), and put back once (main process)."""
        first = next((key for key in keys if isinstance(key, SampleKey)), None)
        indices = [k.index if isinstance(k, SampleKey) else k for k in keys]
        fetch = getattr(self.dataset, "__getitems__", None)
        if first is None:
            return fetch(indices) if fetch is not None else [self.dataset[i] for i in indices]
        if fetch is not None:  # its own batched fetch (a Hugging Face Dataset), kept
            return self._load(first.seed, lambda: fetch(indices))
        return self._load(first.seed, lambda: [self.dataset[i] for i in indices])

    def _load(self, seed: int, load: Callable[[], Any]) -> Any:
        """``load()`` with the global RNGs seeded from ``seed`` (about 11 µs for the three: once a batch).

        In the main process the RNGs are put back afterwards, so that loading does not move the streams the
        training loop draws from (dropout). Reading and restoring NumPy's state costs about 130 µs, more than
        the rest of a small model's data loading, so NumPy is left alone, and only watched (its state's bytes
        compared, a microsecond), until the dataset is seen drawing from it: that batch is then loaded again
        with NumPy seeded too, and so is every later one.
        """
        if get_worker_info() is not None:  # nothing to put back: every batch reseeds them
            _seed_globals(seed)
            return load()
        saved = random.getstate(), torch.default_generator.get_state()
        try:
            numpy_before = None if self.__dict__.get("_numpy_drawn") else _numpy_state_bytes()
            if numpy_before is None:
                saved_numpy = np.random.get_state()
                try:
                    _seed_globals(seed)
                    loaded = load()
                    self._keep_after_load(seed, np.random.get_state())
                    return loaded
                finally:
                    np.random.set_state(saved_numpy)
            _seed_globals(seed, numpy=False)
            loaded = load()
            if _numpy_state_bytes() == numpy_before:
                self._keep_after_load(seed, None)
                return loaded
            # the dataset drew from NumPy's global RNG, unseeded: put it back as it was (a legacy cached
            # Gaussian, which no cheap read shows, is dropped) and load this batch again with NumPy seeded too
            object.__setattr__(self, "_numpy_drawn", True)
            _set_numpy_state_bytes(numpy_before)
            random.setstate(saved[0])
            torch.default_generator.set_state(saved[1])
            return self._load(seed, load)
        finally:
            random.setstate(saved[0])
            torch.default_generator.set_state(saved[1])

    def _keep_after_load(self, seed: int, numpy_state: Any) -> None:
        """Where loading left the RNGs, for a :class:`SeededCollate` to collate the batch from (main process)."""
        if self.__dict__.get("_collate_follows"):
            self.__dict__["_after_load"] = (seed, torch.default_generator.get_state(), random.getstate(), numpy_state)

    def __repr__(self) -> str:
        return f"SeededDataset({self.dataset!r})"


def _unseeded(dataset: Any) -> Any:
    return dataset.dataset if isinstance(dataset, SeededDataset) else dataset


def _mix(a: int, b: int) -> int:
    """A 64-bit hash of two integers (SplitMix64's finaliser): cheap, and nearby inputs give unrelated seeds."""
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _seed_globals(key_seed: int, *, numpy: bool = True) -> None:
    """Seed torch's CPU generator (not CUDA: ``torch.manual_seed`` costs 100 times more), Python and NumPy
    from a :class:`SampleKey`'s seed (mixed here: nearby keys give unrelated seeds)."""
    seed = _mix(key_seed, 0x5A3F)
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    if numpy:
        np.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)


_MT19937_WORDS = 624


def _numpy_state_bytes() -> bytes | None:
    """The bytes of NumPy's global MT19937 state (624 words and the position), read through the bit
    generator's ctypes interface in about a microsecond; None where that interface is missing."""
    try:
        import ctypes

        generator = np.random.mtrand._rand._bit_generator
        if type(generator).__name__ != "MT19937":
            return None
        size = _MT19937_WORDS * 4 + ctypes.sizeof(ctypes.c_int)
        return ctypes.string_at(generator.ctypes.state_address, size)
    except (AttributeError, TypeError, ValueError, ImportError):
        return None


def _set_numpy_state_bytes(state: bytes) -> None:
    """Put back a state :func:`_numpy_state_bytes` read (through NumPy's own ``set_state``)."""
    words = np.frombuffer(state[: _MT19937_WORDS * 4], dtype=np.uint32).copy()
    position = int.from_bytes(state[_MT19937_WORDS * 4:], byteorder=sys.byteorder, signed=True)
    np.random.set_state(("MT19937", words, position, 0, 0.0))


@contextlib.contextmanager
def _global_rngs_restored() -> Iterator[None]:
    """torch's CPU, Python's and NumPy's global RNG states put back on exit."""
    saved = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.default_generator.set_state(saved[2])


class SeededBatchSampler:
    """A DataLoader's own ``batch_sampler`` (bucketing by length, say) made reproducible and resumable.

    Each epoch's batches are drawn at once, while torch's CPU, Python's and NumPy's global RNGs are seeded
    from ``(seed, epoch)`` (and put back afterwards): a sampler that draws from them gives the same batches in
    every run, on every process and after a resume, and the training's own use of those RNGs (dropout) cannot
    change them. ``set_epoch(epoch)`` (``set_sampler_epoch`` calls it) picks the epoch and is passed on to the
    wrapped sampler if it has one. A ``torch.Generator`` kept as ``generator`` on the sampler (or on its
    ``sampler``) is used as it is; ``ResumableLoader`` checkpoints it. Any other source (``random.Random()``,
    ``np.random.default_rng()`` held by the sampler) is refused by :meth:`check`.
    """

    def __init__(self, batch_sampler: Any, *, seed: int) -> None:
        self.batch_sampler = batch_sampler
        self.seed = seed
        self.epoch = 0
        # the micro-batch size when every batch has it (a torch BatchSampler), else None (look at a batch)
        self.batch_size = batch_sampler.batch_size if isinstance(batch_sampler, BatchSampler) else None

    @property
    def sampler(self) -> Any:
        """The wrapped batch sampler: ``ResumableLoader`` looks for its ``generator`` here."""
        return self.batch_sampler

    @property
    def generator(self) -> torch.Generator | None:
        """The wrapped sampler's index sampler's generator (``ResumableLoader`` checkpoints it)."""
        return getattr(getattr(self.batch_sampler, "sampler", None), "generator", None)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        for sampler in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
                return

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[Any]]:
        return iter(self.epoch_batches())

    def epoch_batches(self) -> list[list[Any]]:
        """This epoch's batches (lists of indices), drawn with the global RNGs seeded from seed and epoch."""
        with _seeded_global_rngs(self.seed, self.epoch):
            batches = [[_plain_index(i) for i in batch] for batch in self.batch_sampler]
        length = _length(self.batch_sampler)
        if length is not None and length != len(batches):
            raise TrainwiseError(
                f"the batch_sampler {type(self.batch_sampler).__name__} yielded {len(batches)} batches but its "
                f"len() is {length}; make __len__ return the number of batches it yields."
            )
        return batches

    def check(self) -> list[list[Any]]:
        """Draw this epoch twice from the same state and refuse a sampler whose batches differ (an unseeded
        random source); returns the batches and leaves every generator as it was."""
        generators = self._generators()
        states = [g.get_state() for g in generators]
        draws = []
        for _ in range(2):
            self.set_epoch(self.epoch)  # a sampler that reseeds itself in set_epoch starts over
            draws.append(self.epoch_batches())
            for generator, state in zip(generators, states):
                generator.set_state(state)
        self.set_epoch(self.epoch)
        if draws[0] != draws[1]:
            raise TrainwiseError(
                f"the DataLoader's batch_sampler {type(self.batch_sampler).__name__} drew different batches from "
                "the same seed and epoch, so its order cannot be repeated, resumed or shared by processes; draw "
                "its randomness from torch's global RNG or from a torch.Generator kept as its `generator` "
                "attribute, or reseed it from a seed in a set_epoch(epoch) method."
            )
        return draws[0]

    def _generators(self) -> list[torch.Generator]:
        found: list[torch.Generator] = []
        inner = self.batch_sampler
        for holder in (inner, getattr(inner, "sampler", None)):
            generator = getattr(holder, "generator", None)
            if isinstance(generator, torch.Generator) and not any(generator is g for g in found):
                found.append(generator)
        return found


@contextlib.contextmanager
def _seeded_global_rngs(seed: int, epoch: int) -> Iterator[None]:
    """torch's CPU, Python's and NumPy's global RNGs seeded from ``(seed, epoch)``, then restored."""
    derived = int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
    with _global_rngs_restored():
        random.seed(derived)
        np.random.seed(derived)
        torch.default_generator.manual_seed(derived)
        yield


def _plain_index(index: Any) -> Any:
    """An index as a plain Python value (a tensor or NumPy integer element becomes an int)."""
    if isinstance(index, (torch.Tensor, np.integer)):
        return int(index)
    return index


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


class _chain_worker_init:  # a class, not a closure, so that it pickles for spawned workers
    def __init__(self, user_init: Any) -> None:
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        seed_worker(worker_id)
        self.user_init(worker_id)
