"""``trainwise.data`` exports what a training loop of your own calls, each name documented in docs/; the pieces
only the Trainer uses stay in their modules (``trainwise.data.samplers.zero_rows``)."""

from __future__ import annotations

import re
import types
import warnings
from pathlib import Path

import trainwise
import trainwise.data

DOCS = Path(__file__).resolve().parents[2] / "docs"

PUBLIC = [
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


def test_the_exports_are_this_list_and_nothing_else_is_imported_into_the_package():
    assert trainwise.data.__all__ == PUBLIC
    names = {name for name, value in vars(trainwise.data).items()
             if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert names == set(PUBLIC)


def test_every_export_is_documented():
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCS.rglob("*.md"))
    spans = re.findall(r"`([^`\n]+)`", text)  # inline code: `name(...)`, `trainwise.data.name`, `with name(...):`
    undocumented = [name for name in PUBLIC
                    if not any(re.search(rf"(?<![\w.])(?:(?:trainwise|tw)\.(?:data\.)?)?{name}\b(?!=)", span)
                               for span in spans)]
    assert not undocumented, f"document these in docs/ or stop exporting them: {undocumented}"


def test_names_the_top_level_sends_to_trainwise_data_are_there():
    moved = {name for name, module in trainwise._MOVED.items() if module == "trainwise.data"}
    assert moved <= set(PUBLIC)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in moved:
            assert getattr(trainwise, name) is getattr(trainwise.data, name)


def test_the_internals_are_in_their_modules():
    from trainwise.data import batches, loaders, resumable, samplers

    for module, name in [(samplers, "zero_rows"), (samplers, "PADDING_SAMPLES"), (loaders, "window_steps"),
                         (resumable, "capture_epoch_start"), (batches, "label_shift"), (loaders, "StreamCheck")]:
        assert hasattr(module, name) and not hasattr(trainwise.data, name)
