"""TrainStep, the step as a primitive: a hand-written loop that hands each batch to it ends bitwise where the same
loop written with the accumulator's calls ends, and where the Trainer ends; with skip_nonfinite a window whose
step is skipped adds nothing to the loss average; with a splitter each batch is a window, redone after an
out-of-memory error with no sample counted twice. The way a batch takes is decided by the declared
BatchConventions, never by what the forward function looks like, and every way ends bitwise alike."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwise as tw
from trainwise.guards import NonFiniteLossGuard
from trainwise.oom import AdaptiveMicroBatches


def _data(n: int = 40) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


FORWARD = functools.partial(tw.forward_micro_batch, device=torch.device("cpu"))


def _explicit(model, loader, accumulator, metrics):
    """The loop body of examples/hand_written_loop.py."""
    for batch, last_batch in tw.mark_last(loader):
        last = accumulator.ends_window(last=last_batch)
        with accumulator.sync_context(model, last=last):
            micro = FORWARD(model, batch)
            accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)
        metrics.mean("loss").update_loss(micro.loss.detach(), micro.count, micro.reduction)
        metrics.accuracy("accuracy").update(micro.outputs, micro.targets)
        if last:
            accumulator.step()


def _with_step(model, loader, accumulator, metrics, **options):
    step = tw.TrainStep(model, accumulator, FORWARD, metrics, **options)
    windows = sum(step.add(batch, last=last) for batch, last in tw.mark_last(loader))
    return step, windows


def test_a_loop_with_trainstep_ends_where_the_explicit_loop_ends():
    loader = DataLoader(_data(), batch_size=6)  # 7 batches, windows of 3: the last window is short
    results = []
    for run in (_explicit, _with_step):
        model = _model()
        accumulator = tw.GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1), steps=3)
        metrics = tw.MetricSet(torch.device("cpu"))
        out = run(model, loader, accumulator, metrics)
        results.append((model.state_dict(), metrics.compute(), accumulator.optimizer_steps, out))
    (a, values_a, steps_a, _), (b, values_b, steps_b, (_, windows)) = results
    assert steps_a == steps_b == windows == 3
    assert values_a == values_b
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_trainstep_ends_where_the_trainer_ends(tmp_path):
    data = _data()
    result = tw.Trainer(epochs=1, batch_size=6, accumulation_steps=3, device="cpu", precision="fp32", seed=0,
                        progress="off", plot=False, diagnose=False, guards="off", run_dir=str(tmp_path / "run"),
                        optimizer=lambda params: torch.optim.SGD(params, lr=0.1)).fit(_model, data)
    tw.seed_everything(0)
    model = _model()
    tw.seed_everything(0)  # as fit does after building the model
    loader = tw.training_loader(data, batch_size=6, seed=0, device=torch.device("cpu"), epochs=1)
    accumulator = tw.GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1), steps=3)
    tw.set_sampler_epoch(loader, 1)
    metrics = tw.MetricSet(torch.device("cpu"))
    model.train()
    step = tw.TrainStep(model, accumulator, FORWARD, metrics)
    for batch, last in loader.with_last():
        step.add(batch, last=last)
    assert accumulator.optimizer_steps == result.steps == 3
    assert metrics.compute()["loss"] == pytest.approx(result.history[-1]["train_loss"], rel=0, abs=0)
    for key, value in model.state_dict().items():
        assert torch.equal(value, result.model.state_dict()[key]), key


class NaNOnce(nn.Module):
    """Returns NaN logits on its second forward: the second window's step must be skipped."""

    def __init__(self):
        super().__init__()
        self.inner, self.calls = _model(), 0

    def forward(self, x):
        self.calls += 1
        out = self.inner(x)
        return out * math.nan if self.calls == 2 else out


