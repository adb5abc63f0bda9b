"""Resume a DataLoader in the middle of an epoch: the same order, no sample skipped or seen twice.

An epoch's order is fixed when it starts, by the state of the generators the sampler and the loader draw
from (``seeded_loader`` gives the sampler its own generator; the loader's generator gives the workers their
base seed; a loader without generators draws both from torch's global RNG). :class:`ResumableLoader`
records those states as each epoch starts and counts the batches it hands out; its ``state_dict()`` is
therefore enough to rebuild the rest of an interrupted epoch in a fresh process. On resume it restores the
epoch-start states, replays the sampler's draws and skips the indices of the batches already trained on,
without loading them, so the remaining batches are bitwise the ones the uninterrupted run would have seen,
with any ``num_workers``. After that epoch the generators are where the uninterrupted run left them.

Random augmentation in ``__getitem__`` (and in a ``collate_fn`` of the user's) resumes exactly too, at epoch
boundaries and mid-epoch, with persistent workers and even with another ``num_workers``, for loaders built by
``seeded_loader`` (or ``prepare_loader`` from a shuffled or sequential DataLoader): each batch is loaded and
collated with torch's CPU, Python's and NumPy's global RNGs seeded from (seed, epoch, position in the epoch),
the epoch being read from the sampler generator's state that is checkpointed here
(``trainwise.data.seeding.seeded_sampling``).

Not resumed exactly: with any other loader (its own sampler or batch sampler, a plain DataLoader), randomness
drawn *inside* worker processes after a resume, because each worker's stream goes on from what it drew
before (persistent workers keep it across epochs) and which worker loads which batch changes; RNG objects a
dataset holds itself (``np.random.default_rng``, ``random.Random``, a ``torch.Generator``) and CUDA's RNG, in
any loader. Datasets without ``__getitem__`` (iterable datasets, plain iterables of batches) are resumed by
reading and discarding the batches already seen, which is exact only if their iteration order is
deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainwise.errors import TrainwiseError


class ResumableLoader:
    """Wrap a DataLoader (or any re-iterable of batches) so that its position can be checkpointed.

    >>> loader = ResumableLoader(seeded_loader(dataset, batch_size=32, seed=0, num_workers=2))
    >>> state = {"model": model, "optimizer": optimizer, "loader": loader, "epoch": 0}
    >>> # after load_checkpoint(path, state): the next `for batch in loader` yields only the rest of the epoch
    >>> start = loader.resume_offset   # batches of this epoch already trained on (0 unless resuming)
    >>> for index, batch in enumerate(loader, start=start): ...

    Save it only at a point where every batch it has yielded was trained on (an optimizer-step boundary).
    Other attributes (``batch_size``, ``num_workers``, ``dataset``...) are those of the wrapped loader.
    """

    def __new__(cls, loader: Iterable[Any]) -> ResumableLoader:
        # Only a loader with a length gets __len__, so that hasattr(wrapped, "__len__") stays truthful (every
        # DataLoader has __len__, which raises over a stream without one).
        if cls is ResumableLoader and _length(loader) is not None:
            cls = _SizedResumableLoader
        return super().__new__(cls)

    def __init__(self, loader: Iterable[Any]) -> None:
        if isinstance(loader, ResumableLoader):
            loader = loader.loader
        if not isinstance(loader, Iterable):
            raise TrainwiseError(
                f"ResumableLoader needs a DataLoader or an iterable of batches, got {type(loader).__name__}."
            )
        self.loader = loader
        self.batches_done = 0  # batches of the current epoch handed out
        self.epochs_started = 0
        self._epoch_start: dict[str, Any] | None = None  # generator states when the current epoch began
        self._in_epoch = False
        self._pending: dict[str, Any] | None = None  # a mid-epoch state waiting for the next __iter__

    # -- iteration -----------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)

    @property
    def resume_offset(self) -> int:
        """Batches the next iteration skips: those of an interrupted epoch already trained on (else 0)."""
        return int(self._pending["batches_done"]) if self._pending is not None else 0

    def __iter__(self) -> Iterator[Any]:
        return self._count(*self._start())

    def with_last(self) -> Iterator[tuple[Any, bool]]:
        """``(batch, is_last)`` for the rest of the epoch, looking one batch ahead (no ``len()`` needed), so
        that an accumulation window and DDP's gradient sync can end on the last batch. The position saved
        by :meth:`state_dict` counts the batches handed out, never the one looked at ahead."""
        batches, skip = self._start()
        self.batches_done = skip
        self._in_epoch = True
        try:
            try:
                current = next(batches)
            except StopIteration:
                return
            for following in batches:
                self.batches_done += 1
                yield current, False
                current = following
            self.batches_done += 1
            yield current, True
        finally:
            self._in_epoch = False

    def _start(self) -> tuple[Iterator[Any], int]:
        """The batches of this epoch (the rest of it after a resume) and how many were skipped."""
        pending, self._pending = self._pending, None
        self.epochs_started += 1
        if pending is not None:
            self._epoch_start = pending["epoch_start"]
            skip = int(pending["batches_done"])
            return _remaining_batches(self.loader, self._epoch_start, skip), skip
        self._epoch_start = capture_epoch_start(self.loader)
        return iter(self.loader), 0

    def _count(self, batches: Iterator[Any], skip: int) -> Iterator[Any]:
        self.batches_done = skip
        self._in_epoch = True
        try:
            for batch in batches:
                self.batches_done += 1
                yield batch
        finally:
            self._in_epoch = False

    # -- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the data order stands: the epoch-start generator states and the batches handed out.

        Between epochs it holds the generators' current states (the start of the next epoch).
        """
        if self._in_epoch:
            return {"epoch_start": self._epoch_start, "batches_done": self.batches_done,
                    "epochs_started": self.epochs_started}
        if self._pending is not None:  # loaded and not yet iterated: pass it on unchanged
            return {**self._pending, "epochs_started": self.epochs_started}
        return {"epoch_start": capture_epoch_start(self.loader, global_rng=False), "batches_done": 0,
                "epochs_started": self.epochs_started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch_start = state["epoch_start"]
        skip = int(state["batches_done"])
        self.epochs_started = int(state.get("epochs_started", 0))
        if skip < 0:
            raise TrainwiseError(f"a loader position must be 0 or more batches, got {skip}.")
        if skip == 0:
            # between epochs: put the generators where the next epoch starts; nothing to skip
            _restore_generators(self.loader, epoch_start)
            self._pending = None
        else:
            length = _length(self.loader)
            if length is not None and skip > length:
                raise TrainwiseError(
                    f"the checkpoint was taken after {skip} batches of an epoch, but this loader has only "
                    f"{length}; resume with the same dataset, batch_size and drop_last."
                )
            self._pending = {"epoch_start": epoch_start, "batches_done": skip}
        self.batches_done = skip


class _SizedResumableLoader(ResumableLoader):
    """A :class:`ResumableLoader` around a loader with a length (a DataLoader over a map-style dataset)."""

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


def _length(loader: Any) -> int | None:
    """``len(loader)``, or None for a loader without one (a DataLoader over an ``IterableDataset`` with no
    ``__len__`` has the method, and raises ``TypeError``)."""
    if not hasattr(loader, "__len__"):
        return None
    try:
        return len(loader)
    except TypeError:
        return None


# -- epoch-start states ------------------------------------------------------------------------------------


def _generators(loader: Any) -> list[torch.Generator]:
    """The distinct generators that decide a DataLoader's epoch: the sampler's, then the loader's."""
    found: list[torch.Generator] = []
    if not isinstance(loader, DataLoader):
        return found
    candidates = [getattr(loader.sampler, "generator", None)]
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None:
        candidates.append(getattr(batch_sampler, "generator", None))
        candidates.append(getattr(getattr(batch_sampler, "sampler", None), "generator", None))
    candidates.append(loader.generator)
    for generator in candidates:
        if isinstance(generator, torch.Generator) and not any(generator is g for g in found):
            found.append(generator)
    return found


def capture_epoch_start(loader: Any, *, global_rng: bool = True) -> dict[str, Any]:
    """The states that fix the next epoch of ``loader``; take them right before ``iter(loader)``."""
    return {
        "generators": [g.get_state() for g in _generators(loader)],
        "torch": torch.get_rng_state() if global_rng else None,
    }


def _restore_generators(loader: Any, epoch_start: dict[str, Any]) -> None:
    generators = _generators(loader)
    states = list(epoch_start.get("generators") or [])
    if len(states) != len(generators):
        raise TrainwiseError(
            f"the checkpoint's data loader had {len(states)} seeded generator(s), this one has {len(generators)}; "
            "resume with a loader built the same way (seeded_loader with the same options)."
        )
    for generator, state in zip(generators, states):
        generator.set_state(state)


def _map_style(loader: Any) -> bool:
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def _remaining_batches(loader: Any, epoch_start: dict[str, Any], skip: int) -> Iterator[Any]:
    """An iterator over the batches of the epoch that began at ``epoch_start``, after the first ``skip``."""
    if not _map_style(loader):
        # A DataLoader over a stream draws its workers' base seed from torch's RNG when it starts an epoch,
        # as the uninterrupted run did from the epoch-start state: replay that draw there, then give the RNG
        # back as the checkpoint left it (the model's dropout goes on from it).
        saved = torch.get_rng_state()
        if epoch_start.get("torch") is not None:
            torch.set_rng_state(epoch_start["torch"])
        try:
            iterator = iter(loader)
        finally:
            torch.set_rng_state(saved)
        for _ in range(skip):
            if next(iterator, _END) is _END:
                break
        return iterator
    _restore_generators(loader, epoch_start)
    index_sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    skipping = _SkipFirst(index_sampler, skip)
    batched = loader.batch_sampler is not None
    remaining = max(len(loader) - skip, 0)
    workers = loader.num_workers if remaining else 0
    options = {"in_order": loader.in_order} if hasattr(loader, "in_order") else {}  # torch >= 2.6
    one_epoch = DataLoader(
        loader.dataset,
        batch_size=1 if batched else None,  # the batch sampler decides; 1 is DataLoader's "not given"
        batch_sampler=skipping if batched else None,
        sampler=None if batched else skipping,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=False,
        timeout=loader.timeout if workers else 0,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=False,
        **options,
    )
    # The uninterrupted epoch drew the workers' base seed and then the sampler's order, from the state the
    # epoch started with; replay both draws from that state, then give the RNG back as the caller had it.
    saved = torch.get_rng_state()
    if epoch_start.get("torch") is not None:
        torch.set_rng_state(epoch_start["torch"])
    try:
        iterator = iter(one_epoch)
        skipping.prime()
    finally:
        torch.set_rng_state(saved)
    return iterator


_END = object()


class _SkipFirst:
    """A sampler (or batch sampler) that yields what ``inner`` yields, minus the first ``skip`` items.

    Lazy like ``inner`` (so the RNG draws happen in the same order as in a normal epoch), with ``prime()``
    to make them happen now. Skipped items are indices only: no sample is loaded for them.
    """

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner = inner
        self.skip = skip
        self._iterator: Iterator[Any] | None = None
        self._next: Any = _END

    def __len__(self) -> int:
        return max(len(self.inner) - self.skip, 0)

    def prime(self) -> None:
        """Draw the epoch's order now (skip and buffer one item), if the DataLoader has not already."""
        if self._iterator is None:
            self._start()

    def _start(self) -> None:
        self._iterator = iter(self.inner)
        for _ in range(self.skip):
            if next(self._iterator, _END) is _END:
                break
        self._next = next(self._iterator, _END)

    def __iter__(self) -> Iterator[Any]:
        if self._iterator is None:
            self._start()
        iterator = self._iterator
        assert iterator is not None
        while self._next is not _END:
            item, self._next = self._next, next(iterator, _END)
            yield item


__all__ = ["ResumableLoader", "capture_epoch_start"]
