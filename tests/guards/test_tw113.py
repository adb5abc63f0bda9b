"""TW113: the first parameter whose gradient was inf or NaN when the optimizer stepped, and that step."""

from __future__ import annotations

import warnings

import pytest
import torch

import trainwise


class Gain(torch.nn.Module):
    """Multiplies by sqrt(|value|): a value of zero gets a NaN gradient, its inputs a zero one."""

    def __init__(self) -> None:
        super().__init__()
        self.value = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.value.abs().sqrt()


class Gained(torch.nn.Module):
    """A linear layer, maybe an unused one (no gradients), and a gain: ``gain.value`` is the last parameter."""

    def __init__(self, unused: bool = True) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 1)
        self.unused = torch.nn.Linear(1, 1) if unused else None
        self.gain = Gain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain(self.body(x))


def _batches(n: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(n)]


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, zero_gain_at: int | None = None) -> None:
    for step, (x, y) in enumerate(_batches(), start=1):
        if step == zero_gain_at:
            with torch.no_grad():
                model.gain.value.zero_()  # what a bad update or initialisation would do
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("unused", [True, False], ids=["some-without-grad", "all-with-grad"])
def test_the_exact_step_and_parameter_are_named_when_every_step_is_checked(unused):
    torch.manual_seed(0)
    model = Gained(unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with (
        pytest.warns(trainwise.guards.GuardWarning, match="TW113") as caught,
        trainwise.guard(model, optimizer, checks=["TW113"], check_every=1) as guard,
    ):
        _train(model, optimizer, zero_gain_at=3)
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW113", "gain.value", 3)]
    assert "at step 3;" in guard.findings[0].message and "more of the" not in guard.findings[0].message
    assert len([w for w in caught if issubclass(w.category, trainwise.guards.GuardWarning)]) == 1
    assert not torch.isfinite(model.gain.value).all()  # the step did apply it


def test_a_check_names_the_steps_since_the_last_one_and_how_many_parameters_broke():
    # nothing runs per step: the check after step 4 sees the NaN that step 3 applied, which step 4 spread from
    # gain.value back into the linear layer; the first broken parameter in the optimizer's order is named
    torch.manual_seed(0)
    model = Gained(unused=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainwise.guard(model, optimizer, action="record", checks=["TW113"], check_every=2) as guard:
        _train(model, optimizer, zero_gain_at=3)
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW113", "body.weight", 4)]
    message = guard.findings[0].message
    assert "at one of steps 3-4" in message and "(and 2 more of the 3 parameters)" in message
    assert "check_every=1" in message


def test_raise_action_raises_guard_error_at_the_check():
    torch.manual_seed(0)
    model = Gained()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    with (
        pytest.raises(trainwise.guards.GuardError) as error,
        trainwise.guard(model, optimizer, action="raise", checks=["TW113"], check_every=4),
    ):
        _train(model, optimizer, zero_gain_at=2)
    assert (error.value.code, error.value.step) == ("TW113", 4)
    assert "at one of steps 1-4" in str(error.value)


def test_weights_already_broken_when_the_guard_starts_are_said_as_such():
    model = Gained()
    with torch.no_grad():
        model.body.bias.fill_(float("nan"))  # a broken checkpoint
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainwise.guard(model, optimizer, action="record", checks=["TW113"]) as guard:
        pass
    assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW113", "body.bias", 0)]
    assert "already inf or NaN when the guard started" in guard.findings[0].message


def test_nothing_runs_between_checks():
    model = Gained()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainwise.guard(model, optimizer, checks=["TW113"], check_every=1000) as guard:
        ops = []

        class Count(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ops.append(func)
                return func(*args, **(kwargs or {}))

        x = torch.randn(8, 4)
        loss = model(x).sum()
        loss.backward()
        with Count():
            optimizer.step()
        stepped_with_guard = list(ops)
        ops.clear()
        guard.close()
        with Count():
            optimizer.step()
    assert stepped_with_guard == ops  # the guarded step ran exactly the optimizer's own operations


def test_finite_training_is_silent():
    torch.manual_seed(0)
    model = Gained()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW113"], check_every=2) as guard:
            _train(model, optimizer)
    assert guard.step == 6 and guard.findings == []


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_grad_scaler_overflow_steps_are_silent(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # overflows at first: the scaler backs off
    with warnings.catch_warnings():
        warnings.simplefilter("error", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW113"], check_every=2) as guard:
            for x, y in _batches():
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    out = model(x)
                scaler.scale(torch.nn.functional.mse_loss(out.float(), y)).backward()
                scaler.step(optimizer)
                scaler.update()
    assert scaler.get_scale() < 2.0**40  # some steps overflowed
    assert guard.findings == []
    assert torch.isfinite(torch.cat([p.detach().flatten() for p in model.parameters()])).all()


def test_doctor_explains_tw113(capsys):
    from trainwise.cli import main

    assert main(["doctor", "--explain", "tw113"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# TW113 nonfinite-gradient")
    assert "trainwise.guard" in out and "## Use instead" in out


@pytest.mark.parametrize("last", [False, True], ids=["first-step", "last-step"])
def test_a_step_given_a_closure_is_judged_on_the_gradients_its_closure_made(last):
    """``step(closure)`` (LBFGS, Lightning's automatic optimization) runs backward inside the step: the gradients
    it applies are read after it, so the step is named right, and a NaN on the last step is not missed."""
    model = Gained(unused=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = _batches(4)
    with trainwise.guard(model, optimizer, action="record") as guard:
        for step, (x, y) in enumerate(batches, start=1):
            if step == (len(batches) if last else 1):
                with torch.no_grad():
                    model.gain.value.zero_()

            def closure(x=x, y=y):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            optimizer.step(closure)
            if step == 1 and not last:
                break  # the NaN gradient was applied at step 1 only
    assert [(f.code, f.step, f.where) for f in guard.findings] == [
        ("TW113", len(batches) if last else 1, "gain.value")]


def test_without_an_optimizer_the_written_out_update_is_checked_at_backward_steps():
    """word_language_model's update, ``p.data.add_(p.grad, alpha=-lr)``: an inf gradient it applies is found at
    the next check (here every step), the step counted by backward passes."""
    model = Gained(unused=False)
    with trainwise.guard(model, checks=["TW113"], check_every=1, action="record") as guard:
        for step, (x, y) in enumerate(_batches(), start=1):
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y) * (float("inf") if step == 3 else 1.0)
            loss.backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
    assert [(f.code, f.step, f.where) for f in guard.findings] == [("TW113", 3, "body.weight")]
    assert "an update applied an inf or NaN gradient at step 3" in guard.findings[0].message
