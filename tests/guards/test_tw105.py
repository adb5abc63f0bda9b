"""TW105 at run time: a step whose gradients still hold the previous step's, and loops that zero correctly."""

from __future__ import annotations

import warnings

import pytest
import torch

import trainwise
from trainwise.guards.check import sample_gap


def _pair_starts(steps):
    """The first steps of the judged pairs within ``steps`` steps: 0, then odd sample gaps apart."""
    starts = [0]
    while starts[-1] + sample_gap(starts[-1], odd=True) < steps:
        starts.append(starts[-1] + sample_gap(starts[-1], odd=True))
    return starts


FIRST, SECOND = _pair_starts(1000)[1:3]  # 33 and 66


def _setup(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(16, 4), torch.randn(16, 1)) for _ in range(6)]
    return model, optimizer, batches


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def _silent(loop) -> list[trainwise.guards.GuardFinding]:
    model, optimizer, batches = _setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW105"], check_every=2) as guard:
            loop(model, optimizer, batches)
    assert guard.step > 0  # the optimizer stepped under the guard
    return guard.findings


def test_loop_without_zero_grad_is_reported_once():
    model, optimizer, batches = _setup()
    with (
        pytest.warns(trainwise.guards.GuardWarning, match="TW105") as caught,
        trainwise.guard(model, optimizer, checks=["TW105"], check_every=2) as guard,
    ):
        for batch in batches:
            _loss(model, batch).backward()
            optimizer.step()
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW105", "SGD", 1)]
    assert "zero_grad" in guard.findings[0].message
    assert len([w for w in caught if issubclass(w.category, trainwise.guards.GuardWarning)]) == 1


def test_raise_action_raises_guard_error():
    model, optimizer, batches = _setup()
    with (
        pytest.raises(trainwise.guards.GuardError) as error,
        trainwise.guard(model, optimizer, action="raise", checks=["TW105"]),
    ):
        for batch in batches:
            _loss(model, batch).backward()
            optimizer.step()
    assert error.value.code == "TW105"


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_every_step_is_silent(set_to_none):
    def loop(model, optimizer, batches):
        for batch in batches:
            optimizer.zero_grad(set_to_none=set_to_none)
            _loss(model, batch).backward()
            optimizer.step()

    assert _silent(loop) == []


def test_model_zero_grad_is_silent():
    def loop(model, optimizer, batches):
        for batch in batches:
            model.zero_grad(set_to_none=False)
            _loss(model, batch).backward()
            optimizer.step()

    assert _silent(loop) == []


def test_accumulation_with_zero_grad_after_step_is_silent():
    def loop(model, optimizer, batches):
        for i, batch in enumerate(batches, start=1):
            (_loss(model, batch) / 3).backward()
            if i % 3 == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)

    assert _silent(loop) == []


def test_grad_set_to_none_by_hand_is_silent():
    def loop(model, optimizer, batches):
        for batch in batches:
            _loss(model, batch).backward()
            optimizer.step()
            for p in model.parameters():
                p.grad = None

    assert _silent(loop) == []


def test_gradient_accumulator_is_silent():
    def loop(model, optimizer, batches):
        accumulator = trainwise.GradientAccumulator(optimizer, steps=2)
        for batch in batches:
            accumulator.backward(_loss(model, batch), count=len(batch[0]))
            if accumulator.window_full:
                accumulator.step()

    assert _silent(loop) == []


def test_close_restores_zero_grad():
    model, optimizer, _ = _setup()
    guard = trainwise.guard(model, optimizer, checks=["TW105"])
    assert "zero_grad" in vars(optimizer) and "zero_grad" in vars(model)
    guard.close()
    assert "zero_grad" not in vars(optimizer) and "zero_grad" not in vars(model)
    assert optimizer.zero_grad.__func__ is torch.optim.SGD.zero_grad


def test_a_deep_copy_of_a_guarded_model_zeroes_only_its_own_gradients():
    """An EMA copy made while TW105 wraps zero_grad must not call the original model's zero_grad."""
    import copy

    import trainwise as tw

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tw.guard(model, optimizer, checks=["TW105"]):
        ema = copy.deepcopy(model)
        model(torch.randn(4, 3)).sum().backward()
        ema(torch.randn(4, 3)).sum().backward()
        ema.zero_grad()
        assert model.weight.grad is not None and ema.weight.grad is None


@pytest.mark.parametrize("zeroing", ["zero_grad", "by_hand", "none"])
def test_a_step_given_a_closure_is_judged_after_the_closure_ran(zeroing):
    """LBFGS (and Lightning's automatic optimization) zero the gradients and run backward inside
    ``step(closure)``, after the step's pre-hook: judged there, gradients set to None by hand in the closure
    used to be reported as TW105."""
    model, _, batches = _setup()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        for batch in batches:
            def closure(batch=batch):
                if zeroing == "zero_grad":
                    optimizer.zero_grad()
                elif zeroing == "by_hand":
                    for p in model.parameters():
                        p.grad = None
                loss = _loss(model, batch)
                loss.backward()
                return loss

            optimizer.step(closure)
    assert guard.step == len(batches)
    assert [f.code for f in guard.findings] == (["TW105"] if zeroing == "none" else [])