def test_skip_nonfinite_leaves_a_skipped_windows_loss_out_of_the_average():
    loader = DataLoader(_data(24), batch_size=8)  # 3 windows of one batch
    model = NaNOnce()
    accumulator = tw.GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1), skip_nonfinite=True)
    metrics = tw.MetricSet(torch.device("cpu"))
    losses = []
    step = tw.TrainStep(model, accumulator, FORWARD, metrics, skip_nonfinite=True, accuracy="off")
    for batch, last in tw.mark_last(loader):
        x, y = batch
        with torch.no_grad():
            losses.append(nn.functional.cross_entropy(model.inner(x), y))  # before the step changes the weights
        step.add(batch, last=last)
    assert accumulator.optimizer_steps == 2 and accumulator.skipped_steps == 1
    assert metrics.compute()["loss"] == pytest.approx(float((losses[0] + losses[2]) / 2), rel=1e-6)


class OutOfMemoryAbove(nn.Module):
    """Raises torch.OutOfMemoryError for any batch of more than ``limit`` rows."""

    def __init__(self, limit: int):
        super().__init__()
        self.inner, self.limit = _model(), limit

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.inner(x)


def test_a_splitter_redoes_the_window_at_the_size_that_fits_and_counts_each_sample_once():
    loader = DataLoader(_data(32), batch_size=16)  # two windows of 16
    model = OutOfMemoryAbove(4)
    accumulator = tw.GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1))
    metrics = tw.MetricSet(torch.device("cpu"))
    step, windows = _with_step(model, loader, accumulator, metrics, splitter=AdaptiveMicroBatches(16))
    assert windows == 2 and accumulator.optimizer_steps == 2
    assert step.take_halvings() == [(16, 8), (8, 4)] and step.take_halvings() == []
    reference = OutOfMemoryAbove(32)
    ref_accumulator = tw.GradientAccumulator(torch.optim.SGD(reference.parameters(), lr=0.1))
    ref_metrics = tw.MetricSet(torch.device("cpu"))
    _with_step(reference, loader, ref_accumulator, ref_metrics)  # whole batches: the same two steps
    count = metrics.mean("loss").fold()[1]
    assert count == ref_metrics.mean("loss").fold()[1] == 32  # no sample counted twice
    for key, value in model.inner.state_dict().items():
        assert torch.allclose(value, reference.inner.state_dict()[key], atol=1e-6), key


class LogitsOrDict(nn.Module):
    """Class logits, except on its ``dict_call``-th forward, which returns them in a dict (as HF models do)."""

    def __init__(self, dict_call: int = 0):
        super().__init__()
        self.inner, self.calls, self.dict_call = _model(), 0, dict_call

    def forward(self, x):
        self.calls += 1
        out = self.inner(x)
        return {"logits": out} if self.calls == self.dict_call else out


def _batches():
    """Pairs of tensors as a DataLoader yields them (lists), a tuple, and a dict batch among them."""
    data = _data(48)
    x, y = data.tensors
    batches: list = [[x[i:i + 8], y[i:i + 8]] for i in range(0, 24, 8)]
    batches.append((x[24:32], y[24:32]))
    batches.append({"x": x[32:40], "labels": y[32:40]})
    batches.append([x[40:48], y[40:48]])
    return batches


