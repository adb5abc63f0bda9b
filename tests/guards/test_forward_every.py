"""``forward_every``: the forward hooks on one optimizer step in k, every forward inside ``watching_forwards()``;
mistakes that repeat every step are still found, and the Trainer watches its callbacks' forwards."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainwise as tw


def _setup(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, list]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(12)]
    return model, optimizer, data


def _hooked(model: nn.Module) -> bool:
    """Whether a forward of the model runs the guard's checks now: its hooks, or its wrapped forward switched on."""
    wrapper = vars(model).get("forward")
    on = wrapper is not None and wrapper.guard.checks_forward_now()
    return bool(model._forward_hooks or model._forward_pre_hooks or on)


def _untouched(model: nn.Module) -> bool:
    return not (model._forward_hooks or model._forward_pre_hooks or "forward" in vars(model))


def test_forward_hooks_are_on_for_one_step_in_k_and_gone_after_close():
    model, optimizer, data = _setup()
    seen = []
    with tw.guard(model, optimizer, forward_every=4, checks=["TW102", "TW112"]):
        for x, y in data:
            seen.append(_hooked(model))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    assert seen == [step % 4 == 0 for step in range(12)]
    assert _untouched(model) and not optimizer._optimizer_step_post_hooks


def test_a_mistake_that_repeats_is_found_with_forward_every():
    model, optimizer, data = _setup()
    kept = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tw.guard(model, optimizer, forward_every=4, checks=["TW102"]) as guard:
            for x, y in data:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                kept.append(loss)  # the mistake: every step's graph stays alive
    assert [f.code for f in guard.findings] == ["TW102"]
    assert guard.findings[0].step == 3  # the forward before step 1 is watched: seen after step 3, as with k=1
    assert any(issubclass(w.category, tw.guards.GuardWarning) for w in caught)


def test_watching_forwards_checks_every_forward_inside_and_restores_the_schedule():
    model, optimizer, data = _setup()
    guard = tw.Guard(model, optimizer, forward_every=4, action="record", checks=["TW103"])
    for x, y in data[:2]:  # after step 1: off
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert not _hooked(model)
    model.train()
    with guard.watching_forwards():
        with guard.watching_forwards():  # nested
            assert _hooked(model)
        assert _hooked(model)
        with torch.no_grad():
            model(data[0][0])  # an evaluation in train mode: the mistake TW103 reports
    assert not _hooked(model)
    assert [f.code for f in guard.findings] == ["TW103"]
    guard.close()
    assert _untouched(model)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_forward_every_must_be_a_positive_integer(bad):
    model, optimizer, _ = _setup()
    with pytest.raises(tw.TrainwiseError, match="forward_every must be a positive integer"):
        tw.guard(model, optimizer, forward_every=bad)


class _EvaluatesInTrainMode:
    """A callback with the mistake TW103 reports: it evaluates under no_grad without model.eval()."""

    def __init__(self, inputs: torch.Tensor) -> None:
        self.inputs = inputs

    def on_epoch_end(self, state) -> None:
        with torch.no_grad():
            state.model(self.inputs)


class _KeepsOutputs(nn.Module):
    """A model that keeps every training output, graph and all (what TW102 reports)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 3))
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.kept.append(out)
        return out


def _fit(tmp_path, model, callbacks=()):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 4, generator=g), torch.randint(0, 3, (96,), generator=g))
    tw.Trainer(epochs=1, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False, checkpoints=False,
               run_dir=str(tmp_path / "run"), callbacks=list(callbacks)).fit(model, data)
    return [(r["code"], r["step"]) for r in tw.read_log(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "guard"]


def test_the_trainer_watches_the_forwards_its_callbacks_run(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 3))
    # 12 steps: the epoch ends after step 11, whose forwards the schedule does not watch
    assert _fit(tmp_path, model, [_EvaluatesInTrainMode(torch.randn(2, 4))]) == [("TW103", 12)]


def test_the_trainer_finds_a_model_that_keeps_its_graphs(tmp_path):
    torch.manual_seed(0)
    assert _fit(tmp_path, _KeepsOutputs()) == [("TW102", 3)]  # as without the schedule


class _EvaluatesWithAutograd:
    """A callback with the mistake TW104 reports: eval mode, but no torch.no_grad()."""

    def __init__(self, inputs: torch.Tensor) -> None:
        self.inputs = inputs

    def on_epoch_end(self, state) -> None:
        state.model.eval()
        state.model(self.inputs).sum()
        state.model.train()


def test_an_evaluation_with_autograd_in_a_callback_is_reported(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 3))
    assert [code for code, _ in _fit(tmp_path, model, [_EvaluatesWithAutograd(torch.randn(2, 4))])] == ["TW104"]


@pytest.mark.slow
def test_a_model_compiled_after_the_guard_is_not_recompiled_by_the_schedule():
    """The wrapped forward traced by torch.compile never reads the step count in traced code (dynamo would
    specialise on it and recompile every step): at most the two variants, with and without checks to call."""
    from torch._dynamo.utils import counters

    model, optimizer, data = _setup()
    torch._dynamo.reset()
    counters.clear()
    compiled = None
    with tw.guard(model, optimizer, forward_every=8, action="record") as guard:
        compiled = torch.compile(model, backend="eager")
        for _ in range(4):
            for x, y in data:  # 48 steps, gradients never zeroed
                nn.functional.cross_entropy(compiled(x), y).backward()
                optimizer.step()
    assert counters["stats"]["unique_graphs"] <= 2
    assert [f.code for f in guard.findings] == ["TW105"]
