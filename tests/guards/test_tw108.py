"""TW108 at run time: frozen norm layers with running statistics left in train mode while training."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import trainwise


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                      nn.Linear(8, 8), nn.BatchNorm1d(8, affine=False), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def _recipe() -> _Net:
    """The tutorial recipe: a backbone frozen with requires_grad_(False)."""
    torch.manual_seed(0)
    model = _Net()
    model.backbone.requires_grad_(False)
    return model


def _fit(model: _Net, guard: trainwise.Guard, *, after_train: Callable[[_Net], None] = lambda m: None,
         epochs: int = 2) -> None:
    """``model.train()`` each epoch, a few AdamW steps, then an evaluation."""
    optimizer = guard.optimizer
    assert optimizer is not None
    for _ in range(epochs):
        model.train()
        after_train(model)
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))


def _guard(model: _Net, **options: object) -> trainwise.Guard:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return trainwise.guard(model, optimizer, checks=["TW108"], **options)  # type: ignore[arg-type]


def _silent(model: _Net, **options: object) -> trainwise.Guard:
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with _guard(model) as guard:
            _fit(model, guard, **options)  # type: ignore[arg-type]
    return guard


def test_the_tutorial_recipe_is_one_finding_per_frozen_norm_layer() -> None:
    model = _recipe()
    before = model.backbone[1].num_batches_tracked.item()
    with pytest.warns(trainwise.guards.GuardWarning) as record, _guard(model) as guard:
        _fit(model, guard)
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW108", "backbone.1", 0),
                                                                   ("TW108", "backbone.4", 0)]
    assert "trainwise.freeze()" in guard.findings[0].message
    assert [w.message.where for w in record if isinstance(w.message, trainwise.guards.GuardWarning)] == [
        "backbone.1", "backbone.4"]
    assert model.backbone[1].num_batches_tracked.item() == before + 6  # the drift the finding is about


def test_action_raise_stops_the_first_training_forward() -> None:
    model = _recipe()
    guard = _guard(model, action="raise")
    with pytest.raises(trainwise.guards.GuardError) as error:
        _fit(model, guard)
    guard.close()
    assert (error.value.code, error.value.where, error.value.step) == ("TW108", "backbone.1", 0)


def test_freezing_with_trainwise_freeze_is_silent() -> None:
    torch.manual_seed(0)
    model = _Net()
    trainwise.freeze(model, "backbone")
    assert _silent(model).findings == []


def test_pin_frozen_norm_layers_after_the_recipe_is_silent() -> None:
    model = _recipe()
    trainwise.freezing.pin_frozen_norm_layers(model)
    assert _silent(model).findings == []


def test_the_backbone_put_in_eval_after_model_train_is_silent() -> None:
    model = _recipe()
    assert _silent(model, after_train=lambda m: m.backbone.eval()).findings == []


def test_trainable_norm_layers_are_silent() -> None:
    torch.manual_seed(0)
    assert _silent(_Net()).findings == []


def test_norm_layers_unfrozen_during_the_run_are_silent() -> None:
    torch.manual_seed(0)
    model = _Net()
    trainwise.freeze(model, "backbone")
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with _guard(model, check_every=1000) as guard:
            _fit(model, guard, epochs=1)
            trainwise.unfreeze(model, "backbone")  # released and trainable: in train mode on purpose
            assert guard.optimizer is not None
            guard.optimizer.add_param_group({"params": list(model.backbone.parameters())})
            _fit(model, guard, epochs=1)
    assert guard.findings == []


def test_a_no_grad_forward_in_train_mode_is_left_to_tw103() -> None:
    model = _recipe()
    with _guard(model) as guard, torch.no_grad():
        model.train()
        model(torch.randn(8, 4))
    assert guard.findings == []


def test_a_freeze_after_install_is_found_at_the_next_check() -> None:
    torch.manual_seed(0)
    model = _Net()
    with pytest.warns(trainwise.guards.GuardWarning), _guard(model, check_every=2) as guard:
        _fit(model, guard, epochs=1)
        model.backbone.requires_grad_(False)
        assert guard.findings == []
        _fit(model, guard, epochs=1)
    assert [(f.where, f.step) for f in guard.findings] == [("backbone.1", 4), ("backbone.4", 4)]