class TinyLM(nn.Module):
    """(batch, tokens) ids in, (batch, tokens, vocabulary) logits out: count="auto" counts its tokens."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.embed(input_ids)))


def _token_batches():
    """Dict batches of token ids whose labels are padded with -100 to different lengths: 5 micro-batches."""
    g = torch.Generator().manual_seed(3)
    batches = []
    for size, kept in ((3, 5), (2, 2), (4, 7), (1, 3), (3, 1)):
        ids = torch.randint(0, 11, (size, 7), generator=g)
        labels = torch.randint(0, 11, (size, 7), generator=g)
        labels[:, kept:] = -100
        batches.append({"input_ids": ids, "labels": labels})
    return batches


def _class_batches():
    """(inputs, targets) pairs of 8, 8, 5 and 3 samples: ragged micro-batches of class targets."""
    x, y = _data(24).tensors
    return [[x[a:b], y[a:b]] for a, b in ((0, 8), (8, 16), (16, 21), (21, 24))]


CASES = {
    # name: (model, batches, accumulator options): an uneven last window in each accumulated case
    "class-pairs": (_model, _class_batches, {}),
    "class-pairs-accumulated-clipped": (_model, _class_batches, {"steps": 3, "max_grad_norm": 0.5}),
    "token-dicts-accumulated": (TinyLM, _token_batches, {"steps": 2}),
}


def _by_hand(model, batches, accumulator):
    """examples/hand_written_loop.py's loop body: forward_micro_batch and the accumulator's calls."""
    for batch, last_batch in tw.mark_last(batches):
        last = accumulator.ends_window(last=last_batch)
        with accumulator.sync_context(model, last=last):
            micro = tw.forward_micro_batch(model, batch, device=torch.device("cpu"))
            accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)
        if last:
            accumulator.step()


def _by_the_trainers_step(model, batches, accumulator):
    """The Trainer's path: its batch conventions (Trainer.forward_function) through one TrainStep."""
    trainer = tw.Trainer(device="cpu", precision="fp32", progress="off")
    forward = trainer.forward_function(tw.resolve_precision("fp32", torch.device("cpu")), torch.device("cpu"))
    step = tw.TrainStep(model, accumulator, forward, tw.MetricSet(torch.device("cpu")))
    for batch, last in tw.mark_last(batches):
        step.add(batch, last=last)


@pytest.mark.parametrize("case", list(CASES))
def test_the_trainers_step_and_the_accumulator_primitive_give_bitwise_identical_parameters(case):
    """One arithmetic: the same batches through the Trainer's step and through a hand-written loop of the
    accumulator's calls end with the same parameters and Adam state, bit for bit, and the steps taken agree."""
    build, make_batches, options = CASES[case]
    ends = []
    for run in (_by_hand, _by_the_trainers_step):
        model = build()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        accumulator = tw.GradientAccumulator(optimizer, **options)
        run(model, make_batches(), accumulator)
        ends.append((model.state_dict(), optimizer.state_dict()["state"], accumulator.optimizer_steps))
    (state_a, opt_a, steps_a), (state_b, opt_b, steps_b) = ends
    assert steps_a == steps_b == -(-len(make_batches()) // options.get("steps", 1))
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key
    for index, entry in opt_a.items():
        for name, value in entry.items():
            assert torch.equal(value, opt_b[index][name]), (index, name)


def test_a_token_window_of_the_trainers_step_is_the_full_batch_gradient():
    """The defaults weight a window's micro-batches by their tokens: one SGD step of lr 1 over a window of three
    ragged dict batches is minus the gradient of the token mean over the three batches at once."""
    batches = _token_batches()[:3]
    full = TinyLM()
    logits = torch.cat([full(b["input_ids"]).flatten(0, 1) for b in batches])
    labels = torch.cat([b["labels"].flatten() for b in batches])
    nn.functional.cross_entropy(logits, labels, ignore_index=-100).backward()
    model = TinyLM()
    before = [p.detach().clone() for p in model.parameters()]
    _by_the_trainers_step(model, batches, tw.GradientAccumulator(torch.optim.SGD(model.parameters(), lr=1.0), steps=3))
    for start, after, reference in zip(before, model.parameters(), full.parameters(), strict=True):
        torch.testing.assert_close(start - after.detach(), reference.grad, rtol=1e-5, atol=1e-6)


def test_the_way_a_batch_takes_is_decided_by_the_declared_conventions():
    """The defaults take the short way for pairs of tensors with class targets; any loss_fn (a functools.partial
    of cross-entropy too), split_batch, token count or summed loss declares conventions it does not cover."""
    assert tw.data.BatchConventions().pairs
    assert tw.data.BatchConventions(device="cpu", count="samples").pairs
    for options in ({"loss_fn": functools.partial(nn.functional.cross_entropy)},
                    {"split": lambda batch: (batch[0], batch[1])}, {"count": "tokens"}, {"reduction": "sum"}):
        assert not tw.data.BatchConventions(**options).pairs, options


def _counting_forward_micro_batch(monkeypatch):
    """forward_micro_batch (the general rules) with its calls counted, as BatchConventions calls it."""
    import trainwise.data.batches as batches

    calls, real = [], batches.forward_micro_batch

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(batches, "forward_micro_batch", counted)
    return calls


@pytest.mark.parametrize("dict_call", [0, 3])
def test_the_short_way_ends_bitwise_where_the_general_rules_end(dict_call, monkeypatch):
    """Pairs of tensors under the default conventions take the short way (the model, cross-entropy) once the
    first batch chose to count samples; the same forward wrapped in a function, or given as a functools.partial
    of forward_micro_batch, takes the general rules every batch: no forward is looked inside. Batches of
    other kinds (a dict) and a forward that returns another kind of output change nothing either."""
    calls = _counting_forward_micro_batch(monkeypatch)
    conventions = tw.data.BatchConventions(device="cpu")
    forwards = {"conventions": conventions, "function": lambda model, batch: conventions(model, batch),
                "partial": functools.partial(tw.data.batches.forward_micro_batch, device=torch.device("cpu"))}
    results, general = [], {}
    for name, forward in forwards.items():
        model = LogitsOrDict(dict_call)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        accumulator = tw.GradientAccumulator(optimizer, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2))
        metrics = tw.MetricSet(torch.device("cpu"))
        guard = NonFiniteLossGuard(model=model)
        step = tw.TrainStep(model, accumulator, forward, metrics, loss_guard=guard)
        calls.clear()
        assert all(step.add(batch, last=False) for batch in _batches())
        general[name] = len(calls)
        results.append((model.state_dict(), optimizer.state_dict()["state"], metrics.compute(),
                        accumulator.optimizer_steps, optimizer.param_groups[0]["lr"], guard._steps))
    # the conventions (also when a function calls them): the first batch (the count chosen) and the dict batch
    assert general == {"conventions": 2, "function": 2, "partial": 6}
    (state_a, opt_a, values_a, *rest_a) = results[0]
    for state_b, opt_b, values_b, *rest_b in results[1:]:
        assert rest_a == rest_b and rest_a[0] == 6
        assert values_a == values_b and set(values_a) == {"loss", "accuracy"}
        for key in state_a:
            assert torch.equal(state_a[key], state_b[key]), key
        for index, entry in opt_a.items():
            for name, value in entry.items():
                assert torch.equal(value, opt_b[index][name]), (index, name)


