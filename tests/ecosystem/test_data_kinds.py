"""What the Trainer is given decides how it is batched: samples are batched by ``batch_size`` (a list of
samples, dict samples, a Hugging Face ``datasets.Dataset``), ready-made batches are used as they are, and
``collate_fn`` (``DataCollatorWithPadding``) pads text exactly as Hugging Face users batch it."""

from __future__ import annotations

import json

import pytest
import torch
from hf_models import sentences, tiny_bert_classifier, word_tokenizer
from torch import nn

import trainwise as tw
from trainwise.errors import TrainwiseError

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")


def _trainer(tmp_path, **options):
    defaults = dict(epochs=1, lr=1e-3, seed=0, progress="off", checkpoints=False, plot=False, device="cpu",
                    run_dir=str(tmp_path / "run"))
    return tw.Trainer(**{**defaults, **options})


def _steps(run_dir) -> int:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return max(r.get("step", 0) for r in records)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


@pytest.mark.parametrize("target", ["tensor", "int"])
def test_a_list_of_samples_is_batched_by_batch_size(tmp_path, target):
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(8, generator=g), torch.tensor(i % 3) if target == "tensor" else i % 3) for i in range(64)]
    result = _trainer(tmp_path, batch_size=16).fit(_mlp(), samples)
    assert _steps(result.run_dir) == 4  # 64 samples / 16, not 64 one-sample "batches"
    assert tw.data_kind(samples) == "samples"


def test_a_list_of_ready_made_batches_is_used_as_it_is(tmp_path):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
    assert tw.data_kind(batches) == "batches"
    result = _trainer(tmp_path, batch_size=16).fit(_mlp(), batches)
    assert _steps(result.run_dir) == 4


def test_a_list_of_dict_samples_trains_a_real_bert_classifier(tmp_path):
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(1, 61, (10,), generator=g),
                "attention_mask": torch.ones(10, dtype=torch.long), "labels": torch.tensor(i % 3)} for i in range(24)]
    result = _trainer(tmp_path, batch_size=8).fit(lambda: tiny_bert_classifier(), samples)
    assert _steps(result.run_dir) == 3
    assert 0 <= result.last["train_accuracy"] <= 1


def test_a_hugging_face_dataset_in_torch_format_is_batched_and_validated(tmp_path):
    g = torch.Generator().manual_seed(0)
    table = {"input_ids": torch.randint(1, 61, (20, 10), generator=g).tolist(), "label": [i % 3 for i in range(20)]}
    data = datasets.Dataset.from_dict(table).with_format("torch")
    result = _trainer(tmp_path, batch_size=4).fit(lambda: tiny_bert_classifier(), data, data)
    assert _steps(result.run_dir) == 5
    model = result.model.eval()
    with torch.no_grad():  # val_loss is the model's own loss over all 20 samples, sample-weighted
        everything = data[:]  # the whole table as one batch of tensors
        expected = float(model(input_ids=everything["input_ids"], labels=everything["label"]).loss)
    assert result.last["val_loss"] == pytest.approx(expected, rel=1e-5)


def test_a_hugging_face_dataset_without_a_format_is_refused_in_one_sentence(tmp_path):
    data = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6]], "label": [0, 1]})
    with pytest.raises(TrainwiseError,
                       match=r"the training data .*no tensor format.*with_format\('torch'\).*collate_fn="):
        _trainer(tmp_path, batch_size=2).fit(lambda: tiny_bert_classifier(), data)
    # the validation data raw beside formatted training data: the sentence says which data it is
    with pytest.raises(TrainwiseError, match=r"^the validation data \(a datasets.Dataset\) has no tensor format"):
        _trainer(tmp_path, batch_size=2).fit(lambda: tiny_bert_classifier(), data.with_format("torch"), data)


