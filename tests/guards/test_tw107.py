"""TW107 at run time: frozen parameters in the optimizer's groups, trainable ones in no group."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import trainwise


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        optimizer.step()


def _guard(model: nn.Module, optimizer: torch.optim.Optimizer, **options: object) -> trainwise.Guard:
    return trainwise.guard(model, optimizer, checks=["TW107"], **options)  # type: ignore[arg-type]


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def test_frozen_parameters_in_the_optimizer_are_one_finding_at_install() -> None:
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(trainwise.guards.GuardWarning) as record, _guard(model, optimizer, check_every=2) as guard:
        _train(model, optimizer)
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW107", "0.weight", 0)]
    assert guard.findings[0].message.startswith("2 frozen parameter tensor(s)")
    assert [w.message.code for w in record if isinstance(w.message, trainwise.guards.GuardWarning)] == ["TW107"]


def test_trainable_parameters_in_no_group_are_one_finding() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model[2:].parameters(), lr=1e-3)
    with pytest.warns(trainwise.guards.GuardWarning), _guard(model, optimizer, check_every=2) as guard:
        _train(model, optimizer)
    assert [(f.code, f.where) for f in guard.findings] == [("TW107", "0.weight")]
    assert guard.findings[0].message.startswith("2 trainable parameter tensor(s)")


def test_action_raise_raises_when_the_guard_starts() -> None:
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(trainwise.guards.GuardError) as error:
        trainwise.guard(model, optimizer, action="raise", checks=["TW107"])
    assert (error.value.code, error.value.where) == ("TW107", "0.weight")


@pytest.mark.parametrize("freeze", [False, True])
def test_an_optimizer_over_exactly_the_trainable_parameters_is_silent(freeze: bool) -> None:
    model = _model()
    if freeze:  # frozen and excluded
        model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(_trainable(model), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with _guard(model, optimizer, check_every=2) as guard:
            _train(model, optimizer)
    assert guard.findings == []


def test_a_freeze_after_install_is_found_before_the_first_step() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(trainwise.guards.GuardWarning), _guard(model, optimizer, check_every=1000) as guard:
        model[4].requires_grad_(False)
        _train(model, optimizer, steps=1)
        assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW107", "4.weight", 0)]


def test_an_unfreeze_without_add_param_group_is_found_at_the_next_check() -> None:
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(_trainable(model), lr=0.1)
    with pytest.warns(trainwise.guards.GuardWarning), _guard(model, optimizer, check_every=3) as guard:
        _train(model, optimizer, steps=2)
        model[0].requires_grad_(True)
        _train(model, optimizer, steps=1)
        assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW107", "0.weight", 3)]


def test_an_unfreeze_with_add_param_group_is_silent() -> None:
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(_trainable(model), lr=0.1)
    with _guard(model, optimizer, check_every=1) as guard:
        _train(model, optimizer, steps=2)
        model[0].requires_grad_(True)
        optimizer.add_param_group({"params": list(model[0].parameters()), "lr": 0.01})
        _train(model, optimizer, steps=2)
    assert guard.findings == []


def test_without_an_optimizer_nothing_is_checked() -> None:
    model = _model()
    model[0].requires_grad_(False)
    with trainwise.guard(model, checks=["TW107"]) as guard:
        model(torch.randn(8, 4))
    assert guard.findings == []
