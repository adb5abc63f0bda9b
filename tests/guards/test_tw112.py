"""TW112: a batch tensor on another device than the model fails, naming the field, in place of torch's error
(before it, where the guard hooks rather than wraps the forward); the "meta" device stands in for a second device
on a CPU-only machine."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import trainwise


class DictModel(torch.nn.Module):
    """Takes a dict batch, as transformers-style models take their fields."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.lin(batch["input"]) * batch["attention_mask"].unsqueeze(-1) * batch["extra"]["weight"]


class KwargModel(torch.nn.Module):
    """Takes its fields as keyword arguments, plus a scale and lengths that torch accepts on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: object = 1.0,
                lengths: torch.Tensor | None = None, name: str = "") -> torch.Tensor:
        out = self.lin(x) * scale
        return out if mask is None else out * mask


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *args, **kwargs) -> None:
    optimizer.zero_grad()
    model(*args, **kwargs).sum().backward()
    optimizer.step()


def _guarded(model: torch.nn.Module, action: str = "warn"):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return optimizer, trainwise.guard(model, optimizer, checks=["TW112"], action=action)


@pytest.mark.parametrize("action", ["warn", "raise"])
def test_dict_field_on_another_device_fails_naming_it(action):
    model = DictModel()
    optimizer, guard = _guarded(model, action)
    batch = {"input": torch.randn(8, 4), "attention_mask": torch.ones(8), "extra": {"weight": torch.ones(8, 1)}}
    _step(model, optimizer, batch)  # all on the CPU: fine
    batch["attention_mask"] = torch.ones(8, device="meta")
    with pytest.raises(trainwise.guards.GuardError) as error:
        model(batch)
    guard.close()
    assert [(f.code, f.where) for f in guard.findings] == [("TW112", 'batch["attention_mask"]')]
    assert error.value.where == 'batch["attention_mask"]'
    assert 'batch["attention_mask"] is on meta, the model on cpu' in str(error.value)
    assert "trainwise.move_to_device" in str(error.value)


def test_nested_field_is_named_by_its_path():
    model = DictModel()
    _optimizer, guard = _guarded(model)
    batch = {"input": torch.randn(8, 4), "attention_mask": torch.ones(8), "extra": {"weight": torch.ones(8, 1)}}
    batch["extra"]["weight"] = batch["extra"]["weight"].to("meta")
    with pytest.raises(trainwise.guards.GuardError, match=r'batch\["extra"\]\["weight"\] is on meta'):
        model(batch)
    guard.close()
    assert [f.where for f in guard.findings] == ['batch["extra"]["weight"]']


class NoNames(torch.nn.Module):
    """A ``forward(*inputs)``: fields are named by position."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, *inputs: object) -> torch.Tensor:
        return self.lin(inputs[0][0] + inputs[0][1])


def test_positional_and_keyword_tensors_are_named():
    model = KwargModel()
    _optimizer, guard = _guarded(model)
    with pytest.raises(trainwise.guards.GuardError, match=r"^TW112 .*x is on meta"):
        model(torch.randn(2, 4, device="meta"))
    with pytest.raises(trainwise.guards.GuardError, match="mask is on meta"):
        model(torch.randn(2, 4), mask=torch.ones(2, 1, device="meta"))
    guard.close()
    assert [f.where for f in guard.findings] == ["x", "mask"]
    nameless = NoNames()
    with (
        trainwise.guard(nameless, checks=["TW112"]) as nameless_guard,
        pytest.raises(trainwise.guards.GuardError, match=r"args\[0\]\[1\] is on meta"),
    ):
        nameless([torch.randn(2, 4), torch.randn(2, 4, device="meta")])
    assert [f.where for f in nameless_guard.findings] == ["args[0][1]"]


def test_model_moved_to_another_device_is_seen():
    model = KwargModel()
    optimizer, guard = _guarded(model)
    x = torch.randn(2, 4)
    _step(model, optimizer, x)
    model.to("meta")
    with pytest.raises(trainwise.guards.GuardError, match="x is on cpu, the model on meta"):
        model(x)
    model(x.to("meta"))  # on the model's new device: fine
    guard.close()
    assert [f.where for f in guard.findings] == ["x"]


