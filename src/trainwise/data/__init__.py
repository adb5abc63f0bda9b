"""The data pipeline: from what the user passes to the batches a training loop iterates.

- :mod:`~trainwise.data.loaders`: what the data is (``data_kind``) and the one call that makes the training or
  evaluation loader of it (``training_loader``, ``evaluation_loader``).
- :mod:`~trainwise.data.seeding`: seeded loaders, whose order and augmentation depend only on the seed.
- :mod:`~trainwise.data.samplers`: this process's shard of the data, and the padding batches of a short shard.
- :mod:`~trainwise.data.resumable`: a loader that resumes in the middle of an epoch (``ResumableLoader``).
- :mod:`~trainwise.data.batches`: batch conventions (``BatchConventions``): inputs and target, calling the model,
  its loss, counting.
"""

from trainwise.data.batches import (
    BatchConventions,
    MicroBatch,
    call_model,
    count_choice,
    count_items,
    forward_micro_batch,
    mark_last,
    split_batch,
)
from trainwise.data.loaders import data_kind, evaluation_loader, threads_beside_workers, training_loader
from trainwise.data.resumable import ResumableLoader
from trainwise.data.samplers import (
    PaddingBatch,
    ShardedBatchSampler,
    ShardSampler,
    is_padding,
    padding_batches,
    padding_forward,
    set_sampler_epoch,
    shard_loader,
    train_sampler,
    validation_padding,
)
from trainwise.data.seeding import (
    SampleKey,
    SeededBatchSampler,
    SeededDataset,
    loader_generator,
    prepare_loader,
    seed_worker,
    seeded_loader,
    seeded_sampling,
)

# What a training loop of your own uses (docs/hand-written-loop.md, docs/distributed.md); the pieces the Trainer
# alone needs stay in their modules (``trainwise.data.samplers.zero_rows`` and the like).
__all__ = [
    "BatchConventions",
    "MicroBatch",
    "PaddingBatch",
    "ResumableLoader",
    "SampleKey",
    "SeededBatchSampler",
    "SeededDataset",
    "ShardSampler",
    "ShardedBatchSampler",
    "call_model",
    "count_choice",
    "count_items",
    "data_kind",
    "evaluation_loader",
    "forward_micro_batch",
    "is_padding",
    "loader_generator",
    "mark_last",
    "padding_batches",
    "padding_forward",
    "prepare_loader",
    "seed_worker",
    "seeded_loader",
    "seeded_sampling",
    "set_sampler_epoch",
    "shard_loader",
    "split_batch",
    "threads_beside_workers",
    "train_sampler",
    "training_loader",
    "validation_padding",
]
