"""Unfreezing keeps every torch scheduler working: the new groups follow the schedule from its current position.

Each case builds a model whose backbone is frozen, an optimizer over the head (two groups: decay and no decay),
and a scheduler; it steps, unfreezes the backbone into the optimizer with its own learning rate, and steps on.
The reference is a second optimizer that had all four groups from the start, under the same schedule (per-group
arguments written out where the schedule has them), stepped in lockstep: every group's learning rate (and
momentum, for the cycling schedulers) must match at every step, before and after the unfreeze.
"""

import copy
import math
import warnings
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as sched
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError
from trainwise.freezing import extend_optimizer, freeze, frozen_norm_layers, param_groups, unfreeze, unfreeze_into

LR, BACKBONE_LR = 0.1, 0.01
PATTERNS = {"backbone.*": BACKBONE_LR}
BEFORE, AFTER = 4, 7  # steps before the unfreeze, steps after


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        backbone=nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)),
        head=nn.Linear(3, 2),
    ))
    freeze(model, "backbone")
    return model


def _reference_optimizer(scales, *, momentum=True):
    """Four groups from the start: the head's two, then the backbone's two at ``scales`` of their base lr."""
    groups = [{"params": [nn.Parameter(torch.zeros(1))], "lr": LR * scale} for scale in scales]
    return torch.optim.SGD(groups, lr=LR, momentum=0.9 if momentum else 0.0)


def _lambda(epoch):
    return 1.0 / (epoch + 1)


def _warm(epoch):
    return min(1.0, (epoch + 1) / 3)


def _decay(epoch):
    return 0.9


# name -> factory(optimizer, ref): ``ref`` is True for the four-group reference optimizer
CASES = {
    "StepLR": lambda opt, ref: sched.StepLR(opt, step_size=2, gamma=0.5),
    "MultiStepLR": lambda opt, ref: sched.MultiStepLR(opt, milestones=[2, 6], gamma=0.3),
    "ExponentialLR": lambda opt, ref: sched.ExponentialLR(opt, gamma=0.9),
    "CosineAnnealingLR": lambda opt, ref: sched.CosineAnnealingLR(opt, T_max=5, eta_min=0.001),
    "CosineAnnealingWarmRestarts": lambda opt, ref: sched.CosineAnnealingWarmRestarts(
        opt, T_0=3, T_mult=2, eta_min=0.001),
    "LambdaLR": lambda opt, ref: sched.LambdaLR(opt, _lambda),
    "LambdaLR per group": lambda opt, ref: sched.LambdaLR(
        opt, [_lambda, _warm, _lambda, _lambda] if ref else [_lambda, _warm]),  # new groups copy group 0's
    "MultiplicativeLR": lambda opt, ref: sched.MultiplicativeLR(opt, _decay),
    "LinearLR": lambda opt, ref: sched.LinearLR(opt, start_factor=0.25, total_iters=6),
    "ConstantLR": lambda opt, ref: sched.ConstantLR(opt, factor=0.5, total_iters=6),
    "PolynomialLR": lambda opt, ref: sched.PolynomialLR(opt, total_iters=9, power=2.0),
    "OneCycleLR": lambda opt, ref: sched.OneCycleLR(
        opt, max_lr=[1.0, 1.0, 0.1, 0.1] if ref else 1.0, total_steps=BEFORE + AFTER + 4),
    "OneCycleLR three-phase linear": lambda opt, ref: sched.OneCycleLR(
        opt, max_lr=[1.0, 1.0, 0.1, 0.1] if ref else 1.0, total_steps=BEFORE + AFTER + 4, three_phase=True,
        anneal_strategy="linear"),
    "CyclicLR": lambda opt, ref: sched.CyclicLR(
        opt, base_lr=[0.01, 0.01, 0.001, 0.001] if ref else 0.01, max_lr=[0.1, 0.1, 0.01, 0.01] if ref else 0.1,
        step_size_up=3, mode="triangular2"),
    "SequentialLR, switch before": lambda opt, ref: sched.SequentialLR(
        opt, [sched.LinearLR(opt, start_factor=0.5, total_iters=2), sched.ExponentialLR(opt, gamma=0.8)],
        milestones=[2]),
    "SequentialLR, switch after": lambda opt, ref: sched.SequentialLR(
        opt, [sched.LambdaLR(opt, _warm), sched.CosineAnnealingLR(opt, T_max=4)], milestones=[6]),
    "ChainedScheduler": lambda opt, ref: sched.ChainedScheduler(
        [sched.ConstantLR(opt, factor=0.5, total_iters=5), sched.ExponentialLR(opt, gamma=0.9)]),
}
SCALES = [1.0, 1.0, BACKBONE_LR / LR, BACKBONE_LR / LR]


def _step(optimizer, scheduler, step):
    optimizer.step()
    if isinstance(scheduler, sched.ReduceLROnPlateau):
        scheduler.step(float(step))  # a worsening metric: the lr is cut after every `patience` epochs
    else:
        scheduler.step()


def _state(optimizer, key):
    values = []
    for group in optimizer.param_groups:
        if key == "momentum" and "betas" in group:
            values.append(group["betas"][0])
        else:
            values.append(float(group[key]))
    return values