def test_same_device_and_non_tensor_inputs_are_silent():
    model = KwargModel()
    optimizer, guard = _guarded(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        for _ in range(3):
            _step(model, optimizer, torch.randn(2, 4), mask=torch.ones(2, 1), scale=2.0, name="batch", lengths=None)
        _step(model, optimizer, x=torch.randn(2, 4), mask=None)
    guard.close()
    assert guard.findings == []


def test_cpu_scalars_and_lengths_pass_to_a_model_elsewhere():
    model = KwargModel().to("meta")
    _optimizer, guard = _guarded(model)
    x = torch.randn(2, 4, device="meta")
    model(x, scale=torch.tensor(2.0), lengths=torch.tensor([4, 3]))  # torch accepts both on the CPU
    guard.close()
    assert guard.findings == []


def test_tensor_on_a_device_of_a_split_model_passes():
    model = KwargModel()
    model.far = torch.nn.Linear(1, 1)  # after `lin`: not the first parameter
    _optimizer, guard = _guarded(model)
    model.far.to("meta")  # part of the model moved after the guard started
    model(torch.randn(2, 4), lengths=torch.ones(2, device="meta"))  # where `far` lives: accepted
    guard.close()
    assert guard.findings == []


def test_model_without_parameters_is_skipped():
    model = torch.nn.ReLU()
    with trainwise.guard(model, checks=["TW112"]) as guard:
        model(torch.randn(2, 4, device="meta"))
    assert guard.findings == []


def test_doctor_explains_tw112(capsys):
    from trainwise.cli import main

    assert main(["doctor", "--explain", "TW112"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# TW112 batch-on-another-device")
    assert "trainwise.guard" in out and "## Use instead" in out


class MovesItsInputs(torch.nn.Module):
    """Moves what it is given to its own device, as many models' forwards do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(self.lin.weight.device))


def test_a_model_that_moves_its_inputs_itself_is_not_reported():
    model = MovesItsInputs().to("meta")
    optimizer, guard = _guarded(model)
    for _ in range(3):
        _step(model, optimizer, torch.randn(2, 4))  # CPU inputs, a meta model: it moves them
    guard.close()
    assert guard.findings == []


def test_the_finding_is_caused_by_torchs_error_and_other_errors_pass_unchanged():
    model = KwargModel()
    _optimizer, guard = _guarded(model)
    with pytest.raises(trainwise.guards.GuardError, match="x is on meta") as error:
        model(torch.randn(2, 4, device="meta"))
    assert isinstance(error.value.__cause__, RuntimeError)  # torch's own message stays in the traceback
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as shape_error:
        model(torch.randn(2, 5))  # the wrong shape, on the right device: torch's error as it is
    assert not isinstance(shape_error.value, trainwise.guards.GuardError)
    guard.close()
    assert [f.where for f in guard.findings] == ["x"]


def test_a_batch_on_another_device_fails_on_steps_whose_forward_is_not_watched():
    model = KwargModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainwise.guard(model, optimizer, checks=["TW112"], forward_every=8) as guard:
        _step(model, optimizer, torch.randn(2, 4))  # step 0 watched; step 1 not
        assert not guard.checks_forward_now()
        with pytest.raises(trainwise.guards.GuardError, match="x is on meta"):
            model(torch.randn(2, 4, device="meta"))


def test_where_the_guard_hooks_the_forward_it_looks_before_torch():
    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = KwargModel()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    holder = Holder()
    seen = []
    with (
        trainwise.Guard(holder, checks=["TW112"], forwards=[holder.inner], on_finding=seen.append),
        pytest.raises(trainwise.guards.GuardError, match="x is on meta") as error,
    ):
        holder.inner(torch.randn(2, 4, device="meta"))  # a submodule called directly: a hook, not the wrapper
    assert error.value.__cause__ is None  # raised before the forward ran
    assert [f.where for f in seen] == ["x"]
