"""TW109 at run time: a step after a float16 autocast forward with no GradScaler (CPU autocast here)."""

from __future__ import annotations

import warnings

import pytest
import torch

import trainwise


def _setup() -> tuple[torch.nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randn(16, 4), torch.randn(16, 1)) for _ in range(4)]
    return model, optimizer, batches


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    x, y = batch
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        out = model(x)
    return torch.nn.functional.mse_loss(out.float(), y)


def _plain(model, optimizer, batches, dtype):
    for batch in batches:
        optimizer.zero_grad()
        _loss(model, batch, dtype).backward()
        optimizer.step()


def _scaled(model, optimizer, batches, enabled=True):
    scaler = torch.amp.GradScaler("cpu", enabled=enabled)
    for batch in batches:
        optimizer.zero_grad()
        scaler.scale(_loss(model, batch, torch.float16)).backward()
        scaler.step(optimizer)
        scaler.update()


def _silent(loop, *args) -> list[trainwise.guards.GuardFinding]:
    model, optimizer, batches = _setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW109"], check_every=2) as guard:
            loop(model, optimizer, batches, *args)
    assert guard.step > 0  # the optimizer stepped under the guard
    return guard.findings


def test_float16_without_scaler_is_reported_once():
    model, optimizer, batches = _setup()
    with (
        pytest.warns(trainwise.guards.GuardWarning, match="TW109") as caught,
        trainwise.guard(model, optimizer, checks=["TW109"], check_every=2) as guard,
    ):
        _plain(model, optimizer, batches, torch.float16)
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW109", "AdamW", 0)]
    assert "GradScaler" in guard.findings[0].message
    assert len([w for w in caught if issubclass(w.category, trainwise.guards.GuardWarning)]) == 1


def test_raise_action_raises_guard_error():
    model, optimizer, batches = _setup()
    with (
        pytest.raises(trainwise.guards.GuardError) as error,
        trainwise.guard(model, optimizer, action="raise", checks=["TW109"]),
    ):
        _plain(model, optimizer, batches, torch.float16)
    assert error.value.code == "TW109"


def test_disabled_scaler_is_reported():
    model, optimizer, batches = _setup()
    with (
        pytest.warns(trainwise.guards.GuardWarning, match="TW109"),
        trainwise.guard(model, optimizer, checks=["TW109"]) as guard,
    ):
        _scaled(model, optimizer, batches, False)
    assert [f.code for f in guard.findings] == ["TW109"]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_float32_and_bfloat16_are_silent(dtype):
    assert _silent(_plain, dtype) == []


def test_float16_with_scaler_is_silent():
    assert _silent(_scaled) == []


def test_gradient_accumulator_with_scaler_is_silent():
    def loop(model, optimizer, batches):
        accumulator = trainwise.GradientAccumulator(optimizer, steps=2, scaler=torch.amp.GradScaler("cpu"))
        for batch in batches:
            accumulator.backward(_loss(model, batch, torch.float16), count=len(batch[0]))
            if accumulator.window_full:
                accumulator.step()

    assert _silent(loop) == []


def test_float16_evaluation_under_no_grad_does_not_count():
    def loop(model, optimizer, batches):
        for batch in batches:
            optimizer.zero_grad()
            loss = _loss(model, batch, None)
            with torch.no_grad():
                _loss(model, batch, torch.float16)  # a float16 evaluation between backward and step
            loss.backward()
            optimizer.step()

    assert _silent(loop) == []


def test_only_sampled_steps_are_looked_at_and_a_late_float16_is_found_at_the_next(monkeypatch):
    from trainwise.guards import tw109_float16_without_scaler as tw109
    from trainwise.guards.check import sample_gap

    sample = sample_gap(0)  # steps 0, 32, 64 are sampled

    looked = []
    original = tw109.Float16WithoutScaler.before_step
    monkeypatch.setattr(tw109.Float16WithoutScaler, "before_step",
                        lambda self, optimizer: (looked.append(self.guard.step), original(self, optimizer))[1])
    model, optimizer, _ = _setup()
    batches = [(torch.randn(4, 4), torch.randn(4, 1)) for _ in range(2 * sample + 4)]
    with trainwise.guard(model, optimizer, checks=["TW109"], action="record") as guard:
        _scaled(model, optimizer, batches[: sample + 4])  # correct float16: its steps cost no frame walk
        assert looked == [0, sample] and guard.findings == []
        _plain(model, optimizer, batches[sample + 4:], torch.float16)  # the scaler dropped mid-run
    assert [(f.code, f.step) for f in guard.findings] == [("TW109", 2 * sample)]