def _assert_same(optimizer, reference, step, *, momentum):
    got, want = _state(optimizer, "lr"), _state(reference, "lr")[: len(optimizer.param_groups)]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15), f"lr at step {step}"
    if momentum:
        got, want = _state(optimizer, "momentum"), _state(reference, "momentum")[: len(optimizer.param_groups)]
        assert got == pytest.approx(want, rel=1e-9), f"momentum at step {step}"


def _run_case(factory, *, patterns=PATTERNS, scales=SCALES, check_momentum=False):
    model = _model()
    optimizer = torch.optim.SGD(param_groups(model), lr=LR, momentum=0.9)
    scheduler = factory(optimizer, False)
    reference = _reference_optimizer(scales)
    ref_scheduler = factory(reference, True)
    _assert_same(optimizer, reference, 0, momentum=check_momentum)
    for step in range(1, BEFORE + 1):
        _step(optimizer, scheduler, step)
        _step(reference, ref_scheduler, step)
        _assert_same(optimizer, reference, step, momentum=check_momentum)
    unfreeze(model, "backbone")
    added = extend_optimizer(optimizer, model, lr_by_pattern=patterns, scheduler=scheduler)
    assert sorted(added) == ["backbone.0.bias", "backbone.0.weight", "backbone.1.bias", "backbone.1.weight"]
    assert len(optimizer.param_groups) == 4
    _assert_same(optimizer, reference, BEFORE, momentum=check_momentum)  # placed at the current position
    assert list(map(float, scheduler.get_last_lr())) == pytest.approx(_state(optimizer, "lr"), rel=1e-12)
    for step in range(BEFORE + 1, BEFORE + AFTER + 1):
        _step(optimizer, scheduler, step)
        _step(reference, ref_scheduler, step)
        _assert_same(optimizer, reference, step, momentum=check_momentum)
    return model, optimizer, scheduler


@pytest.mark.parametrize("name", list(CASES))
def test_new_groups_follow_the_schedule_across_an_unfreeze(name):
    cycling = name.startswith(("OneCycleLR", "CyclicLR"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own warnings about stepping order
        _run_case(CASES[name], check_momentum=cycling)


def test_reduce_lr_on_plateau_follows_the_reductions():
    def factory(opt, ref):
        return sched.ReduceLROnPlateau(opt, factor=0.5, patience=1)

    _, optimizer, scheduler = _run_case(factory)
    assert len(scheduler.min_lrs) == 4
    assert optimizer.param_groups[2]["lr"] < BACKBONE_LR  # the reductions before the unfreeze were applied


def test_reduce_lr_on_plateau_with_per_group_min_lrs():
    def factory(opt, ref):
        return sched.ReduceLROnPlateau(opt, factor=0.5, patience=0, min_lr=[0.0, 0.0, 0.0, 0.0] if ref else [0.0, 0.0])

    _, _, scheduler = _run_case(factory)
    assert scheduler.min_lrs == [0.0, 0.0, 0.0, 0.0]


def test_without_patterns_the_new_groups_copy_the_schedule_of_the_group_with_their_name():
    # no lr_by_pattern: the new groups are named "default" and "default (no decay)" like the head's, and take
    # those groups' lambdas (the second one is _warm)
    def factory(opt, ref):
        return sched.LambdaLR(opt, [_lambda, _warm, _lambda, _warm] if ref else [_lambda, _warm])

    _run_case(factory, patterns=None, scales=[1.0, 1.0, 1.0, 1.0])


def test_one_cycle_without_patterns_gives_the_new_groups_the_same_cycle():
    def factory(opt, ref):
        return sched.OneCycleLR(opt, max_lr=1.0, total_steps=BEFORE + AFTER + 4)

    _, optimizer, _ = _run_case(factory, patterns=None, scales=[1.0, 1.0, 1.0, 1.0], check_momentum=True)
    assert optimizer.param_groups[2]["max_lr"] == 1.0


@pytest.mark.parametrize("name", ["LambdaLR per group", "OneCycleLR", "CyclicLR", "SequentialLR, switch after",
                                  "ChainedScheduler", "CosineAnnealingWarmRestarts", "MultiplicativeLR"])
def test_scheduler_state_dict_round_trips_after_the_extension(name):
    """Save after the unfreeze, go on; then a fresh run (same unfreeze replayed) loads the state and goes on alike."""
    factory = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _, optimizer, scheduler = _run_case(factory, check_momentum=False)
        saved = copy.deepcopy((optimizer.state_dict(), scheduler.state_dict()))
        expected = []
        for step in range(3):
            _step(optimizer, scheduler, step)
            expected.append((_state(optimizer, "lr"), _state(optimizer, "momentum")))
        fresh_model = _model()
        fresh_optimizer = torch.optim.SGD(param_groups(fresh_model), lr=LR, momentum=0.9)
        fresh_scheduler = factory(fresh_optimizer, False)
        unfreeze_into(fresh_model, fresh_optimizer, "backbone", lr_by_pattern=PATTERNS, scheduler=fresh_scheduler)
        fresh_optimizer.load_state_dict(saved[0])
        fresh_scheduler.load_state_dict(saved[1])
        assert fresh_scheduler.state_dict().keys() == scheduler.state_dict().keys()
        for step in range(3):
            _step(fresh_optimizer, fresh_scheduler, step)
            got = (_state(fresh_optimizer, "lr"), _state(fresh_optimizer, "momentum"))
            assert got[0] == pytest.approx(expected[step][0], rel=1e-12)
            assert got[1] == pytest.approx(expected[step][1], rel=1e-12)


class OwnScheduler(sched.LambdaLR):
    """A user's scheduler with per-group state that extend_optimizer cannot know about."""

    def __init__(self, optimizer):
        self.warmups = [3] * len(optimizer.param_groups)
        super().__init__(optimizer, lambda epoch: 1.0)


class Stepper:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        pass


@pytest.mark.parametrize("make", [
    OwnScheduler,
    Stepper,
    lambda opt: sched.ChainedScheduler([sched.CosineAnnealingLR(opt, T_max=4, eta_min=0.01),
                                        sched.ExponentialLR(opt, gamma=0.9)]),
    lambda opt: sched.StepLR(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), step_size=2),
], ids=["subclass", "unknown class", "chained cosine with eta_min", "another optimizer"])
def test_a_scheduler_that_cannot_be_extended_is_refused_before_anything_changes(make):
    model = _model()
    optimizer = torch.optim.SGD(param_groups(model), lr=LR, momentum=0.9)
    scheduler = make(optimizer)
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups])
    state_before = copy.deepcopy({k: v for k, v in vars(scheduler).items() if k != "optimizer"})
    with pytest.raises(TrainwiseError) as info:
        unfreeze_into(model, optimizer, "backbone", lr_by_pattern=PATTERNS, scheduler=scheduler)
    message = str(info.value)
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence
    assert "unfreeze before creating the scheduler" in message or "this optimizer" in message
    assert [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == groups_before
    assert {k: v for k, v in vars(scheduler).items() if k != "optimizer"}.keys() == state_before.keys()
    assert getattr(scheduler, "base_lrs", None) == state_before.get("base_lrs")
    assert not any(p.requires_grad for p in model.backbone.parameters())  # nothing unfrozen either
    assert frozen_norm_layers(model) == ["backbone.1"]


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g))


