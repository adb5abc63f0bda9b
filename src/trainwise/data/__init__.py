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
    default_loss,
    forward_micro_batch,
    label_shift,
    mark_last,
    model_loss_and_logits,
    split_batch,
)
from trainwise.data.loaders import (
    StreamCheck,
    data_kind,
    evaluation_loader,
    threads_beside_workers,
    training_loader,
    window_steps,
)
from trainwise.data.resumable import ResumableLoader, capture_epoch_start
from trainwise.data.samplers import (
    PADDING_SAMPLES,
    Padding,
    PaddingBatch,
    PaddingCollate,
    ShardedBatchSampler,
    ShardSampler,
    is_padding,
    padding_batches,
    padding_for,
    padding_forward,
    padding_outputs,
    set_sampler_epoch,
    shard_loader,
    train_sampler,
    validation_padding,
    zero_rows,
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

__all__ = [
    "PADDING_SAMPLES",
    "BatchConventions",
    "MicroBatch",
    "Padding",
    "PaddingBatch",
    "PaddingCollate",
    "ResumableLoader",
    "SampleKey",
    "SeededBatchSampler",
    "SeededDataset",
    "ShardSampler",
    "ShardedBatchSampler",
    "StreamCheck",
    "call_model",
    "capture_epoch_start",
    "count_choice",
    "count_items",
    "data_kind",
    "default_loss",
    "evaluation_loader",
    "forward_micro_batch",
    "is_padding",
    "label_shift",
    "loader_generator",
    "mark_last",
    "model_loss_and_logits",
    "padding_batches",
    "padding_for",
    "padding_forward",
    "padding_outputs",
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
    "window_steps",
    "zero_rows",
]
