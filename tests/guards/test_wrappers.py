"""The guard on wrapped models and optimizers: it checks the user's module and the optimizer that really steps,
whatever wraps them (the real Accelerate, Lightning and torch.compile wrappers are in tests/ecosystem/)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainwise as tw
from trainwise.wrappers import optimizer_layers, unwrap_model, unwrap_optimizer


class _Wrapper:
    """An optimizer wrapper of the common kind (DeepSpeed's, many schedulers-as-optimizers): not a torch
    optimizer itself, ``.optimizer`` the wrapped one, ``step`` and ``zero_grad`` forwarded."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_unwrap_optimizer_follows_optimizer_attributes_to_the_torch_optimizer():
    optimizer = torch.optim.SGD(_model().parameters(), lr=0.1)
    twice = _Wrapper(_Wrapper(optimizer))
    assert unwrap_optimizer(optimizer) is optimizer
    assert unwrap_optimizer(twice) is optimizer
    assert optimizer_layers(twice) == [twice, twice.optimizer, optimizer]
    loop = _Wrapper(None)
    loop.optimizer = loop  # not a torch optimizer: left as it is
    assert unwrap_optimizer(loop) is loop


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_wrapped_optimizer_is_guarded_through_the_optimizer_inside(set_to_none):
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = _Wrapper(_Wrapper(inner))
    with tw.guard(model, optimizer, action="record") as guard:
        for _ in range(4):
            optimizer.zero_grad(set_to_none=set_to_none)  # in place when False: only the spy sees it
            model(torch.randn(3, 4)).pow(2).mean().backward()
            optimizer.step()
    assert guard.optimizer is inner and guard.step == 4 and guard.findings == []
    assert "zero_grad" not in vars(optimizer) and "zero_grad" not in vars(inner)  # the spies are gone
    with tw.guard(model, optimizer, action="record") as guard:
        for _ in range(3):
            model(torch.randn(3, 4)).pow(2).mean().backward()
            optimizer.step()
    assert [f.code for f in guard.findings] == ["TW105"]


def test_something_that_is_no_optimizer_is_one_sentence():
    with pytest.raises(tw.TrainwiseError, match="optimizer must be a torch optimizer, got _Wrapper"):
        tw.guard(_model(), _Wrapper(object()))


def test_a_wrapped_model_is_checked_as_the_users_module():
    model = _model()
    model[0].requires_grad = False  # TW110, named as in the user's module
    wrapped = nn.DataParallel(model)  # on a machine without GPUs it just calls the module
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tw.guard(wrapped, optimizer, action="record") as guard:
        wrapped(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    assert guard.model is model is unwrap_model(wrapped)
    assert [(f.code, f.where) for f in guard.findings] == [("TW110", "0")]


def test_other_wrappers_must_wrap_the_guarded_model():
    with pytest.raises(tw.TrainwiseError, match="other_wrappers must wrap the guarded model"):
        tw.Guard(_model(), other_wrappers=[nn.DataParallel(_model())])
