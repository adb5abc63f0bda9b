"""TW103 at run time: an evaluation under no_grad/inference_mode with dropout or BatchNorm in train mode."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import trainwise


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))


def _fit(model: nn.Module, guard: trainwise.Guard, *, evaluate: Callable[[nn.Module], None], epochs: int = 2,
         no_grad: Callable[[], object] = torch.no_grad) -> None:
    """A plain loop: a few SGD steps per epoch, then an evaluation prepared by ``evaluate``."""
    optimizer = guard.optimizer
    assert optimizer is not None
    for _ in range(epochs):
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
            loss.backward()
            optimizer.step()
        evaluate(model)
        with no_grad():
            for _ in range(2):
                model(torch.randn(8, 4))


def _guard(model: nn.Module, **options: object) -> trainwise.Guard:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return trainwise.guard(model, optimizer, checks=["TW103"], **options)  # type: ignore[arg-type]


def _forgot_eval(model: nn.Module) -> None:
    pass


def _calls_eval(model: nn.Module) -> None:
    model.eval()


@pytest.mark.parametrize("no_grad", [torch.no_grad, torch.inference_mode])
def test_an_evaluation_in_train_mode_is_one_finding_naming_the_first_module(no_grad: Callable[[], object]) -> None:
    model = _model()
    with pytest.warns(trainwise.guards.GuardWarning) as record, _guard(model) as guard:
        _fit(model, guard, evaluate=_forgot_eval, no_grad=no_grad)
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW103", "1", 3)]
    assert "model.eval()" in guard.findings[0].message and "1 more" in guard.findings[0].message
    assert [w.message.code for w in record if isinstance(w.message, trainwise.guards.GuardWarning)] == ["TW103"]


def test_action_raise_stops_the_evaluation_forward() -> None:
    model = _model()
    guard = _guard(model, action="raise")
    with pytest.raises(trainwise.guards.GuardError) as error:
        _fit(model, guard, evaluate=_forgot_eval)
    guard.close()
    assert (error.value.code, error.value.where) == ("TW103", "1")


def test_the_corrected_loop_is_silent() -> None:
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with _guard(model) as guard:
            _fit(model, guard, evaluate=_calls_eval)
    assert guard.findings == []


def test_a_later_evaluation_in_train_mode_is_found_too() -> None:
    model = _model()
    epochs = iter([_calls_eval, _forgot_eval])
    with pytest.warns(trainwise.guards.GuardWarning), _guard(model) as guard:
        _fit(model, guard, evaluate=lambda m: next(epochs)(m))
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW103", "1", 6)]


def test_a_model_without_dropout_or_batchnorm_is_silent_in_train_mode() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.LayerNorm(8), nn.Dropout(0.0), nn.Linear(8, 2))
    with _guard(model) as guard:
        _fit(model, guard, evaluate=_forgot_eval)
    assert guard.findings == []


def test_norm_layers_pinned_in_eval_by_freeze_are_silent() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    trainwise.freeze(model, "0", "1")
    optimizer = torch.optim.SGD(model[2].parameters(), lr=0.1)
    with trainwise.guard(model, optimizer, checks=["TW103"]) as guard:
        _fit(model, guard, evaluate=_forgot_eval)
    assert model.training and guard.findings == []


def test_a_no_grad_teacher_in_eval_during_training_is_silent() -> None:
    model = _model()
    teacher = copy.deepcopy(model).eval()
    with _guard(model) as guard:
        optimizer = guard.optimizer
        assert optimizer is not None
        for _ in range(4):
            x = torch.randn(8, 4)
            with torch.no_grad():
                target = teacher(x).softmax(-1)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), target).backward()
            optimizer.step()
    assert guard.findings == []


def test_without_an_optimizer_the_first_evaluation_is_checked() -> None:
    model = _model()
    with pytest.warns(trainwise.guards.GuardWarning), trainwise.guard(model, checks=["TW103"]) as guard, \
            torch.no_grad():
        model(torch.randn(8, 4))
    assert [(f.code, f.where) for f in guard.findings] == [("TW103", "1")]


def test_dropout_inside_a_recurrent_layer_counts_and_the_root_is_named() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 8, num_layers=2, dropout=0.2)
    with pytest.warns(trainwise.guards.GuardWarning), trainwise.guard(lstm, checks=["TW103"]) as guard, torch.no_grad():
        lstm(torch.randn(3, 2, 4))
    assert [(f.code, f.where) for f in guard.findings] == [("TW103", "(the model)")]