@pytest.mark.parametrize("make", [
    lambda opt: sched.LambdaLR(opt, lambda epoch: 0.9 ** epoch),
    lambda opt: sched.OneCycleLR(opt, max_lr=0.05, total_steps=9),
    lambda opt: sched.CyclicLR(opt, base_lr=0.001, max_lr=0.01, step_size_up=2),
    lambda opt: sched.SequentialLR(opt, [sched.LinearLR(opt, start_factor=0.1, total_iters=2),
                                         sched.CosineAnnealingLR(opt, T_max=10)], milestones=[2]),
    lambda opt: sched.ReduceLROnPlateau(opt, factor=0.5, patience=0, min_lr=[1e-5, 1e-5]),
], ids=["LambdaLR", "OneCycleLR", "CyclicLR", "SequentialLR", "ReduceLROnPlateau"])
def test_trainer_unfreezes_with_a_scheduler(tmp_path, make):
    model = _model()
    seen = {}

    def factory(optimizer):
        seen["scheduler"] = make(optimizer)
        seen["optimizer"] = optimizer
        return seen["scheduler"]

    result = Trainer(epochs=3, batch_size=16, unfreeze_at={2: ["backbone"]}, scheduler=factory, device="cpu",
                     progress="off", plot=False, checkpoints=False, run_dir=str(tmp_path / "run")).fit(model, _data())
    assert result.stopped == "completed"
    optimizer, scheduler = seen["optimizer"], seen["scheduler"]
    assert len(optimizer.param_groups) == 4 and all(p.requires_grad for p in model.parameters())
    lrs = [float(g["lr"]) for g in optimizer.param_groups]
    assert all(math.isfinite(lr) and lr > 0 for lr in lrs)
    assert list(map(float, scheduler.get_last_lr())) == pytest.approx(lrs)
    # the backbone's groups (no lr_by_pattern: named like the head's) follow the head's schedule exactly
    assert lrs[2:] == pytest.approx(lrs[:2], rel=1e-9)


def test_a_group_that_cannot_be_placed_rolls_the_unfreeze_back():
    # every base lr is 0: the position on an ExponentialLR schedule cannot be read from any group
    model = _model()
    optimizer = torch.optim.SGD(param_groups(model), lr=0.0)
    scheduler = sched.ExponentialLR(optimizer, gamma=0.9)
    with pytest.raises(TrainwiseError, match="unfreeze before creating the scheduler"):
        unfreeze_into(model, optimizer, "backbone", scheduler=scheduler)
    assert len(optimizer.param_groups) == 2 and len(scheduler.base_lrs) == 2
    assert not any(p.requires_grad for p in model.backbone.parameters())
    model.train()
    assert frozen_norm_layers(model) == ["backbone.1"] and model.backbone[1].training is False
