"""The inputs real projects have: dict batches, models that compute their own loss, iterable data, padding.

Each test compares the Trainer with a hand computation on the same tensors, so "trains" means "trains on
exactly what it was given": every key of a dict batch reaches the model, the loss used is the one the rule
in docs/hand-written-loop.md names, and every sample of an iterable counts once per epoch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from trainwise import GradientAccumulator, Trainer, TrainwiseError, mark_last
from trainwise.data import call_model, split_batch
from trainwise.data.batches import model_loss_and_logits

FEATURES, CLASSES, TOKENS, VOCAB = 6, 3, 5, 7


def _trainer(tmp_path, **kw):
    kw.setdefault("progress", "off")
    kw.setdefault("device", "cpu")
    kw.setdefault("plot", False)
    kw.setdefault("checkpoints", False)
    kw.setdefault("diagnose", False)
    return Trainer(run_dir=str(tmp_path / "run"), **kw)


# -- dict batches --------------------------------------------------------------------------------------------


class MaskedMean(nn.Module):
    """Uses every key: a model that silently lost attention_mask or token_type_ids would give other outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, FEATURES)
        self.types = nn.Embedding(2, FEATURES)
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, input_ids, attention_mask, token_type_ids):
        hidden = self.embed(input_ids) + self.types(token_type_ids)
        mask = attention_mask.unsqueeze(-1).float()
        return self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1))


def _token_batches(n=4, batch=8, seed=0, target="labels"):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        mask = (torch.rand(batch, TOKENS, generator=g) > 0.3).long()
        mask[:, 0] = 1
        batches.append({
            "input_ids": torch.randint(0, VOCAB, (batch, TOKENS), generator=g),
            "attention_mask": mask,
            "token_type_ids": torch.randint(0, 2, (batch, TOKENS), generator=g),
            target: torch.randint(0, CLASSES, (batch,), generator=g),
        })
    return batches


def _reference_sgd(model, batches, lr, *, loss_of):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for batch in batches:
        optimizer.zero_grad()
        loss_of(model, batch).backward()
        optimizer.step()
    return model


def test_every_key_of_a_dict_batch_reaches_the_model(tmp_path):
    batches = _token_batches()
    expected = _reference_sgd(MaskedMean(), batches, 0.5, loss_of=lambda m, b: nn.functional.cross_entropy(
        m(b["input_ids"], b["attention_mask"], b["token_type_ids"]), b["labels"]))
    model = MaskedMean()
    _trainer(tmp_path, epochs=1, optimizer=lambda p: torch.optim.SGD(p, lr=0.5)).fit(model, batches)
    for ours, theirs in zip(model.parameters(), expected.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize("key", ["labels", "label", "target", "targets", "y"])
def test_each_documented_target_key_is_the_target(key):
    batch = {"input_ids": torch.zeros(2, 3), key: torch.ones(2)}
    inputs, target = split_batch(batch)
    assert set(inputs) == {"input_ids"} and torch.equal(target, torch.ones(2))


def test_target_keys_are_taken_in_the_documented_order():
    inputs, target = split_batch({"x": 1, "y": 2, "labels": 3})
    assert target == 3 and inputs == {"x": 1, "y": 2}


def test_tuple_batches_keep_the_inputs_target_convention():
    assert split_batch((1, 2)) == (1, 2)


def test_a_dict_batch_without_a_target_is_one_sentence(tmp_path):
    batches = [{"input_ids": torch.zeros(2, 3, dtype=torch.long)}]
    with pytest.raises(TrainwiseError, match="no target") as caught:
        _trainer(tmp_path, epochs=1).fit(MaskedMean(), batches)
    assert "split_batch" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_keys_the_model_does_not_take_are_refused_not_dropped(tmp_path):
    batches = [dict(b, extra=torch.zeros(8)) for b in _token_batches(n=1)]
    with pytest.raises(TrainwiseError, match="'extra'") as caught:
        _trainer(tmp_path, epochs=1).fit(MaskedMean(), batches)
    assert "split_batch" in str(caught.value)


def test_a_single_input_key_goes_to_a_one_argument_forward():
    model = nn.Linear(3, 2)
    out = call_model(model, {"inputs": torch.ones(4, 3)})
    assert out.shape == (4, 2)


# -- models that compute their own loss --------------------------------------------------------------------


@dataclasses.dataclass
class Output:
    loss: torch.Tensor | None
    logits: torch.Tensor


class OwnLoss(nn.Module):
    """Imitates a transformers model: takes labels=, returns its loss (here a label-smoothed cross-entropy, so
    that using the default cross-entropy instead would give different weights) and its logits."""

    def __init__(self, kind):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.net = nn.Linear(FEATURES, CLASSES)

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels, label_smoothing=0.3)
        if self.kind == "dataclass":
            return Output(loss=loss, logits=logits)
        if self.kind == "dict":
            return {"loss": loss, "logits": logits} if loss is not None else {"logits": logits}
        return (loss, logits) if loss is not None else (logits,)