@pytest.mark.parametrize("zeroed_parity", [0, 1])
def test_zeroing_on_every_other_step_is_reported(zeroed_parity):
    """Pairs of steps are judged, not every step: their spacing is odd, so either phase of a loop that zeroes
    only on every other step has a pair with no zeroing between its steps."""
    model, optimizer, batches = _setup()
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        for i in range(FIRST + 2):
            if i % 2 == zeroed_parity:
                optimizer.zero_grad()
            _loss(model, batches[i % len(batches)]).backward()
            optimizer.step()
    assert [f.code for f in guard.findings] == ["TW105"]


def test_a_loop_that_stops_zeroing_late_is_reported_within_a_period():
    model, optimizer, batches = _setup()
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        for i in range(FIRST + 2):
            if i < 30:
                optimizer.zero_grad()
            _loss(model, batches[i % len(batches)]).backward()
            optimizer.step()
            if i == 29:
                assert guard.findings == []
    assert [f.code for f in guard.findings] == ["TW105"]
    assert 30 < guard.findings[0].step <= FIRST + 1  # the next judged pair after zeroing stopped


def test_the_zeroing_spies_are_set_for_the_judged_pairs_only():
    """Between judged pairs ``zero_grad`` is the optimizer's and the model's own: those steps cost nothing."""
    model, optimizer, batches = _setup()
    spied = []
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        for i in range(SECOND + 2):
            spied.append("zero_grad" in vars(optimizer) and "zero_grad" in vars(model))
            optimizer.zero_grad()
            _loss(model, batches[i % len(batches)]).backward()
            optimizer.step()
    # set for the pairs' steps 0-1, 33-34, 66-67 (from before the first step to the second step's pre-hook)
    assert [i for i, s in enumerate(spied) if s] == [0, 1, FIRST, FIRST + 1, SECOND, SECOND + 1]
    assert guard.findings == []
    assert "zero_grad" not in vars(optimizer) and "zero_grad" not in vars(model)


def test_a_zero_grad_set_by_the_user_between_pairs_is_spied_on_and_kept():
    model, optimizer, batches = _setup()
    calls = []
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        for i in range(SECOND + 2):
            if i == 3:  # between pairs: the user's own wrapper, which zeroes in place
                plain = optimizer.zero_grad

                def counted(*args, plain=plain, **kwargs):
                    calls.append(1)
                    return plain(*args, **kwargs)

                optimizer.zero_grad = counted
            optimizer.zero_grad(set_to_none=False)
            _loss(model, batches[i % len(batches)]).backward()
            optimizer.step()
        assert vars(optimizer)["zero_grad"] is counted  # after the pairs 33-34 and 66-67
    assert guard.findings == []  # its zeroing was seen, though the gradient tensors stay the same
    assert vars(optimizer)["zero_grad"] is counted and len(calls) == SECOND - 1


def test_a_wrapper_set_over_a_spy_stays_and_keeps_the_check_right():
    model, optimizer, batches = _setup()
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        spy = optimizer.zero_grad  # set for the first pair
        optimizer.zero_grad = lambda *a, **k: spy(*a, **k)  # someone wraps it in the pair
        wrapper = optimizer.zero_grad
        for i in range(SECOND + 2):
            optimizer.zero_grad(set_to_none=False)
            _loss(model, batches[i % len(batches)]).backward()
            optimizer.step()
        assert optimizer.zero_grad is wrapper
    assert guard.findings == []
    assert optimizer.zero_grad is wrapper  # close leaves another's wrapper in place


def test_the_judged_pairs_thin_out_as_the_run_goes_on():
    """Pairs 33, 33, 67, 133, 257 steps apart: all odd (both parities of an every-other-step loop are judged) and
    at most 257, so a long run pays for one pair in 257 steps and a loop that stops zeroing late is still found."""
    assert _pair_starts(1100) == [0, 33, 66, 133, 266, 523, 780, 1037]
    model, optimizer, batches = _setup()
    spied = []
    with trainwise.guard(model, optimizer, action="record", checks=["TW105"]) as guard:
        for i in range(540):
            spied.append("zero_grad" in vars(optimizer))
            if i < 300:
                optimizer.zero_grad()
            _loss(model, batches[i % len(batches)]).backward()
            optimizer.step()
    assert [i for i, s in enumerate(spied) if s] == [0, 1, 33, 34, 66, 67, 133, 134, 266, 267, 523, 524]
    assert [(f.code, f.step) for f in guard.findings] == [("TW105", 524)]