def test_data_collator_with_padding_batches_text_of_different_lengths(tmp_path):
    tokenizer = word_tokenizer()
    rows = sentences(24)
    data = datasets.Dataset.from_list(rows).map(lambda row: tokenizer(row["text"]), remove_columns=["text"])
    collator = transformers.DataCollatorWithPadding(tokenizer)
    result = _trainer(tmp_path, batch_size=8, collate_fn=collator).fit(lambda: tiny_bert_classifier(), data, data)
    assert _steps(result.run_dir) == 3
    model = result.model.eval()
    total = 0.0
    with torch.no_grad():  # the model's own loss, each sample alone (no padding at all), averaged by sample
        for row in data:
            ids = torch.tensor([row["input_ids"]])
            total += float(model(input_ids=ids, labels=torch.tensor([row["label"]])).loss)
    assert result.last["val_loss"] == pytest.approx(total / len(data), rel=1e-4)


def test_samples_that_cannot_be_stacked_name_collate_fn(tmp_path):
    samples = [{"input_ids": torch.ones(n, dtype=torch.long), "labels": torch.tensor(0)} for n in (3, 5, 4, 6)]
    with pytest.raises(TrainwiseError, match=r"could not be collated into a batch.*collate_fn="):
        _trainer(tmp_path, batch_size=2).fit(lambda: tiny_bert_classifier(), samples)


def test_python_lists_in_samples_are_refused_not_transposed(tmp_path):
    samples = [{"input_ids": [1, 2, 3, 4], "labels": 0} for _ in range(4)]
    with pytest.raises(TrainwiseError, match="Python list of numbers, which the default collate would transpose"):
        _trainer(tmp_path, batch_size=2).fit(lambda: tiny_bert_classifier(), samples)


def test_collate_fn_with_ready_made_batches_is_refused(tmp_path):
    batches = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]
    with pytest.raises(TrainwiseError, match="collate_fn= batches samples, and the data is ready-made batches"):
        _trainer(tmp_path, collate_fn=lambda s: s).fit(_mlp(), batches)


def test_a_dataset_dict_is_refused_naming_a_split(tmp_path):
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": [1]})})
    with pytest.raises(TrainwiseError, match=r"DatasetDict of the splits \['train'\]; pass one split"):
        _trainer(tmp_path).fit(_mlp(), splits)


def test_a_hugging_face_iterable_dataset_is_a_stream(tmp_path):
    g = torch.Generator().manual_seed(0)
    table = {"input_ids": torch.randint(1, 61, (12, 6), generator=g).tolist(), "label": [i % 3 for i in range(12)]}
    stream = datasets.Dataset.from_dict(table).to_iterable_dataset().with_format("torch")
    assert tw.data_kind(stream) == "stream"
    result = _trainer(tmp_path, batch_size=4).fit(lambda: tiny_bert_classifier(), stream)
    assert _steps(result.run_dir) == 3


def _first_tokens_per_epoch(tmp_path, stream, epochs=3):
    model = tiny_bert_classifier()
    seen: list[list[int]] = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"][:, 0].tolist()),
                                    with_kwargs=True)
    _trainer(tmp_path, batch_size=4, epochs=epochs).fit(model, stream)
    flat = [t for batch in seen for t in batch]
    per_epoch = len(flat) // epochs
    return [flat[i * per_epoch:(i + 1) * per_epoch] for i in range(epochs)]


def test_a_shuffled_hugging_face_stream_is_reshuffled_every_epoch(tmp_path):
    """A ``datasets`` stream shuffles from ``seed + epoch`` once it is told the epoch (``set_epoch``), as the
    Hugging Face Trainer and Accelerate tell it: every epoch a new order, the same on a second run."""
    table = {"input_ids": [[i + 1] * 6 for i in range(24)], "label": [i % 3 for i in range(24)]}
    def stream():
        return (datasets.Dataset.from_dict(table).to_iterable_dataset(num_shards=4)
                .shuffle(seed=0, buffer_size=8).with_format("torch"))
    orders = _first_tokens_per_epoch(tmp_path / "a", stream())
    assert all(sorted(o) == list(range(1, 25)) for o in orders)  # every row once per epoch
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]
    assert _first_tokens_per_epoch(tmp_path / "b", stream()) == orders