def _feature_batches(n=4, batch=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(batch, FEATURES, generator=g), "labels": torch.randint(0, CLASSES, (batch,), generator=g)}
            for _ in range(n)]


@pytest.mark.parametrize("kind", ["dataclass", "dict", "tuple"])
def test_a_model_that_computes_its_loss_trains_with_that_loss(tmp_path, kind):
    batches = _feature_batches()

    def smoothed(model, batch):
        return nn.functional.cross_entropy(model.net(batch["x"]), batch["labels"], label_smoothing=0.3)

    expected = _reference_sgd(OwnLoss(kind), batches, 0.5, loss_of=smoothed)
    model = OwnLoss(kind)
    result = _trainer(tmp_path, epochs=1, optimizer=lambda p: torch.optim.SGD(p, lr=0.5)).fit(model, batches)
    for ours, theirs in zip(model.parameters(), expected.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6)
    assert "train_accuracy" in result.last  # read from the logits


def test_labels_are_never_passed_to_a_model_that_does_not_take_them(tmp_path):
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(FEATURES, CLASSES)

        def forward(self, x):  # labels= would be a TypeError
            return self.net(x)

    result = _trainer(tmp_path, epochs=1).fit(Plain(), _feature_batches())
    assert "train_accuracy" in result.last


def test_a_forward_with_kwargs_gets_the_labels_and_a_tensor_it_returns_is_logits(tmp_path):
    """**kwargs accepts labels (peft's PeftModel forwards them so): passed; logits returned: cross-entropy."""
    seen = []

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(FEATURES, CLASSES)

        def forward(self, x, **extra):
            seen.append(sorted(extra))
            return self.net(x)

    result = _trainer(tmp_path, epochs=1).fit(Plain(), _feature_batches())
    assert seen and all(keys == ["labels"] for keys in seen)
    assert "train_accuracy" in result.last


def test_an_explicit_loss_fn_wins_over_the_models_loss(tmp_path):
    batches = _feature_batches()
    calls = []

    def loss_fn(logits, targets):
        calls.append(logits.shape)
        return nn.functional.cross_entropy(logits, targets)

    _trainer(tmp_path, epochs=1, loss_fn=loss_fn).fit(OwnLoss("dataclass"), batches)
    assert calls and calls[0] == (8, CLASSES)


def test_an_output_with_neither_loss_nor_logits_is_one_sentence(tmp_path):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(FEATURES, CLASSES)

        def forward(self, x, labels=None):
            return {"hidden": self.net(x)}

    with pytest.raises(TrainwiseError, match="neither a loss nor logits"):
        _trainer(tmp_path, epochs=1).fit(Odd(), _feature_batches())


def test_model_loss_and_logits_reads_each_output_type():
    logits = torch.randn(2, 3)
    loss = logits.sum()
    assert model_loss_and_logits(logits) == (None, logits)
    assert model_loss_and_logits({"loss": loss, "logits": logits}) == (loss, logits)
    assert model_loss_and_logits(Output(loss, logits)) == (loss, logits)
    assert model_loss_and_logits((loss, logits), labels_passed=True) == (loss, logits)


# -- iterable data -------------------------------------------------------------------------------------------


class Stream(IterableDataset):
    """20 samples; with `shards=True` it splits itself between loader workers, as the docs ask."""

    def __init__(self, n=20, sized=False, shards=False):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)
        self.sized, self.shards = sized, shards

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if self.shards and info is not None else (0, 1)
        for i in range(start, len(self.x), step):
            yield self.x[i], self.y[i]

    def __len__(self):
        if not self.sized:
            raise TypeError("no length")
        return len(self.x)


class UnsizedStream(Stream):
    __len__ = None  # type: ignore[assignment]


def _linear():
    torch.manual_seed(0)
    return nn.Linear(FEATURES, CLASSES)


@pytest.mark.parametrize("data", ["unsized", "sized", "generator-list"])
def test_iterable_data_without_len_trains_every_sample_once(tmp_path, data):
    stream = UnsizedStream() if data == "unsized" else Stream(sized=True)
    train = stream if data != "generator-list" else [(stream.x[i:i + 4], stream.y[i:i + 4]) for i in range(0, 20, 4)]
    model = _linear()
    result = _trainer(tmp_path, epochs=2, batch_size=4).fit(model, train)
    assert result.steps == 10  # 5 batches of 4 per epoch


def test_an_iterable_dataset_with_workers_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(TrainwiseError, match="get_worker_info") as caught:
        _trainer(tmp_path, epochs=1, batch_size=4, num_workers=2).fit(_linear(), UnsizedStream())
    assert "\n" not in str(caught.value)


def test_a_sized_stream_replayed_by_every_worker_is_caught(tmp_path):
    loader = DataLoader(Stream(sized=True), batch_size=4, num_workers=2)
    with pytest.raises(TrainwiseError, match="more samples than its length"):
        _trainer(tmp_path, epochs=1).fit(_linear(), loader)