def test_a_custom_loss_wrapped_in_functools_partial_changes_neither_the_way_nor_the_result(monkeypatch):
    """A loss_fn given as a functools.partial or as a lambda around the same function: the same conventions (the
    general rules for every batch) and the same parameters, bit for bit."""
    calls = _counting_forward_micro_batch(monkeypatch)
    losses = {"partial": functools.partial(nn.functional.cross_entropy, label_smoothing=0.1),
              "lambda": lambda logits, targets: nn.functional.cross_entropy(logits, targets, label_smoothing=0.1)}
    ends = {}
    for name, loss_fn in losses.items():
        model = _model()
        accumulator = tw.GradientAccumulator(torch.optim.Adam(model.parameters(), lr=0.01), steps=2)
        step = tw.TrainStep(model, accumulator, tw.data.BatchConventions(loss_fn=loss_fn),
                            tw.MetricSet(torch.device("cpu")))
        calls.clear()
        for batch, last in tw.mark_last(_class_batches()):
            step.add(batch, last=last)
        ends[name] = (len(calls), model.state_dict())
    (calls_a, state_a), (calls_b, state_b) = ends.values()
    assert calls_a == calls_b == len(_class_batches())
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


def test_a_loss_without_gradient_is_refused_on_the_short_way_as_on_the_first_batch():
    model = _model()
    accumulator = tw.GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1))
    step = tw.TrainStep(model, accumulator, tw.data.BatchConventions(), tw.MetricSet(torch.device("cpu")))
    batches = _batches()
    step.add(batches[0], last=False)
    model.requires_grad_(False)
    with pytest.raises(tw.TrainwiseError, match="does not require grad"):
        step.add(batches[1], last=False)
    assert accumulator.optimizer_steps == 1