def test_a_stream_that_shards_itself_between_workers_counts_each_sample_once(tmp_path):
    loader = DataLoader(Stream(sized=True, shards=True), batch_size=4, num_workers=2)
    result = _trainer(tmp_path, epochs=1, log_every=1).fit(_linear(), loader)
    assert result.steps == 6  # 10 samples per worker: batches of 4, 4, 2 from each


def test_eval_batch_size_is_honoured_for_an_iterable_dataset(tmp_path, monkeypatch):
    seen = []
    real = Trainer.validate

    def validate(self, model, loader, **kw):
        seen.extend(len(batch[1]) for batch in loader)
        return real(self, model, loader, **kw)

    monkeypatch.setattr(Trainer, "validate", validate)
    _trainer(tmp_path, epochs=1, batch_size=4, eval_batch_size=10).fit(_linear(), UnsizedStream(), UnsizedStream())
    assert seen == [10, 10]


def test_effective_batch_comes_from_the_real_batch_size(tmp_path):
    stream = Stream()
    batches = [(stream.x[i:i + 5], stream.y[i:i + 5]) for i in range(0, 20, 5)]  # 4 batches of 5
    result = _trainer(tmp_path, epochs=1, effective_batch=10).fit(_linear(), batches)
    assert result.steps == 2  # not 20 / 32


def test_effective_batch_that_the_real_batch_does_not_divide_is_refused(tmp_path):
    stream = Stream()
    batches = [(stream.x[i:i + 5], stream.y[i:i + 5]) for i in range(0, 20, 5)]
    with pytest.raises(TrainwiseError, match="does not divide"):
        _trainer(tmp_path, epochs=1, effective_batch=12).fit(_linear(), batches)


def test_an_iterable_that_yields_nothing_is_one_sentence_before_training(tmp_path):
    with pytest.raises(TrainwiseError, match="no batches"):
        _trainer(tmp_path, epochs=1).fit(_linear(), [])


def test_a_one_shot_iterator_for_several_epochs_is_refused(tmp_path):
    stream = Stream()
    batches = iter([(stream.x[:4], stream.y[:4])])
    with pytest.raises(TrainwiseError, match="used up after one epoch"):
        _trainer(tmp_path, epochs=2).fit(_linear(), batches)


def test_mark_last_knows_the_last_batch_without_len():
    assert list(mark_last(x for x in "abc")) == [("a", False), ("b", False), ("c", True)]
    assert list(mark_last(iter([]))) == []


def test_the_accumulator_ends_a_window_at_the_last_batch():
    accumulator = GradientAccumulator(torch.optim.SGD(_linear().parameters(), lr=0.1), steps=3)
    assert not accumulator.ends_window(last=False)
    assert accumulator.ends_window(last=True)


# -- token counts ------------------------------------------------------------------------------------------


class TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, FEATURES)
        self.head = nn.Linear(FEATURES, VOCAB)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))


def _lm_batches():
    g = torch.Generator().manual_seed(5)
    batches = []
    for i in range(4):
        ids = torch.randint(0, VOCAB, (2, TOKENS), generator=g)
        labels = ids.clone()
        if i == 1:
            labels[:] = -100  # a padding-only micro-batch
        batches.append({"input_ids": ids, "labels": labels})
    return batches


@pytest.mark.parametrize("own_loss", [False, True])
def test_a_micro_batch_with_no_counted_token_contributes_nothing(tmp_path, own_loss):
    batches = _lm_batches()
    loss_fn = None
    if own_loss:  # a user loss that means over tokens: NaN on a padding-only batch
        def loss_fn(logits, labels):
            return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    model = TokenModel()
    kw = {"loss_fn": loss_fn} if loss_fn else {}
    result = _trainer(tmp_path, epochs=1, count="tokens", effective_batch=8, batch_size=2, log_every=1,
                      optimizer=lambda p: torch.optim.SGD(p, lr=0.5), **kw).fit(
        model, batches)
    assert result.stopped == "completed" and torch.isfinite(torch.tensor(result.last["train_loss"]))
    # the reference: one step on the three real micro-batches' tokens together
    reference = TokenModel()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    real = [b for b in batches if (b["labels"] != -100).any()]
    logits = torch.cat([reference(b["input_ids"]).flatten(0, 1) for b in real])
    labels = torch.cat([b["labels"].flatten() for b in real])
    nn.functional.cross_entropy(logits, labels).backward()
    optimizer.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6)
    tokens = labels.numel()
    expected_loss = float(nn.functional.cross_entropy(
        torch.cat([TokenModel()(b["input_ids"]).flatten(0, 1) for b in real]), labels, reduction="sum")) / tokens
    assert result.last["train_loss"] == pytest.approx(expected_loss, rel=1e-5)


class _Indexed(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.full((FEATURES,), float(i)), "labels": torch.tensor(i % CLASSES)}


def test_a_map_style_dict_dataset_trains(tmp_path):
    model = OwnLoss("dict")
    result = _trainer(tmp_path, epochs=1, batch_size=2).fit(model, _Indexed())
    assert result.steps == 2
